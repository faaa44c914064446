"""Triton adapter for the reference target engine: tensors in, tensors out.

All logic lives in banditspec.engine (tensor_codec + reference); this file converts."""

import faulthandler
import logging
import signal

import numpy as np
import triton_python_backend_utils as pb_utils
from banditspec.engine.contract import REFERENCE_EXTRA_INPUTS, TARGET_INPUTS
from banditspec.engine.prefill_split import ContinuationSplitter
from banditspec.engine.reference import validate_request
from banditspec.engine.target_metrics import VerifyBatchMetrics
from banditspec.engine.tensor_codec import decode_requests, encode_results
from banditspec.engine.verify_pass import PassTimer
from banditspec.errors import BanditSpecValidationError
from banditspec.metrics import TargetEngineMetrics, sample_engine, triton_family_factory
from banditspec.serving.config import TargetModelConfig, model_parameters
from banditspec.serving.heap import freeze_heap

INPUT_NAMES = tuple(TARGET_INPUTS) + tuple(REFERENCE_EXTRA_INPUTS)
log = logging.getLogger("banditspec.target")


class TritonPythonModel:
    def initialize(self, args):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <stub pid>: thread stacks to the server log
        import torch
        from banditspec.engine.reference import ReferenceEngine

        config = TargetModelConfig.from_parameters(model_parameters(args))
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        self.engine = ReferenceEngine.from_name(
            config.target_model,
            max_context=config.max_context,
            cache_entries=config.cache_entries,
            kernels=config.kernels,  # fast (panel, bitwise exact) | onednn | transformers (fp32) | int8 (not exact)
        )
        self.metrics = None  # the prefix KV cache as nv_banditspec_target_* gauges
        if hasattr(pb_utils, "MetricFamily"):
            factory = triton_family_factory(pb_utils)
            self.metrics = TargetEngineMetrics(factory, model=args.get("model_name", "target"), version=args.get("model_version", "1"))
        self.splitter = ContinuationSplitter()
        self.answer_early = config.answer_early
        self.passes = PassTimer()  # each answer says the pass it was verified in (the controller's batch cost)
        # batches > 1 seen from outside: nv_banditspec_target_verified_sequences / _verify_batches
        self.batch_metrics = VerifyBatchMetrics(
            triton_family_factory(pb_utils) if hasattr(pb_utils, "MetricFamily") else None,
            model=args.get("model_name", "target"),
            version=args.get("model_version", "1"),
        )
        if config.gc_freeze:
            freeze_heap()

    def execute(self, requests):
        # A request carries one sequence or several (rows: the controller sends the steps of
        # its concurrent sequences as one request); every row of every request joins one batch.
        responses = [None] * len(requests)
        rows, owner, counts = [], [], [0] * len(requests)
        for i, request in enumerate(requests):
            tensors = {}
            for name in INPUT_NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    tensors[name] = tensor.as_numpy()
            try:
                decoded = decode_requests(tensors)
                for j, row in enumerate(decoded):
                    _validate(row, j if len(decoded) > 1 else None, self.engine)
            except BanditSpecValidationError as exc:
                responses[i] = _error(str(exc), pb_utils.TritonError.INVALID_ARG)
                continue
            rows.extend(decoded)
            owner.extend([i] * len(decoded))
            counts[i] = len(decoded)
        results = [None] * len(rows)
        # Decoding steps share one pass; new sequences (prefills) get their own, so that a
        # prompt does not hold up every decoding step (nor, on padding kernels, pad it).
        passes = self.splitter.passes(rows)
        if not self.answer_early or len(requests) == 1:  # one request: nothing to answer early
            for prefill, group in passes:
                self._verify(rows, group, results, owner, responses, prefill)
            self._answer(responses, results, owner, counts)
            self._sample_metrics()
            return responses
        # Early answers: the smaller pass first (shortest job first: a new sequence whose
        # prompt is cached waits for one small pass, not for the others' decoding step too; a
        # prompt to compute waits for them), and every request answered as soon as its rows
        # are verified, through its response sender (one final response each).
        sent = [False] * len(requests)
        for prefill, group in sorted(passes, key=lambda p: self._pass_size(rows, p)):
            self._verify(rows, group, results, owner, responses, prefill)
            self._answer(responses, results, owner, counts)
            self._send(requests, responses, sent)
        self._send(requests, responses, sent)
        self._sample_metrics()
        return None

    def _pass_size(self, rows, planned):
        """Tokens a pass will feed: a continuation 1 + its draft, a new sequence what the
        prefix cache does not hold of its prompt."""
        prefill, group = planned
        if not prefill:
            return sum(1 + int(np.size(rows[g].draft_ids)) for g in group)
        try:
            return sum(self.engine.fresh_tokens(rows[g]) for g in group)
        except Exception:  # the pass itself will say what is wrong; order it last
            log.exception("sizing a pass failed")
            return float("inf")

    def _answer(self, responses, results, owner, counts):
        """A response for every request whose rows are all verified and that has none yet."""
        for i, count in enumerate(counts):
            if not count or responses[i] is not None:
                continue
            mine = [r for r, o in zip(results, owner) if o == i]
            if any(r is None for r in mine):
                continue
            responses[i] = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(k, v) for k, v in encode_results(mine).items()]
            )

    @staticmethod
    def _send(requests, responses, sent):
        for i, response in enumerate(responses):
            if response is not None and not sent[i]:
                requests[i].get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                sent[i] = True

    def _sample_metrics(self):
        if self.metrics is not None:
            self.metrics.update(sample_engine(self.engine))

    def _verify(self, rows, group, results, owner, responses, prefill):
        """One engine call for ``rows[group]``; a failure answers each owning request with it."""
        batch = [rows[g] for g in group]
        try:
            verified = self.passes.verify(self.engine, batch, prefill=prefill)
        except BanditSpecValidationError as exc:
            for g in group:
                responses[owner[g]] = _error(str(exc), pb_utils.TritonError.INVALID_ARG)
            return
        except Exception as exc:
            log.exception("verification failed")
            for g in group:
                responses[owner[g]] = _error(f"target: verification failed ({type(exc).__name__})", pb_utils.TritonError.INTERNAL)
            return
        self.batch_metrics.record(batch, verified)
        for g, request, result in zip(group, batch, verified):
            self.splitter.observe(request, result)
            results[g] = result

    def finalize(self):
        if self.metrics is not None:
            self.metrics.close()
        self.batch_metrics.close()
        self.engine = None


def _validate(row, index, engine):
    """validate_request; with several rows in the request, the error names the row."""
    try:
        validate_request(row, engine.vocab_size, engine.max_context)
    except BanditSpecValidationError as exc:
        if index is None:
            raise
        raise BanditSpecValidationError(exc.field, f"{str(exc)[len(exc.field) + 2:]} (sequence {index})") from None


def _error(message, code):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
