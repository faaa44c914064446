"""Triton adapter for the BanditSpec controller (decoupled BLS model).

Thin glue: request tensors -> numpy dict -> banditspec.serving.controller.Controller, which runs
the decoding loop and calls `target` through BLS; responses stream back through the
request's response sender. All decisions live in banditspec.serving.controller."""

import contextlib
import faulthandler
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils
from banditspec.errors import EngineError, model_down, parse_retry_after, retry_after_message
from banditspec.metrics import build_serving_metrics, triton_family_factory
from banditspec.serving.config import Parameters, ServingConfig, model_parameters
from banditspec.serving.controller import INPUT_KINDS, stats_json
from banditspec.serving.heap import freeze_heap
from banditspec.serving.request_threads import RequestThreads
from banditspec.serving.setup import build_controller

log = logging.getLogger("banditspec.model")
FINALIZE_REPORT_S = 5.0  # a request thread still running this long after the stop is logged with its stack
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# pb_utils.TritonError exists only once the stub runs (not at auto-complete import time).
ERROR_CODES = {"invalid": "INVALID_ARG", "unavailable": "UNAVAILABLE", "internal": "INTERNAL"}
DEFAULT_RETRY_AFTER_S = 30  # a down target's hint before serve has measured a start-up


def bls_infer(model_name, tensors, output_names):
    """One BLS call; raises EngineError with the target's message (no traceback)."""
    request = pb_utils.InferenceRequest(
        model_name=model_name,
        requested_output_names=list(output_names),
        inputs=[pb_utils.Tensor(name, value) for name, value in tensors.items()],
    )
    response = request.exec()
    if response.has_error():
        raise EngineError(f"{model_name}: {response.error().message()}")
    out = {}
    for name in output_names:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is not None:
            out[name] = tensor.as_numpy()
    return out


PERF_OUTPUTS = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
                "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks")


def extra_outputs(stats):
    """TensorRT-LLM's optional outputs (return_perf_metrics, return_num_*_tokens, indices) from a
    final response's speculation stats: name -> numpy value [1, 1]."""
    timing = stats.get("timing_ns") or {}
    drafted, accepted = sum(stats.get("drafted", [])), sum(stats.get("accepted", []))
    values = {
        "arrival_time_ns": (timing.get("arrival", 0), np.int64),
        "first_scheduled_time_ns": (timing.get("first_scheduled", 0), np.int64),
        "first_token_time_ns": (timing.get("first_token", 0), np.int64),
        "last_token_time_ns": (timing.get("last_token", 0), np.int64),
        "acceptance_rate": (accepted / drafted if drafted else 0.0, np.float32),
        "total_accepted_draft_tokens": (accepted, np.int32),
        "total_draft_tokens": (drafted, np.int32),
        "num_input_tokens": (stats.get("prompt_tokens") or 0, np.int32),
        "num_output_tokens": (stats.get("generated_tokens", 0), np.int32),
        # upstream's clients read these with the perf metrics; the verify contract has no paged
        # KV-cache blocks to count, so they are -1 ("not available"), never a made-up count
        "kv_cache_alloc_new_blocks": (-1, np.int32),
        "kv_cache_reused_blocks": (-1, np.int32),
        "kv_cache_alloc_total_blocks": (-1, np.int32),
    }
    return {name: np.array([[value]], dtype=dtype) for name, (value, dtype) in values.items()}


def wanted_extras(request, inputs):
    """Names of the optional outputs this request asked for (upstream's return_* flags)."""
    def flag(name):
        value = inputs.get(name)
        return value is not None and np.asarray(value).size == 1 and bool(np.asarray(value).reshape(-1)[0])

    wanted = set()
    if flag("return_perf_metrics"):
        wanted.update(PERF_OUTPUTS)
    if flag("return_num_input_tokens"):
        wanted.add("num_input_tokens")
    if flag("return_num_output_tokens"):
        wanted.add("num_output_tokens")
    try:
        requested = set(request.requested_output_names())
    except Exception:
        requested = set()
    return wanted, requested & {"batch_index", "sequence_index"}


