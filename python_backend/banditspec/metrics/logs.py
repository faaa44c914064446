"""A periodic one-line summary of :class:`~banditspec.metrics.stats.ServingStats` in the
server log, for operators without a Prometheus scraper."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from banditspec.errors import BanditSpecValidationError
from banditspec.metrics.stats import ServingStats, StatsSnapshot


def format_summary(snap: StatsSnapshot) -> str:
    """E.g. ``requests 12 (success 11, invalid 1), active 2, steps 340, MAT 2.41;
    arms pld@4 120 pulls 310/480 accepted (65%), ...; drafter failures fault_raise/error 1``."""
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(snap.requests.items()))
    arms = ", ".join(
        f"{name} {c.pulls} pulls {c.accepted}/{c.drafted} accepted ({c.acceptance_rate:.0%})"
        for name, c in sorted(snap.arms.items())
    )
    text = (
        f"requests {snap.total_requests} ({outcomes or 'none'}), active {snap.active_sequences}, "
        f"steps {snap.steps}, MAT {snap.mean_accepted_tokens:.2f}; arms {arms or 'none'}"
    )
    if snap.drafter_failures:
        failures = ", ".join(f"{d}/{k} {n}" for (d, k), n in sorted(snap.drafter_failures.items()))
        text += f"; drafter failures {failures}"
    return text


class SummaryLogger:
    """Logs :func:`format_summary` at most once per ``interval_s`` (call :meth:`maybe_log`
    whenever something happened, e.g. at the end of each request).

    ``emit`` writes one line (in Triton: ``pb_utils.Logger.log_info``, so the line lands in
    the server log); default: INFO on the ``banditspec.metrics`` logger."""

    def __init__(
        self,
        stats: ServingStats,
        *,
        interval_s: float = 60.0,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not interval_s > 0:
            raise BanditSpecValidationError("interval_s", f"must be > 0, got {interval_s!r}")
        self._stats = stats
        self._interval = interval_s
        self._emit = emit or logging.getLogger("banditspec.metrics").info
        self._clock = clock
        self._next = clock() + interval_s

    def maybe_log(self) -> bool:
        """Log a summary if ``interval_s`` has passed since the last one; True when it did."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._interval
        self._emit(f"banditspec: {format_summary(self._stats.snapshot())}")
        return True
