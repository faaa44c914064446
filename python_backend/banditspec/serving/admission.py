"""Admission: at most ``max_active`` sequences decode at once; the requests beyond them wait
in a bounded first-in-first-out queue.

A request waits until a slot is handed to it (in arrival order: a slot that frees goes to the
head of the queue, never to a request that arrived later), until it is cancelled (it leaves
the queue at once, its place taken by the next), or until ``max_wait_s`` has passed. Only a
full queue or an expired wait refuses it, with :class:`AdmissionRefused` carrying a
retry-after estimated from how long slots have been held.

A waiting request's thread blocks on its own event and looks at its ``is_cancelled``
callable every ``poll_s`` seconds (a stream's cancellation has no callback to wait on; each
look is an IPC call in Triton, hence not a busier poll).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# How often a waiting request looks whether its client went away.
CANCEL_POLL_S = 0.1
# Weight of the newest slot hold in the running mean that prices a retry.
HOLD_EMA_WEIGHT = 0.2


class AdmissionRefused(Exception):
    """A request the queue cannot take (``reason``: "queue_full" | "wait_expired");
    ``retry_after_s``: whole seconds after which trying again is likely to be admitted."""

    def __init__(self, reason: str, message: str, retry_after_s: int):
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class AdmissionLimits:
    """max_active: sequences decoding at once; max_queue: requests waiting beyond them
    (0: none wait, a request finding every slot taken is refused); max_wait_s: the longest a
    request waits for a slot."""

    max_active: int
    max_queue: int
    max_wait_s: float

    def __post_init__(self) -> None:
        if self.max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {self.max_active}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if not self.max_wait_s > 0:
            raise ValueError(f"max_wait_s must be > 0, got {self.max_wait_s}")


@dataclass(frozen=True)
class AdmissionSnapshot:
    active: int
    queued: int


class _Waiter:
    __slots__ = ("event", "granted")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.granted = False


class Slot:
    """A held slot: :meth:`release` it exactly once (a second call is a no-op), or use it
    as a context manager. ``waited_s``: how long the request queued for it."""

    def __init__(self, queue: AdmissionQueue, waited_s: float, taken_at: float):
        self._queue = queue
        self.waited_s = waited_s
        self._taken_at = taken_at
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._queue._release(self._taken_at)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class AdmissionQueue:
    """See the module doc. ``on_change(snapshot)`` is called (under the queue's lock, so the
    last call carries the current state) whenever the active or queued count changes."""

    def __init__(self, limits: AdmissionLimits, *, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = CANCEL_POLL_S,
                 on_change: Callable[[AdmissionSnapshot], None] | None = None):
        self.limits = limits
        self._clock = clock
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._active = 0
        self._waiters: deque[_Waiter] = deque()
        self._mean_hold_s: float | None = None  # running mean of how long a slot is held
        self.on_change = on_change

    def snapshot(self) -> AdmissionSnapshot:
        with self._lock:
            return AdmissionSnapshot(self._active, len(self._waiters))

    def acquire(self, is_cancelled: Callable[[], bool] = lambda: False) -> Slot | None:
        """A slot, once one is free and every earlier request has had one; None when
        ``is_cancelled()`` turned true while waiting. Raises :class:`AdmissionRefused`."""
        arrived = self._clock()
        with self._lock:
            if self._active < self.limits.max_active and not self._waiters:
                self._active += 1
                self._changed()
                return Slot(self, 0.0, arrived)
            if len(self._waiters) >= self.limits.max_queue:
                raise AdmissionRefused(
                    "queue_full",
                    f"server busy: {self._active} sequences in flight and {len(self._waiters)} requests queued "
                    f"(max_concurrent_sequences, max_queue_size)",
                    self._retry_after(1),
                )
            waiter = _Waiter()
            self._waiters.append(waiter)
            self._changed()
        deadline = arrived + self.limits.max_wait_s
        while True:
            remaining = deadline - self._clock()
            if waiter.event.wait(max(0.0, min(self._poll_s, remaining))) or waiter.granted:
                now = self._clock()
                return Slot(self, now - arrived, now)
            cancelled = is_cancelled()
            if not cancelled and self._clock() < deadline:
                continue
            with self._lock:
                if waiter.granted:  # handed a slot while giving up: hand it on
                    granted = True
                else:
                    granted = False
                    self._waiters.remove(waiter)
                    self._changed()
                ahead = len(self._waiters)
            if granted:
                now = self._clock()
                if not cancelled:  # the slot came in the same instant as the deadline: take it
                    return Slot(self, now - arrived, now)
                self._release(now)
                return None
            if cancelled:
                return None
            raise AdmissionRefused(
                "wait_expired",
                f"server busy: no sequence slot within {self.limits.max_wait_s:g} s "
                "(max_queue_wait_s)",
                self._retry_after(ahead + 1),
            )

    def _release(self, taken_at: float) -> None:
        held = max(0.0, self._clock() - taken_at)
        with self._lock:
            mean = self._mean_hold_s
            self._mean_hold_s = held if mean is None else mean + HOLD_EMA_WEIGHT * (held - mean)
            if self._waiters:  # hand the slot straight to the head: no later arrival can take it
                waiter = self._waiters.popleft()
                waiter.granted = True
                waiter.event.set()
            else:
                self._active -= 1
            self._changed()

    def _retry_after(self, admissions: int) -> int:
        """Whole seconds (>= 1) until ``admissions`` more requests have had a slot, at the
        rate slots have been freeing (each held ``mean hold`` seconds, ``max_active`` at once).
        Before any slot has been released the mean is unknown: the wait limit stands in."""
        mean = self._mean_hold_s if self._mean_hold_s is not None else self.limits.max_wait_s
        return max(1, math.ceil(admissions * mean / self.limits.max_active))

    def _changed(self) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):  # an observer's trouble never blocks admission
                self.on_change(AdmissionSnapshot(self._active, len(self._waiters)))
