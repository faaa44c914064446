"""Fan the controller's hooks out to the running totals, Prometheus and the log."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING

from banditspec.metrics.logs import SummaryLogger
from banditspec.metrics.prometheus import PrometheusMetrics
from banditspec.metrics.stats import ServingStats

if TYPE_CHECKING:
    from banditspec.decoding.results import SpeculationStats, StepEvent
    from banditspec.metrics.target_kv import EngineTotalsMetrics
    from banditspec.serving.controller import Controller

log = logging.getLogger("banditspec.metrics")

# In Triton every update of a Prometheus metric is an IPC round trip to the server process
# (python_backend's Metric.increment / observe): a step's 5-8 updates took 0.40-0.46 ms of the
# request's path between two target calls (measured through Triton, SmolLM2 fp32, 2 cores).
# Steps are therefore queued and exported by one thread every EXPORT_INTERVAL_S seconds (the
# counters aggregated per arm), and what a request left queued before its final response.
EXPORT_INTERVAL_S = 0.1


class ServingMetrics:
    """Observer of a :class:`banditspec.serving.controller.Controller` (see :meth:`attach`).

    ``stats`` always runs (in memory, at once); ``exporter`` (Prometheus) and ``summary`` (log
    lines) are optional. ``export_interval_s``: steps reach the exporter (and the target's
    totals) from a background thread this often, and before each final response (``flush``);
    None: at once, in the step's thread.
    """

    def __init__(
        self,
        *,
        stats: ServingStats | None = None,
        exporter: PrometheusMetrics | None = None,
        summary: SummaryLogger | None = None,
        target_kv: EngineTotalsMetrics | None = None,
        export_interval_s: float | None = EXPORT_INTERVAL_S,
    ):
        """target_kv: a banditspec.metrics.target_kv.TargetKvMetrics (TensorRT-LLM target), or None."""
        if export_interval_s is not None and not export_interval_s > 0:
            raise ValueError(f"export_interval_s must be > 0 or None, got {export_interval_s!r}")
        self.stats = stats or ServingStats()
        self.exporter = exporter
        self.summary = summary
        self.target_kv = target_kv
        self._pending: deque[tuple[str, int, int, int]] = deque()  # (arm, drafted, accepted, emitted)
        self._export_lock = threading.Lock()  # one export at a time: a flush returns once its steps are out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if export_interval_s is not None and self._exporting:
            self._thread = threading.Thread(target=self._export_loop, args=(export_interval_s,),
                                            name="banditspec-metrics", daemon=True)
            self._thread.start()

    @property
    def _exporting(self) -> bool:
        """Steps go somewhere beyond the in-memory totals (Prometheus, the target's totals)."""
        return self.exporter is not None or self.target_kv is not None

    def attach(self, controller: Controller) -> ServingMetrics:
        """Install this observer's methods as ``controller``'s hooks."""
        controller.on_step = self.on_step
        controller.on_active = self.on_active
        controller.on_queue = self.on_queue
        controller.on_queue_wait = self.on_queue_wait
        controller.on_ready = self.on_ready
        if getattr(controller, "ready", None) is not None and controller.ready.is_set():
            self.on_ready()
        controller.on_request_done = self.on_request_done
        controller.on_final_response = self.flush
        return self

    def on_step(self, event: StepEvent) -> None:
        """event: a banditspec.decoding.results.StepEvent."""
        emitted = len(event.new_token_ids)
        self.stats.record_step(event.arm, event.drafted, event.accepted, emitted)
        if not self._exporting:
            return
        self._pending.append((event.arm, event.drafted, event.accepted, emitted))
        if self._thread is None:
            self.flush()

    def flush(self) -> None:
        """Export every step queued so far (and the target's totals); returns once they are out."""
        with self._export_lock:
            steps = []
            while self._pending:
                steps.append(self._pending.popleft())
            if steps and self.exporter is not None:
                self.exporter.record_steps(steps)
            if steps and self.target_kv is not None:
                self.target_kv.update()

    def _export_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.flush()
            except Exception:  # the server going away, say: the next flush tries again
                log.exception("exporting metrics failed")

    def on_active(self, sequences: int) -> None:
        self.stats.set_active(sequences)
        if self.exporter is not None:
            self.exporter.set_active(sequences)

    def on_queue(self, requests: int) -> None:
        if self.exporter is not None:
            self.exporter.set_queued(requests)

    def on_queue_wait(self, seconds: float, result: str) -> None:
        if self.exporter is not None:
            self.exporter.record_queue_wait(seconds, result)

    def on_ready(self) -> None:
        if self.exporter is not None:
            self.exporter.set_ready(True)

    def on_request_done(self, outcome: str, speculation_stats: SpeculationStats | None = None) -> None:
        """speculation_stats: the request's banditspec.decoding.results.SpeculationStats, or None."""
        dropped = speculation_stats.dropped_arms if speculation_stats is not None else {}
        failures = self.stats.record_request(outcome, dropped)
        self.flush()  # a request's steps are out before its outcome is counted (nothing queued: a no-op)
        if self.exporter is not None:
            self.exporter.record_request(outcome, failures)
            controller = getattr(speculation_stats, "controller", None)
            if controller and "cost_model" in controller:
                model = controller["cost_model"]
                self.exporter.set_cost_curve(model["verify_ms"], model.get("context_ms_per_100"))
        if self.summary is not None:
            self.summary.maybe_log()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        try:
            self.flush()
        finally:
            if self.target_kv is not None:
                self.target_kv.close()
                self.target_kv = None
            if self.exporter is not None:
                self.exporter.close()
                self.exporter = None
