"""Closed-loop load for the concurrency sweep: N streams, each sending its next request
as soon as the previous one finishes, for a fixed time; and the server-side token
counter that measures what was generated in a window.

Throughput is read from the target's ``nv_banditspec_target_output_tokens`` counter on
the metrics port (every token the target produced, whichever request it belonged to), so
a measurement window needs no request to start or end inside it. Latency is the wall
time of the requests that completed during the run.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.triton_client import GenerationOptions

OUTPUT_TOKENS = "nv_banditspec_target_output_tokens"
VERIFIED_SEQUENCES = "nv_banditspec_target_verified_sequences"
VERIFY_BATCHES = "nv_banditspec_target_verify_batches"
REQUESTS = "nv_banditspec_requests"  # by model and outcome: one count per finished request
EVICTIONS = "nv_banditspec_target_kv_cache_evictions"


@dataclass
class RequestRecord:
    """One completed request: when it ran and what it produced."""

    started: float
    seconds: float
    generated_tokens: int
    drafted: list[int]  # draft length per step
    full: bool  # False for a stream's first, shortened request


@dataclass
class LoadResult:
    """One closed-loop run at one concurrency."""

    concurrency: int
    window_seconds: float
    window_tokens: float  # target output tokens during the measurement window
    requests: list[RequestRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0  # requests sent
    batches: float = 0.0  # target verify batches during the window
    sequences: float = 0.0  # sequences those batches held
    evictions: float = 0.0  # prefix-cache evictions in the target during the window

    @property
    def tokens_per_second(self) -> float:
        return self.window_tokens / self.window_seconds if self.window_seconds > 0 else 0.0

    @property
    def mean_batch(self) -> float:
        return self.sequences / self.batches if self.batches else 0.0

    def latency(self) -> dict:
        """Wall time of full-length requests (mean, p50, p90) and seconds per generated
        token over every completed request (the shortened first ones included)."""
        out: dict = {"requests": 0}
        if self.requests:
            per_token = [r.seconds / max(r.generated_tokens, 1) for r in self.requests]
            out["all_requests"] = len(self.requests)
            out["mean_s_per_token"] = round(float(np.mean(per_token)), 4)
        seconds = np.array([r.seconds for r in self.requests if r.full])
        if seconds.size:
            out.update(
                requests=int(seconds.size),
                mean_s=round(float(seconds.mean()), 3),
                p50_s=round(float(np.percentile(seconds, 50)), 3),
                p90_s=round(float(np.percentile(seconds, 90)), 3),
            )
        return out

    def mean_drafted(self) -> float:
        drafted = [d for r in self.requests for d in r.drafted]
        return float(np.mean(drafted)) if drafted else 0.0


def _stream_worker(
    url: str,
    model_name: str,
    prompts: Sequence[str],
    first: int,
    stride: int,
    opts: GenerationOptions,
    stop_at: float,
    out: LoadResult,
    lock: threading.Lock,
) -> None:
    """Send prompts[first], prompts[first + stride], ... one after another until ``stop_at``;
    the request in flight then is cancelled (the whole gRPC stream is stopped). The first
    request asks for (first + 1) / stride of ``max_tokens``, so that the streams do not
    all prefill and finish at the same moments."""
    import dataclasses

    import tritonclient.grpc as grpcclient

    from banditspec_client.triton_client import _grpc_inputs

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    index = first
    request_opts = dataclasses.replace(opts, max_tokens=max(1, opts.max_tokens * (first + 1) // stride))
    try:
        while time.monotonic() < stop_at:
            started, full = time.monotonic(), request_opts is opts
            client.async_stream_infer(model_name, _grpc_inputs(prompts[index % len(prompts)], request_opts))
            with lock:
                out.sent += 1
            index += stride
            request_opts = opts
            while True:
                remaining = stop_at - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    result, error = answers.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    continue
                if error is not None:
                    with lock:
                        out.errors.append(str(error)[:200])
                    break
                raw = result.as_numpy("speculation_stats")
                if raw is None:
                    continue  # a streamed piece; the final response carries the stats
                stats = json.loads(np.asarray(raw).reshape(-1)[0])
                record = RequestRecord(
                    started, time.monotonic() - started, int(stats["generated_tokens"]), list(stats["drafted"]), full
                )
                with lock:
                    out.requests.append(record)
                break
    finally:
        try:
            client.stop_stream(cancel_requests=True)
        finally:
            client.close()


def finished_requests(metrics_port: int, model_name: str) -> float:
    """Requests ``model_name`` has finished so far (any outcome)."""
    return metric_total(scrape_metrics(metrics_port), REQUESTS, model=model_name)


def wait_idle(metrics_port: int, model_name: str, expected: float, timeout: float = 300.0) -> bool:
    """Until ``model_name`` has finished ``expected`` requests in all (any outcome: a cancelled
    request counts once the server has noticed and stopped it); False after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if finished_requests(metrics_port, model_name) >= expected:
                return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def run_closed_loop(
    *,
    grpc_url: str,
    metrics_port: int,
    model_name: str,
    prompts: Sequence[str],
    concurrency: int,
    opts: GenerationOptions,
    warmup_s: float,
    measure_s: float,
) -> LoadResult:
    """``concurrency`` closed-loop streams for ``warmup_s + measure_s`` seconds; throughput
    over the last ``measure_s`` seconds."""
    result = LoadResult(concurrency, 0.0, 0.0)
    lock = threading.Lock()
    finished_before = finished_requests(metrics_port, model_name)
    begin = time.monotonic()
    stop_at = begin + warmup_s + measure_s
    threads = [
        threading.Thread(
            target=_stream_worker,
            args=(grpc_url, model_name, prompts, i, concurrency, opts, stop_at, result, lock),
            daemon=True,
        )
        for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, begin + warmup_s - time.monotonic()))
    t0, before = time.monotonic(), scrape_metrics(metrics_port)
    time.sleep(max(0.0, stop_at - time.monotonic()))
    t1, after = time.monotonic(), scrape_metrics(metrics_port)

    def delta(name: str) -> float:
        return metric_total(after, name) - metric_total(before, name)

    result.batches, result.sequences = delta(VERIFY_BATCHES), delta(VERIFIED_SEQUENCES)
    result.evictions = delta(EVICTIONS)
    result.window_seconds, result.window_tokens = t1 - t0, delta(OUTPUT_TOKENS)
    for thread in threads:
        thread.join(timeout=30)
    if not wait_idle(metrics_port, model_name, finished_before + result.sent):
        result.errors.append("the server had not finished every request 300 s after the run")
    return result
