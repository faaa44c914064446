"""When a decoding step's bookkeeping runs: the costaware controller's learning from a step
(scoring every drafter's proposal against the target's tokens, the server-wide acceptance
and cost-model updates, the cost model's refit) that the next choice can do without.

The next round needs from a step only its tokens (the drafters observe them) and whether
each drafter's latest first token was right (the round's context); the rest of what the
step taught only sharpens estimates that move slowly. Done at once (``"now"``), it sits
between the target's answer and the next call to the target, ~0.2 ms a step through
Triton, while the controller's process has nothing to do during the target's ~30 ms
forward. ``"background"`` runs it there: the session hands it, after choosing the next
round, to a :class:`BackgroundBookkeeper` thread, which runs it while the caller waits for
the target (a BLS call and the reference engine's kernels release the GIL); the next
:meth:`~banditspec.decoding.session.DecodingSession.apply` waits for it (it is long done by then).
``"deferred"`` runs it at the same point of the protocol on the caller's thread: the same
choices as ``"background"``, deterministic, for the replay evaluator and tests.

Deferred, a round is chosen without the outcomes of the step just before it (one step of
lag in the acceptance counts and the cost model; the context feature is kept current).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from banditspec.errors import BanditSpecValidationError

log = logging.getLogger(__name__)

BOOKKEEPING_MODES = ("now", "deferred", "background")


class Bookkeeper(Protocol):
    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` (it never raises: a session keeps its own errors) now or soon."""


class DeferredBookkeeper:
    """Runs each job at once, on the caller's thread (the ``"deferred"`` mode)."""

    def submit(self, job: Callable[[], None]) -> None:
        job()


class BackgroundBookkeeper:
    """One daemon thread that runs the jobs in order (the ``"background"`` mode); shared
    by every session of a decoder."""

    def __init__(self, name: str = "banditspec-bookkeeping"):
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self, timeout: float | None = None) -> None:
        """Stop after the jobs already submitted."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a job keeps its own errors; this only keeps the thread alive
                log.exception("bookkeeping job failed")


def check_bookkeeping(mode: str) -> str:
    """A bookkeeping mode, normalised and checked (the error names ``bookkeeping``)."""
    normal = mode.strip().lower()
    if normal not in BOOKKEEPING_MODES:
        raise BanditSpecValidationError("bookkeeping", f"must be one of {', '.join(BOOKKEEPING_MODES)}, got {mode!r}")
    return normal


def make_bookkeeper(mode: str) -> Bookkeeper | None:
    """The bookkeeper of ``mode`` (None for ``"now"``: sessions do it within the step)."""
    mode = check_bookkeeping(mode)
    if mode == "now":
        return None
    return DeferredBookkeeper() if mode == "deferred" else BackgroundBookkeeper()
