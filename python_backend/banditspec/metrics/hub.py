"""Fan the controller's hooks out to the running totals, Prometheus and the log."""

from __future__ import annotations

from banditspec.metrics.logs import SummaryLogger
from banditspec.metrics.prometheus import PrometheusMetrics
from banditspec.metrics.stats import ServingStats


class ServingMetrics:
    """Observer of a :class:`banditspec.serving.Controller` (see :meth:`attach`).

    ``stats`` always runs; ``exporter`` (Prometheus) and ``summary`` (log lines) are optional.
    """

    def __init__(
        self,
        *,
        stats: ServingStats | None = None,
        exporter: PrometheusMetrics | None = None,
        summary: SummaryLogger | None = None,
        target_kv=None,
    ):
        """target_kv: a banditspec.metrics.target_kv.TargetKvMetrics (TensorRT-LLM target), or None."""
        self.stats = stats or ServingStats()
        self.exporter = exporter
        self.summary = summary
        self.target_kv = target_kv

    def attach(self, controller) -> "ServingMetrics":
        """Install this observer's methods as ``controller``'s hooks."""
        controller.on_step = self.on_step
        controller.on_active = self.on_active
        controller.on_request_done = self.on_request_done
        return self

    def on_step(self, event) -> None:
        """event: a banditspec.results.StepEvent."""
        emitted = len(event.new_token_ids)
        self.stats.record_step(event.arm, event.drafted, event.accepted, emitted)
        if self.exporter is not None:
            self.exporter.record_step(event.arm, event.drafted, event.accepted, emitted)
        if self.target_kv is not None:
            self.target_kv.update()

    def on_active(self, sequences: int) -> None:
        self.stats.set_active(sequences)
        if self.exporter is not None:
            self.exporter.set_active(sequences)

    def on_request_done(self, outcome: str, speculation_stats=None) -> None:
        """speculation_stats: the request's banditspec.results.SpeculationStats, or None."""
        dropped = speculation_stats.dropped_arms if speculation_stats is not None else {}
        failures = self.stats.record_request(outcome, dropped)
        if self.exporter is not None:
            self.exporter.record_request(outcome, failures)
            controller = getattr(speculation_stats, "controller", None)
            if controller and "cost_model" in controller:
                model = controller["cost_model"]
                self.exporter.set_cost_curve(model["verify_ms"], model.get("context_ms_per_100"))
        if self.summary is not None:
            self.summary.maybe_log()

    def close(self) -> None:
        if self.target_kv is not None:
            self.target_kv.close()
            self.target_kv = None
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
