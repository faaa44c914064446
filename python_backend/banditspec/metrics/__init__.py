"""Observability: running totals (:mod:`.stats`, pure), a periodic log line
(:mod:`.logs`), Prometheus metrics through an injected metric-family factory
(:mod:`.prometheus`), and the observer that feeds them from the controller (:mod:`.hub`).

``build_serving_metrics`` is what the Triton ``banditspec`` model calls; its
``config.pbtxt`` parameters (read by :class:`~banditspec.serving.config.ServingConfig`):
``metrics`` ("true"/"false") and ``metrics_log_interval_s`` (seconds between summary log
lines; "0" = none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from banditspec.engine.gather import VerifyGatherer
from banditspec.metrics.hub import ServingMetrics
from banditspec.metrics.logs import SummaryLogger, format_summary
from banditspec.metrics.prometheus import (
    MetricFamilyFactory,
    PrometheusMetrics,
    TargetEngineMetrics,
    triton_family_factory,
)
from banditspec.metrics.stats import ServingStats, StatsSnapshot, sample_engine
from banditspec.serving.config import ParameterSource, ServingConfig
from banditspec.serving.outcomes import OUTCOMES

if TYPE_CHECKING:
    from banditspec.metrics.target_kv import EngineTotalsMetrics
    from banditspec.serving.controller import Controller

__all__ = [
    "MetricFamilyFactory",
    "PrometheusMetrics",
    "ServingMetrics",
    "ServingStats",
    "StatsSnapshot",
    "SummaryLogger",
    "TargetEngineMetrics",
    "build_serving_metrics",
    "format_summary",
    "sample_engine",
    "triton_family_factory",
]


def build_serving_metrics(
    controller: Controller,
    factory: MetricFamilyFactory | None,
    params: ParameterSource,
    *,
    model: str = "banditspec",
    version: str = "1",
    log_line: Callable[[str], None] | None = None,
) -> ServingMetrics:
    """A ServingMetrics attached to ``controller``: Prometheus through ``factory`` unless the
    ``metrics`` parameter is false (or ``factory`` is None), a summary through ``log_line``
    (default: the ``banditspec.metrics`` logger) every ``metrics_log_interval_s`` seconds
    unless that is 0."""
    config = ServingConfig.of(params)
    enabled, interval = config.metrics, config.metrics_log_interval_s
    stats = ServingStats()
    exporter = None
    if enabled and factory is not None:
        exporter = PrometheusMetrics(
            factory,
            model=model,
            version=version,
            max_draft_len=controller.decoder.limits.max_draft_len,
            outcomes=OUTCOMES,
        )
    summary = SummaryLogger(stats, interval_s=interval, emit=log_line) if interval > 0 else None
    target_kv: EngineTotalsMetrics | None = None
    engine = getattr(controller, "engine", None)
    if exporter is not None and factory is not None and getattr(engine, "tensorrtllm", False):  # KV-reuse figures come back
        from banditspec.metrics.target_kv import TargetKvMetrics

        target_kv = TargetKvMetrics(factory, engine, model=model, version=version)
    elif exporter is not None and factory is not None and isinstance(engine, VerifyGatherer):  # steps gathered into requests
        from banditspec.metrics.target_kv import GatherMetrics

        target_kv = GatherMetrics(factory, engine, model=model, version=version)
    return ServingMetrics(stats=stats, exporter=exporter, summary=summary, target_kv=target_kv).attach(controller)