class TritonSink:
    """banditspec.serving.controller.ResponseSink over a decoupled response sender."""

    def __init__(self, sender, shutting_down, extras=frozenset(), indices=frozenset(), retry_after_s=DEFAULT_RETRY_AFTER_S):
        self._sender = sender
        self._retry_after_s = retry_after_s  # a down target's hint: about the time a restart takes
        self._shutting_down = shutting_down
        self._extras = extras  # optional outputs on the final response
        self._indices = indices  # batch_index / sequence_index (always 0) on every response
        self.closed = False

    def send(self, text, stats, final):
        # shape [1] as upstream's postprocessing / tensorrt_llm_bls send it (their clients read output[0].decode())
        outputs = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
        outputs.extend(pb_utils.Tensor(name, np.zeros((1, 1), dtype=np.int32)) for name in self._indices)
        if stats is not None:
            outputs.append(pb_utils.Tensor("speculation_stats", np.array([[stats_json(stats)]], dtype=np.object_)))
            if self._extras:
                outputs.extend(pb_utils.Tensor(n, v) for n, v in extra_outputs(stats).items() if n in self._extras)
        self._sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)
        self.closed = final

    def fail(self, kind, message):
        if kind != "invalid" and model_down(message):  # a bad field stays the client's, whatever its words
            kind = "unavailable"
            if parse_retry_after(message) is None:
                message = retry_after_message(message, self._retry_after_s)
        code = getattr(pb_utils.TritonError, ERROR_CODES.get(kind, "INTERNAL"))
        error = pb_utils.TritonError(message, code)
        self._sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        self.closed = True

    def is_cancelled(self):
        return self._shutting_down.is_set() or self._sender.is_cancelled()


class TritonPythonModel:
    def initialize(self, args):
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <stub pid>: thread stacks to the server log
        params = model_parameters(args)
        config = ServingConfig.from_parameters(params)  # read once; errors name the parameter
        # seconds a client is told to wait when the target is down: serve sets its last measured start-up
        self.retry_after_s = Parameters(params).integer("retry_after_s", DEFAULT_RETRY_AFTER_S, low=1)
        self.controller = build_controller(config, bls_infer)
        self.metrics = build_serving_metrics(
            self.controller,
            triton_family_factory(pb_utils) if hasattr(pb_utils, "MetricFamily") else None,
            config,
            model=args.get("model_name", "banditspec"),
            version=args.get("model_version", "1"),
            log_line=pb_utils.Logger.log_info if hasattr(pb_utils, "Logger") else None,
        )
        self.shutting_down = threading.Event()
        # execute() returns at once (decoupled): each request runs on a thread of this pool,
        # decoding or waiting in the admission queue, so the pool holds every slot and every
        # place in the queue, plus a few threads that answer a full queue at once.
        defaults = self.controller.defaults
        workers = defaults.max_concurrent_sequences + defaults.max_queue_size + 4
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="banditspec")
        self.request_threads = RequestThreads()
        # Calibration and warm-up need the target, and Triton 2.51 allows BLS calls only from a
        # request ("BLS is only supported during the 'execute' function", and the server answers
        # none before it is ready): the first request runs them (Controller.prepare) before it
        # decodes, and the nv_banditspec_ready gauge says 0 until they are done. `banditspec
        # serve` sends that first request itself and is not ready before the gauge is 1.
        if config.gc_freeze:
            freeze_heap()

    def execute(self, requests):
        for request in requests:
            inputs = {}
            for name in INPUT_KINDS:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                inputs[name] = None if tensor is None else tensor.as_numpy()
            sink = TritonSink(request.get_response_sender(), self.shutting_down, *wanted_extras(request, inputs),
                              retry_after_s=self.retry_after_s)
            batch = {np.asarray(v).shape[0] for v in inputs.values() if v is not None and np.asarray(v).ndim > 1}
            if any(size != 1 for size in batch):
                sink.fail("invalid", "text_input: send one prompt per request (batch dimension must be 1)")
                continue
            self.pool.submit(self._serve, inputs, sink)
        return None

    def _serve(self, inputs, sink):
        try:
            with self.request_threads.running():
                self.controller.handle(inputs, sink)
        except Exception:  # never let a request thread die silently
            log.exception("request failed")
        finally:
            if not sink.closed:
                with contextlib.suppress(Exception):
                    sink._sender.send(flags=FINAL)

    def finalize(self):
        self.shutting_down.set()
        # Requests see shutting_down at their next step or queue check and end; one that does
        # not within a few seconds is named in the log with where it is, then waited for.
        if not self.request_threads.wait_idle(FINALIZE_REPORT_S):
            log.warning("stopping: %d request thread(s) still running after %.0f s:\n%s",
                        self.request_threads.count(), FINALIZE_REPORT_S, self.request_threads.stacks())
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.metrics.close()
