"""Prometheus metrics through an injected metric-family factory.

In Triton the factory wraps ``pb_utils.MetricFamily`` (the Python backend's custom
metrics API), and the metrics appear on Triton's metrics port next to its own ``nv_``
metrics; tests pass a fake. Names, help strings and labels follow Triton's
conventions: ``nv_`` prefix, counters without a ``_total`` suffix, every series
labelled with ``model`` and ``version``.

A family object must offer ``Metric(labels=dict[str, str])`` (and ``buckets=list`` for
histograms); a metric object ``increment(v)`` (counter), ``set(v)`` (gauge) and
``observe(v)`` (histogram). Metric objects are created on first use per label set and
kept; :meth:`close` drops metrics before their families, as the Python backend requires.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from banditspec.checks import is_int
from banditspec.config import MAX_SPECULATION_LENGTH
from banditspec.errors import BanditSpecValidationError
from banditspec.metrics.stats import EngineCacheSample

COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"
# (name, description, kind) -> a metric family (pb_utils.MetricFamily in Triton)
MetricFamilyFactory = Callable[[str, str, str], Any]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    description: str
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    labels: tuple[str, ...] = ()  # beyond model and version
    buckets: tuple[float, ...] | None = None  # a histogram's own upper bounds (None: the registry's)


REQUESTS = MetricSpec(
    "nv_banditspec_requests",
    "Number of banditspec requests by outcome (success, cancelled, invalid, busy, target_error, internal)",
    COUNTER,
    ("outcome",),
)
ACTIVE_SEQUENCES = MetricSpec("nv_banditspec_active_sequences", "Number of sequences being decoded", GAUGE)
ARM_PULLS = MetricSpec("nv_banditspec_arm_pulls", "Number of decoding steps that chose the arm", COUNTER, ("arm",))
DRAFTED_TOKENS = MetricSpec(
    "nv_banditspec_drafted_tokens", "Number of draft tokens the arm sent for verification", COUNTER, ("arm",)
)
ACCEPTED_TOKENS = MetricSpec(
    "nv_banditspec_accepted_tokens", "Number of draft tokens of the arm that the target accepted", COUNTER, ("arm",)
)
ACCEPTED_LENGTH = MetricSpec(
    "nv_banditspec_accepted_length", "Draft tokens accepted per decoding step, by arm", HISTOGRAM, ("arm",)
)
SPECULATION_LENGTH = MetricSpec(
    "nv_banditspec_speculation_length",
    "Draft tokens sent for verification per decoding step (the speculation length gamma chosen)",
    HISTOGRAM,
)
EMITTED_TOKENS = MetricSpec("nv_banditspec_generated_tokens", "Number of generated tokens sent to clients", COUNTER)
DRAFTER_FAILURES = MetricSpec(
    "nv_banditspec_drafter_failures",
    "Number of requests in which a drafter failed (kind: error = raised, deadline = missed the per-step "
    "deadline) and its arms were dropped",
    COUNTER,
    ("drafter", "kind"),
)
VERIFY_COST = MetricSpec(
    "nv_banditspec_verify_cost_seconds",
    "The costaware controller's cost model: seconds of a decoding round that feeds the target this many "
    "tokens (1 + gamma) at the reference context, calibrated online from measured verify times",
    GAUGE,
    ("tokens",),
)
VERIFY_COST_CONTEXT = MetricSpec(
    "nv_banditspec_verify_cost_context_seconds",
    "The costaware controller's cost model: seconds that one more token of context adds to a round "
    "(term = round: to every round, term = extra_token: per draft token fed)",
    GAUGE,
    ("term",),
)
QUEUED_REQUESTS = MetricSpec(
    "nv_banditspec_queued_requests",
    "Number of requests waiting for a sequence slot (max_concurrent_sequences all decoding)",
    GAUGE,
)
QUEUE_WAIT = MetricSpec(
    "nv_banditspec_queue_wait_seconds",
    "Seconds a request waited for a sequence slot, by how the wait ended (admitted, cancelled, expired)",
    HISTOGRAM,
    ("result",),
    (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0),
)
READY = MetricSpec(
    "nv_banditspec_ready",
    "Whether the model is calibrated and warmed up and serves at speed (1) or not yet (0)",
    GAUGE,
)
SERVING_SPECS = (
    READY,
    QUEUED_REQUESTS,
    QUEUE_WAIT,
    VERIFY_COST,
    VERIFY_COST_CONTEXT,
    REQUESTS,
    ACTIVE_SEQUENCES,
    ARM_PULLS,
    DRAFTED_TOKENS,
    ACCEPTED_TOKENS,
    ACCEPTED_LENGTH,
    SPECULATION_LENGTH,
    EMITTED_TOKENS,
    DRAFTER_FAILURES,
)

KV_CACHED_TOKENS = MetricSpec(
    "nv_banditspec_target_kv_cached_tokens", "Number of tokens whose key/value states the target's prefix cache holds", GAUGE
)
KV_CACHE_ENTRIES = MetricSpec(
    "nv_banditspec_target_kv_cache_entries", "Number of sequences in the target's prefix key/value cache", GAUGE
)
KV_CACHE_CAPACITY = MetricSpec(
    "nv_banditspec_target_kv_cache_capacity_tokens", "Token budget of the target's prefix key/value cache", GAUGE
)
KV_EVICTIONS = MetricSpec(
    "nv_banditspec_target_kv_cache_evictions", "Number of entries evicted from the target's prefix key/value cache", COUNTER
)
FORWARD_PASSES = MetricSpec(
    "nv_banditspec_target_forward_passes", "Number of batched forward passes the target engine ran", COUNTER
)
TARGET_SPECS = (KV_CACHED_TOKENS, KV_CACHE_ENTRIES, KV_CACHE_CAPACITY, KV_EVICTIONS, FORWARD_PASSES)


class _Registry:
    """Families by spec, metrics by (spec, label values); thread-safe."""

    def __init__(self, factory: MetricFamilyFactory, specs: Iterable[MetricSpec], *, model: str, version: str, buckets: list[float]):
        if not model:
            raise BanditSpecValidationError("model", "the model name label must not be empty")
        self._base = {"model": model, "version": str(version)}
        self._buckets = buckets
        self._lock = threading.Lock()
        self._families = {spec.name: factory(spec.name, spec.description, spec.kind) for spec in specs}
        self._metrics: dict[tuple[str, ...], Any] = {}

    def metric(self, spec: MetricSpec, **labels: str) -> Any:
        key = (spec.name, *(labels[name] for name in spec.labels))
        metric = self._metrics.get(key)
        if metric is None:
            with self._lock:
                metric = self._metrics.get(key)
                if metric is None:
                    all_labels = {**self._base, **{name: str(labels[name]) for name in spec.labels}}
                    family = self._families[spec.name]
                    if spec.kind == HISTOGRAM:
                        buckets = spec.buckets if spec.buckets is not None else self._buckets
                        metric = family.Metric(labels=all_labels, buckets=list(buckets))
                    else:
                        metric = family.Metric(labels=all_labels)
                    self._metrics[key] = metric
        return metric

    def close(self) -> None:
        with self._lock:
            self._metrics.clear()  # metrics first: a family must outlive its metrics
            self._families.clear()


class PrometheusMetrics:
    """The banditspec model's metrics (see the module doc); fed by ServingMetrics."""

    def __init__(
        self,
        factory: MetricFamilyFactory,
        *,
        model: str = "banditspec",
        version: str = "1",
        max_draft_len: int = MAX_SPECULATION_LENGTH,
        outcomes: tuple[str, ...] = (),
    ):
        if not is_int(max_draft_len) or max_draft_len < 1:
            raise BanditSpecValidationError("max_draft_len", f"must be an integer >= 1, got {max_draft_len!r}")
        buckets = [float(n) for n in range(max_draft_len + 1)]  # le="0" .. le="L": one bucket per length
        self._registry = _Registry(factory, SERVING_SPECS, model=model, version=version, buckets=buckets)
        self._max_tokens = max_draft_len + 1
        self._lock = threading.Lock()  # one update at a time (each is an IPC call to the server)
        for outcome in outcomes:  # zero-valued series, so that rates work from the first scrape
            self._registry.metric(REQUESTS, outcome=outcome)
        self._registry.metric(ACTIVE_SEQUENCES).set(0)
        self._registry.metric(QUEUED_REQUESTS).set(0)
        self._registry.metric(READY).set(0)

    def record_step(self, arm: str, drafted: int, accepted: int, emitted: int) -> None:
        self.record_steps([(arm, drafted, accepted, emitted)])

    def record_steps(self, steps: Iterable[tuple[str, int, int, int]]) -> None:
        """Steps as (arm, drafted, accepted, emitted): the counters move once per arm (each
        update is an IPC call), the histograms once per step."""
        reg = self._registry
        totals: dict[str, list[int]] = {}  # arm -> [pulls, drafted, accepted]
        emitted_total = 0
        with self._lock:
            for arm, drafted, accepted, emitted in steps:
                total = totals.setdefault(arm, [0, 0, 0])
                total[0] += 1
                total[1] += drafted
                total[2] += accepted
                emitted_total += emitted
                reg.metric(ACCEPTED_LENGTH, arm=arm).observe(accepted)
                reg.metric(SPECULATION_LENGTH).observe(drafted)
            for arm, (pulls, drafted, accepted) in totals.items():
                reg.metric(ARM_PULLS, arm=arm).increment(pulls)
                # A series exists from the arm's first pull (at 0); adding 0 would only cost an IPC call.
                for spec, amount in ((DRAFTED_TOKENS, drafted), (ACCEPTED_TOKENS, accepted)):
                    metric = reg.metric(spec, arm=arm)
                    if amount:
                        metric.increment(amount)
            if emitted_total:
                reg.metric(EMITTED_TOKENS).increment(emitted_total)

    def record_request(self, outcome: str, failures: Mapping[tuple[str, str], int]) -> None:
        with self._lock:
            self._registry.metric(REQUESTS, outcome=outcome).increment(1)
            for (drafter, kind), count in failures.items():
                self._registry.metric(DRAFTER_FAILURES, drafter=drafter, kind=kind).increment(count)

    def set_active(self, sequences: int) -> None:
        with self._lock:
            self._registry.metric(ACTIVE_SEQUENCES).set(sequences)

    def set_queued(self, requests: int) -> None:
        with self._lock:
            self._registry.metric(QUEUED_REQUESTS).set(requests)

    def record_queue_wait(self, seconds: float, result: str) -> None:
        with self._lock:
            self._registry.metric(QUEUE_WAIT, result=result).observe(seconds)

    def set_ready(self, ready: bool) -> None:
        with self._lock:
            self._registry.metric(READY).set(1 if ready else 0)

    def set_cost_curve(self, verify_ms: Sequence[float], context_ms_per_100: Sequence[float] | None = None) -> None:
        """verify_ms[k - 1]: the cost model's milliseconds for a round feeding k tokens;
        context_ms_per_100: (per round, per extra token) milliseconds per 100 context tokens."""
        with self._lock:
            for k, ms in enumerate(verify_ms[: self._max_tokens], start=1):
                self._registry.metric(VERIFY_COST, tokens=str(k)).set(float(ms) / 1e3)
            if context_ms_per_100 is not None:
                for term, ms in zip(("round", "extra_token"), context_ms_per_100):
                    self._registry.metric(VERIFY_COST_CONTEXT, term=term).set(float(ms) / 1e5)

    def close(self) -> None:
        self._registry.close()


