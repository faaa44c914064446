"""Running totals the target's client keeps, as Prometheus counters: KV-cache block reuse
of a TensorRT-LLM target, and how the controller gathers steps for the reference target.

The controller asks a TensorRT-LLM target for its per-request figures on every verify call
(``return_perf_metrics``; see :mod:`banditspec.engine.trtllm`) and the
:class:`~banditspec.engine.tensor_codec.TensorEngine` keeps running totals of them. This
exporter turns the totals into counters on Triton's metrics port, so that reuse can be
watched: every step resends the whole sequence, and ``reused / (reused + new)`` near 1 is what
keeps a step's cost proportional to its new tokens. With the reference target the controller
sends its concurrent sequences' steps as one request (:mod:`banditspec.engine.gather`):
``sequences / requests`` is how many steps a request carried.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

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
GATHERED_REQUESTS = MetricSpec(
    "nv_banditspec_target_gathered_requests",
    "Number of verify requests the controller sent to the reference target through its gatherer",
    COUNTER,
)
GATHERED_SEQUENCES = MetricSpec(
    "nv_banditspec_target_gathered_sequences",
    "Number of sequence steps those requests carried (one request holds concurrent sequences' steps)",
    COUNTER,
)
GATHER_SPECS = (GATHERED_REQUESTS, GATHERED_SEQUENCES)


class EngineTotalsMetrics:
    """Counters fed from an engine's running totals, ``(spec, attribute)`` pairs (call
    :meth:`update` after steps)."""

    def __init__(self, factory: MetricFamilyFactory, engine: object, totals: Iterable[tuple[MetricSpec, str]], *, model: str = "banditspec", version: str = "1"):
        self._engine = engine
        self._totals = tuple(totals)
        self._registry = _Registry(factory, tuple(spec for spec, _ in self._totals), model=model, version=version, buckets=[])
        self._lock = threading.Lock()
        self._last = {attr: 0 for _, attr in self._totals}
        for spec, _ in self._totals:  # zero-valued series from the first scrape
            self._registry.metric(spec)

    def update(self) -> None:
        with self._lock:
            for spec, attr in self._totals:
                total = int(getattr(self._engine, attr, 0))
                if total > self._last[attr]:
                    self._registry.metric(spec).increment(total - self._last[attr])
                    self._last[attr] = total

    def close(self) -> None:
        self._registry.close()


def TargetKvMetrics(factory: MetricFamilyFactory, engine: object, *, model: str = "banditspec", version: str = "1") -> EngineTotalsMetrics:
    """A TensorRT-LLM target's KV-cache figures (a TensorEngine's totals)."""
    totals = ((KV_REUSED_BLOCKS, "kv_cache_reused_blocks"), (KV_NEW_BLOCKS, "kv_cache_alloc_new_blocks"), (VERIFY_CALLS, "verify_calls"))
    return EngineTotalsMetrics(factory, engine, totals, model=model, version=version)


def GatherMetrics(factory: MetricFamilyFactory, gatherer: object, *, model: str = "banditspec", version: str = "1") -> EngineTotalsMetrics:
    """A VerifyGatherer's requests and the sequence steps they carried."""
    totals = ((GATHERED_REQUESTS, "calls"), (GATHERED_SEQUENCES, "rows"))
    return EngineTotalsMetrics(factory, gatherer, totals, model=model, version=version)
