"""A drafter's proposal under a per-step deadline: the one thread of the decoding loop.

:class:`ProposeWorker` runs one request's ``propose()`` calls on a private daemon thread, so
that a request (:class:`banditspec.decoding.drafting.RequestDrafters`) can stop waiting for a drafter
that overruns its deadline; :class:`ProposeTimeout` says it did.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_A = TypeVar("_A")
_R = TypeVar("_R")
_Job = tuple[Callable[[Any], Any], Any, list[tuple[bool, Any]], threading.Event]


class ProposeTimeout(Exception):
    """A proposal did not return within the per-step deadline."""


class ProposeWorker:
    """One request's drafter proposals, run on a private daemon thread so that a step
    can stop waiting for a drafter that overruns its deadline, even one whose
    ``propose()`` never returns: that arm is dropped and the request goes on.

    A thread abandoned after a timeout finishes the stuck call (its result is discarded)
    and exits; the session starts a new worker for its next proposal.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="banditspec-propose", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[_A], _R], arg: _A, *, timeout: float) -> _R:
        """``fn(arg)`` on the worker thread; raises ProposeTimeout after ``timeout`` s,
        or what ``fn`` raised."""
        done = threading.Event()
        box: list[tuple[bool, Any]] = []
        self._jobs.put((fn, arg, box, done))
        if not done.wait(timeout):
            self.stop()
            raise ProposeTimeout()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Let the thread exit once its current call (if any) returns."""
        self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, arg, box, done = job
            try:
                box.append((True, fn(arg)))
            except BaseException as exc:  # handed to the caller, never lost on this thread
                box.append((False, exc))
            done.set()
