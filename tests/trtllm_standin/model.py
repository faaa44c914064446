"""Triton glue of the TensorRT-LLM stand-in (test only): pb_utils <-> ``standin.StandIn``.

Installed as a Python-based backend named ``tensorrtllm`` (``<backends>/tensorrtllm/model.py``
next to ``standin.py`` and ``contract.json``, see ``repository.py``), so that the GPU image's
own ``config.pbtxt`` files (``backend: "tensorrtllm"``) are served unchanged. Like the C++
backend it reads the engine folder named by the ``gpt_model_path`` parameter: its
``config.json`` gives the engine's limits, and a ``standin`` entry names the project model
(banditspec.engine.models) whose tokens it returns.

Output checks. The C++ backend writes ``output_ids`` and ``sequence_length`` only when they
are requested (and fails the response when they are not), and, with ``return_perf_metrics``,
every perf-metric output whether requested or not; Triton core refuses an output the model's
config does not declare ("unexpected inference output"). The Python backend drops
unrequested outputs before the core sees them, so the glue applies the core's check itself,
against the config the core parsed (``args["model_config"]``), with the core's message.
"""

import json
import os
import sys
import threading

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from standin import PERF_OUTPUTS, EngineLimits, StandIn, StandInError  # noqa: E402

POPULATING = "Error encountered while populating response: "


def engine_limits(engine_dir: str) -> tuple[EngineLimits, str]:
    """(limits, project model name) from ``<engine_dir>/config.json`` (trtllm-build's layout)."""
    with open(os.path.join(engine_dir, "config.json")) as f:
        config = json.load(f)
    build = config["build_config"]
    limits = EngineLimits(
        max_input_len=int(build["max_input_len"]),
        max_seq_len=int(build["max_seq_len"]),
        max_draft_len=int(build.get("max_draft_len", 0)),
        tokens_per_block=int(build.get("plugin_config", {}).get("tokens_per_block", 64)),
    )
    return limits, config["standin"]["model"]


class TritonPythonModel:
    def initialize(self, args):
        from banditspec.engine.models import load_model
        from banditspec.engine.reference import ReferenceEngine

        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.declared = {o["name"] for o in config.get("output", [])}
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        limits, name = engine_limits(params["gpt_model_path"])
        model, _ = load_model(name)
        self.standin = StandIn(
            ReferenceEngine.from_name(name), model.eval(), limits=limits,
            exclude_input_in_output=params.get("exclude_input_in_output", "false").lower() == "true",
        )
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.threads = []

    def _responses(self, request):
        """(responses, error message): the backend answers a failed request with an INTERNAL error."""
        tensors = {t.name(): t.as_numpy() for t in request.inputs()}
        streaming = bool(tensors.get("streaming") is not None and tensors["streaming"].reshape(-1)[0])
        if streaming and not self.decoupled:
            return [], "Streaming is only supported if model is deployed using decoupled mode."
        try:
            outputs = list(self.standin.respond(tensors))
        except StandInError as exc:
            return [], str(exc)
        wanted = set(request.requested_output_names())
        for required in ("output_ids", "sequence_length"):
            if required not in wanted:
                return [], f"{POPULATING}{required} tensor must be present in list of output tensors"
        responses = []
        for out in outputs:
            for name in PERF_OUTPUTS:  # written whether requested or not: the core checks each
                if name in out and name not in self.declared:
                    return [], f"{POPULATING}unexpected inference output '{name}' for model '{self.name}'"
            names = [n for n in out if n in wanted]
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, out[n]) for n in names]))
        return responses, None

    def execute(self, requests):
        if not self.decoupled:
            answers = []
            for request in requests:
                responses, error = self._responses(request)
                if error is not None:
                    answers.append(pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(error, pb_utils.TritonError.INTERNAL)))
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
            err = pb_utils.TritonError(error, pb_utils.TritonError.INTERNAL)
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=err),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for i, response in enumerate(responses):
            final = i == len(responses) - 1
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
