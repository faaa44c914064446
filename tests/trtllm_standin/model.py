"""Triton glue of the TensorRT-LLM stand-in (test only): pb_utils <-> ``standin.StandIn``.

Copied into ``<repository>/<name>/1/`` next to ``standin.py`` and ``contract.json`` by
``tests/trtllm_standin/repository.py``. Parameters: ``target_model`` (a model name of
banditspec.engine.models, e.g. ``tiny``), ``tokens_per_block``, ``max_draft_len``,
``exclude_input_in_output``.
"""

import json
import os
import sys
import threading

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from standin import StandIn, StandInError  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        from banditspec.engine.models import load_model
        from banditspec.engine.reference import ReferenceEngine

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        name = params.get("target_model") or "tiny"
        model, _ = load_model(name)
        self.standin = StandIn(
            ReferenceEngine.from_name(name),
            model.eval(),
            tokens_per_block=int(params.get("tokens_per_block", "32")),
            max_draft_len=int(params.get("max_draft_len", "16")),
            exclude_input_in_output=params.get("exclude_input_in_output", "true").lower() == "true",
        )
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.threads = []

    def _tensors(self, request):
        return {t.name(): t.as_numpy() for t in request.inputs()}

    def _responses(self, request):
        """(responses, error): the real backend answers a bad request with an error response."""
        tensors = self._tensors(request)
        streaming = bool(tensors.get("streaming") is not None and tensors["streaming"].reshape(-1)[0])
        if streaming and not self.decoupled:
            return [], "streaming: only supported if the model is deployed in decoupled mode"
        try:
            outputs = list(self.standin.respond(tensors))
        except StandInError as exc:
            return [], str(exc)
        wanted = set(request.requested_output_names())
        responses = []
        for out in outputs:
            names = [n for n in out if not wanted or n in wanted]
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, out[n]) for n in names]))
        return responses, None

    def execute(self, requests):
        if not self.decoupled:
            answers = []
            for request in requests:
                responses, error = self._responses(request)
                if error is not None:
                    answers.append(pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)))
                else:
                    answers.append(responses[0])
            return answers
        for request in requests:
            thread = threading.Thread(target=self._stream, args=(request,), daemon=True)
            thread.start()
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        return None

    def _stream(self, request):
        sender = request.get_response_sender()
        try:
            responses, error = self._responses(request)
        except Exception as exc:  # never leave a decoupled request without its final flag
            responses, error = [], f"stand-in failed: {type(exc).__name__}"
        if error is not None:
            err = pb_utils.TritonError(error, pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=err),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i, response in enumerate(responses):
            final = i == len(responses) - 1
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
