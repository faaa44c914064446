"""KV-cache block reuse of a TensorRT-LLM target, as Prometheus counters.

The controller asks a TensorRT-LLM target for its per-request figures on every verify call
(``return_perf_metrics``; see :mod:`banditspec.engine.trtllm`) and the
:class:`~banditspec.engine.tensor_codec.TensorEngine` keeps running totals of them. This
exporter turns the totals into counters on Triton's metrics port, so that reuse can be
watched: every step resends the whole sequence, and ``reused / (reused + new)`` near 1 is what
keeps a step's cost proportional to its new tokens.
"""

from __future__ import annotations

import threading

from banditspec.metrics.prometheus import COUNTER, MetricFamilyFactory, MetricSpec, _Registry

KV_REUSED_BLOCKS = MetricSpec(
    "nv_banditspec_target_kv_reused_blocks",
    "Number of KV-cache blocks the TensorRT-LLM target reused from earlier requests (kv_cache_reused_blocks)",
    COUNTER,
)
KV_NEW_BLOCKS = MetricSpec(
    "nv_banditspec_target_kv_new_blocks",
    "Number of KV-cache blocks the TensorRT-LLM target allocated and computed (kv_cache_alloc_new_blocks)",
    COUNTER,
)
VERIFY_CALLS = MetricSpec("nv_banditspec_target_verify_calls", "Number of verify calls sent to the target", COUNTER)
TARGET_KV_SPECS = (KV_REUSED_BLOCKS, KV_NEW_BLOCKS, VERIFY_CALLS)


class TargetKvMetrics:
    """Counters fed from a TensorEngine's running totals (call :meth:`update` after steps)."""

    _TOTALS = (
        (KV_REUSED_BLOCKS, "kv_cache_reused_blocks"),
        (KV_NEW_BLOCKS, "kv_cache_alloc_new_blocks"),
        (VERIFY_CALLS, "verify_calls"),
    )

    def __init__(self, factory: MetricFamilyFactory, engine, *, model: str = "banditspec", version: str = "1"):
        self._engine = engine
        self._registry = _Registry(factory, TARGET_KV_SPECS, model=model, version=version, buckets=[])
        self._lock = threading.Lock()
        self._last = {attr: 0 for _, attr in self._TOTALS}
        for spec, _ in self._TOTALS:  # zero-valued series from the first scrape
            self._registry.metric(spec)

    def update(self) -> None:
        with self._lock:
            for spec, attr in self._TOTALS:
                total = int(getattr(self._engine, attr, 0))
                if total > self._last[attr]:
                    self._registry.metric(spec).increment(total - self._last[attr])
                    self._last[attr] = total

    def close(self) -> None:
        self._registry.close()
