"""A server-wide speculation-length controller that learns from measured throughput
(the paper's §6.2 experiment, in a live server).

It implements :class:`banditspec.gamma_controller.budget.SpeculationBudget`: every sequence asks
:meth:`ThroughputGammaController.gamma_cap` before drafting and reports each finished
step to :meth:`~ThroughputGammaController.record_step`, from many request threads.

Time is cut into *rounds*. A round plays one gamma for every sequence in flight:

1. settle: the first ``n`` steps taken under the new gamma (``n`` = active sequences at
   the round's start) are not measured, so that steps started under the previous gamma
   have drained out of the batch;
2. measure: the next steps (at least ``steps_per_sequence * n`` and ``min_round_steps``
   steps, a multiple of ``n``, over at least ``min_round_seconds``). The round's reward is
   the generated tokens/s across all sequences: the mean number of active sequences times
   each one's rate, tokens over step time summed over the measured steps. A step that took
   more than ``stall_factor`` times the round's median step is left out: it waited for
   something that does not depend on gamma (a new request's prefill pass), and a few of
   those would swamp the difference between two gammas;
3. the reward goes to the learner of the round's load context (the number of active
   sequences, bucketed 1, 2, 4, ... ``max_bucket``+), one
   :class:`~banditspec.gamma_controller.gamma_bandit.DiscountedGammaUCB` per context, and the
   next round's gamma is that context's choice for the current load.

A round is dropped, unrewarded, when the server idles (no call for ``max_gap_seconds``),
when the load moves two contexts away (4x) while it runs, or when the mean load over the
round falls in another context than the one it began in: its tokens/s would describe a
mix of loads. A context seen for the first time borrows its nearest neighbour's
estimates (see :class:`~banditspec.gamma_controller.gamma_bandit.DiscountedGammaUCB`).

A step is attributed to the round whose gamma it was given: ``gamma_cap`` tags the
calling thread (each request runs on its own thread, and asks and reports on it), and a
report carrying an older round's tag is ignored.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from banditspec.gamma_controller.config import GammaControllerConfig
from banditspec.gamma_controller.gamma_bandit import DiscountedGammaUCB


@dataclass(frozen=True)
class RoundRecord:
    """One measured round.

    steps / tokens / step_seconds: the measured steps kept (stalled ones left out), the
    tokens they produced and the sum of their durations; wall_seconds: the measuring time.
    """

    gamma: int
    bucket: int
    mean_active: float
    steps: int
    stalled: int
    tokens: int
    step_seconds: float
    wall_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """The reward: mean_active sequences, each producing tokens / step_seconds."""
        return self.mean_active * self.tokens / self.step_seconds if self.step_seconds > 0 else 0.0


@dataclass
class _Round:
    ident: int
    gamma: int
    bucket: int
    sequences: int  # active sequences when the round began
    last_event: float
    steps: int = 0
    measure_from: float | None = None
    measured: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per step
    active_sum: float = 0.0
    active_samples: int = 0

    def target_steps(self, config: GammaControllerConfig) -> int:
        """Measured steps that end the round: a multiple of the batch of sequences."""
        need = max(config.min_round_steps, config.steps_per_sequence * self.sequences)
        return -(-need // self.sequences) * self.sequences


class ThroughputGammaController:
    """See the module docstring. Thread-safe.

    active_sequences: callable giving the number of sequences in flight (the server's
    exact count); None = estimated as the threads that asked for a cap recently.
    clock: monotonic seconds (injectable for tests).
    """

    HISTORY = 2000

    def __init__(
        self,
        config: GammaControllerConfig = GammaControllerConfig(),
        *,
        active_sequences: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self._active_fn = active_sequences
        self._clock = clock
        self._lock = threading.Lock()
        self._local = threading.local()
        self._learners: dict[int, DiscountedGammaUCB] = {}
        self._round: _Round | None = None
        self._next_ident = 0
        self._seen_threads: dict[int, float] = {}
        self.history: deque[RoundRecord] = deque(maxlen=self.HISTORY)
        self.dropped_rounds = 0

    def bind_active_sequences(self, active_sequences: Callable[[], int]) -> None:
        """Use the server's count of sequences in flight from now on."""
        with self._lock:
            self._active_fn = active_sequences

    # -- SpeculationBudget ---------------------------------------------------------
    def gamma_cap(self) -> int:
        with self._lock:
            now = self._clock()
            active = self._active(now)
            current = self._round
            if current is None or self._stale(current, now, active):
                if current is not None:
                    self.dropped_rounds += 1
                current = self._start_round(now, active)
            current.last_event = now
            current.active_sum += active
            current.active_samples += 1
            self._local.round = current.ident
            return current.gamma

    def record_step(self, gamma: int, tokens: int, seconds: float) -> None:
        with self._lock:
            current = self._round
            if current is None or getattr(self._local, "round", None) != current.ident:
                return  # a step of an earlier round
            now = self._clock()
            current.last_event = now
            current.steps += 1
            if current.measure_from is None:
                if current.steps >= current.sequences:
                    current.measure_from = now
                return
            current.measured.append((int(tokens), max(float(seconds), 0.0)))
            elapsed = now - current.measure_from
            if len(current.measured) >= current.target_steps(self.config) and elapsed >= self.config.min_round_seconds:
                self._finish_round(current, now, elapsed)

    # -- inspection ----------------------------------------------------------------
    def current_gamma(self) -> int | None:
        with self._lock:
            return self._round.gamma if self._round is not None else None

    def snapshot(self) -> dict:
        """Per context: rewards seen, estimated tokens/s per gamma, the best gamma."""
        with self._lock:
            contexts = {}
            for bucket, learner in sorted(self._learners.items()):
                means = learner.relative_means() * learner.scale
                contexts[self.config.bucket_label(bucket)] = {
                    "rewards": learner.updates,
                    "tokens_per_second": [None if np.isnan(m) else round(float(m), 3) for m in means],
                    "best_gamma": learner.best_gamma(),
                }
            return {
                "current_gamma": self._round.gamma if self._round is not None else None,
                "rounds": len(self.history),
                "dropped_rounds": self.dropped_rounds,
                "contexts": contexts,
            }

    # -- internals (lock held) -----------------------------------------------------
    def _active(self, now: float) -> int:
        if self._active_fn is not None:
            return max(1, int(self._active_fn()))
        window = self.config.max_gap_seconds
        self._seen_threads[threading.get_ident()] = now
        for ident in [i for i, seen in self._seen_threads.items() if now - seen > window]:
            del self._seen_threads[ident]
        return max(1, len(self._seen_threads))

    def _stale(self, current: _Round, now: float, active: int) -> bool:
        """The server idled, or the load moved two contexts (4x) or more away from the round's."""
        idle = now - current.last_event > self.config.max_gap_seconds
        return idle or abs(self.config.bucket_of(active) - current.bucket) >= 2

    def _learner(self, bucket: int) -> DiscountedGammaUCB:
        learner = self._learners.get(bucket)
        if learner is None:
            c = self.config
            learner = DiscountedGammaUCB(
                c.max_gamma, discount=c.discount, exploration=c.exploration, delta=c.delta, prior_weight=c.prior_weight,
                unimodal=c.unimodal,
            )
            neighbour = self._nearest_learned(bucket)
            if neighbour is not None and c.prior_weight > 0:
                learner.set_prior(neighbour.observed_relative_means())
            self._learners[bucket] = learner
        return learner

    def _nearest_learned(self, bucket: int) -> DiscountedGammaUCB | None:
        learned = [b for b, learner in self._learners.items() if learner.updates > 0]
        if not learned:
            return None
        return self._learners[min(learned, key=lambda b: (abs(b - bucket), b))]

    def _start_round(self, now: float, active: int) -> _Round:
        bucket = self.config.bucket_of(active)
        self._next_ident += 1
        self._round = _Round(self._next_ident, self._learner(bucket).select(), bucket, active, now)
        return self._round

    def _finish_round(self, finished: _Round, now: float, elapsed: float) -> None:
        mean_active = finished.active_sum / max(finished.active_samples, 1)
        bucket = self.config.bucket_of(mean_active)
        if bucket != finished.bucket:  # the load changed under the round: its reward says little
            self.dropped_rounds += 1
            self._start_round(now, self._active(now))
            return
        seconds = np.array([s for _, s in finished.measured])
        limit = self.config.stall_factor * float(np.median(seconds))
        kept = [(t, s) for t, s in finished.measured if s <= limit]
        record = RoundRecord(
            gamma=finished.gamma,
            bucket=bucket,
            mean_active=mean_active,
            steps=len(kept),
            stalled=len(finished.measured) - len(kept),
            tokens=sum(t for t, _ in kept),
            step_seconds=sum(s for _, s in kept),
            wall_seconds=elapsed,
        )
        if record.step_seconds > 0:
            self._learner(bucket).update(finished.gamma, record.tokens_per_second)
            self.history.append(record)
        else:
            self.dropped_rounds += 1
        self._start_round(now, self._active(now))