class TargetEngineMetrics:
    """The target engine's prefix KV cache as gauges (and its forward passes as a counter)."""

    def __init__(self, factory: MetricFamilyFactory, *, model: str = "target", version: str = "1"):
        self._registry = _Registry(factory, TARGET_SPECS, model=model, version=version, buckets=[])
        self._lock = threading.Lock()
        self._last = EngineCacheSample(0, 0, -1, 0, 0)

    def update(self, sample: EngineCacheSample) -> None:
        reg = self._registry
        with self._lock:
            last, self._last = self._last, sample
            reg.metric(KV_CACHED_TOKENS).set(sample.cached_tokens)
            reg.metric(KV_CACHE_ENTRIES).set(sample.entries)
            reg.metric(KV_CACHE_CAPACITY).set(sample.capacity_tokens)
            if sample.evictions > last.evictions:
                reg.metric(KV_EVICTIONS).increment(sample.evictions - last.evictions)
            if sample.forward_passes > last.forward_passes:
                reg.metric(FORWARD_PASSES).increment(sample.forward_passes - last.forward_passes)

    def close(self) -> None:
        self._registry.close()


def triton_family_factory(pb_utils: Any) -> MetricFamilyFactory:
    """The factory over the Python backend's ``pb_utils.MetricFamily``."""

    def make(name: str, description: str, kind: str) -> Any:
        return pb_utils.MetricFamily(name=name, description=description, kind=getattr(pb_utils.MetricFamily, kind))

    return make
