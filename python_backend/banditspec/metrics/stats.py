"""Running totals of what the server did (pure: no Triton, no I/O).

:class:`ServingStats` is fed by the controller's hooks (one call per decoding step,
per request end, per change of the number of sequences in flight) and hands out an
immutable :class:`StatsSnapshot` for logs, tests and the soak report. The helpers
below turn a request's ``dropped_arms`` into drafter-failure counts; the Prometheus
adapter uses the same helpers, so both views always agree.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from banditspec.config import arm_drafter

FAILURE_DEADLINE = "deadline"  # the drafter did not answer within the per-step deadline
FAILURE_ERROR = "error"  # the drafter raised (in start, propose or observe)
FAILURE_KINDS = (FAILURE_DEADLINE, FAILURE_ERROR)


def failure_kind(reason: str) -> str:
    """Classify a reason of :attr:`SpeculationStats.dropped_arms` (``"deadline exceeded"``,
    ``"propose failed: RuntimeError"``, ...)."""
    return FAILURE_DEADLINE if "deadline" in reason else FAILURE_ERROR


def drafter_failures(dropped_arms: Mapping[str, str]) -> dict[tuple[str, str], int]:
    """One failure per failed drafter of a request: ``{(drafter, kind): 1}``.

    A drafter serving several arms (``pld@2``, ``pld@4``) fails once, not once per arm;
    an arm dropped as ``"unavailable"`` (its drafter had already failed to start) adds
    nothing of its own."""
    failed: dict[str, str] = {}
    for arm, reason in dropped_arms.items():
        drafter = arm_drafter(arm)
        if reason == "unavailable" and drafter not in failed:
            failed[drafter] = FAILURE_ERROR
        elif reason != "unavailable":
            failed[drafter] = failure_kind(reason)
    return {(drafter, kind): 1 for drafter, kind in failed.items()}


@dataclass
class ArmCounts:
    """Totals for one arm (``"pld@4"``, ``"vanilla"``)."""

    pulls: int = 0  # steps that chose the arm
    drafted: int = 0  # draft tokens sent for verification
    accepted: int = 0  # draft tokens the target accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent copy of :class:`ServingStats` at one moment."""

    requests: dict[str, int]  # outcome -> requests (outcomes of banditspec.serving.outcomes.OUTCOMES)
    active_sequences: int
    steps: int
    emitted_tokens: int  # tokens streamed to clients
    arms: dict[str, ArmCounts]
    accepted_length: dict[int, int]  # accepted draft tokens in a step -> steps
    speculation_length: dict[int, int]  # draft tokens verified in a step (gamma) -> steps
    drafter_failures: dict[tuple[str, str], int]  # (drafter, kind) -> requests

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def mean_accepted_tokens(self) -> float:
        """Accepted draft tokens + 1 per step, averaged over all steps (the MAT)."""
        if not self.steps:
            return 0.0
        return (sum(a.accepted for a in self.arms.values()) + self.steps) / self.steps


class ServingStats:
    """Thread-safe running totals; every ``record_*`` is O(1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._active = 0
        self._steps = 0
        self._emitted = 0
        self._arms: dict[str, ArmCounts] = {}
        self._accepted_length: Counter[int] = Counter()
        self._speculation_length: Counter[int] = Counter()
        self._failures: Counter[tuple[str, str]] = Counter()

    def record_step(self, arm: str, drafted: int, accepted: int, emitted: int) -> None:
        """One decoding step: ``arm`` drafted ``drafted`` tokens, ``accepted`` of them
        were accepted, ``emitted`` tokens became safe to stream."""
        with self._lock:
            counts = self._arms.get(arm)
            if counts is None:
                counts = self._arms[arm] = ArmCounts()
            counts.pulls += 1
            counts.drafted += drafted
            counts.accepted += accepted
            self._steps += 1
            self._emitted += emitted
            self._accepted_length[accepted] += 1
            self._speculation_length[drafted] += 1

    def record_request(self, outcome: str, dropped_arms: Mapping[str, str] | None = None) -> dict[tuple[str, str], int]:
        """A request ended with ``outcome``; returns the drafter failures it added."""
        failures = drafter_failures(dropped_arms or {})
        with self._lock:
            self._requests[outcome] += 1
            self._failures.update(failures)
        return failures

    def set_active(self, sequences: int) -> None:
        with self._lock:
            self._active = sequences

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(
                requests=dict(self._requests),
                active_sequences=self._active,
                steps=self._steps,
                emitted_tokens=self._emitted,
                arms={name: ArmCounts(c.pulls, c.drafted, c.accepted) for name, c in self._arms.items()},
                accepted_length=dict(self._accepted_length),
                speculation_length=dict(self._speculation_length),
                drafter_failures=dict(self._failures),
            )


@dataclass(frozen=True)
class EngineCacheSample:
    """What a target engine's prefix KV cache holds right now (see ReferenceEngine)."""

    cached_tokens: int  # tokens whose K/V the cache holds
    entries: int  # cached sequences
    capacity_tokens: int  # the cache's token budget (its bound); -1 = unknown
    evictions: int  # entries evicted since start
    forward_passes: int  # batched forward passes since start (a verify call runs one or more)


def sample_engine(engine: object) -> EngineCacheSample:
    """Read the cache counters of a ReferenceEngine-like object (absent ones read 0 / -1)."""
    cache = getattr(engine, "cache", None)
    cached = engine.cached_tokens() if hasattr(engine, "cached_tokens") else 0
    return EngineCacheSample(
        cached_tokens=int(cached),
        entries=len(cache) if cache is not None else 0,
        capacity_tokens=int(getattr(cache, "max_tokens", -1)),
        evictions=int(getattr(cache, "evictions", 0)),
        forward_passes=int(getattr(engine, "forward_passes", 0)),
    )
