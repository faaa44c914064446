"""Fault-injection drafters. TEST-ONLY: they exist to prove that a failing drafter
costs its arm, never the request.

* ``fault_raise``: ``propose()`` raises :class:`InjectedFault` (after ``fail_after``
  empty proposals).
* ``fault_hang``:  ``propose()`` blocks until its session is closed (or ``max_hang_s``
  passes, a safety net so that a test can never leak a thread for long). The decoding
  loop must give up at its per-step deadline, drop the arm and go on.

They live outside the shipped package. A deployment under test reaches them as a drafter
plug-in: its ``drafter_plugin`` parameter names this file and its ``drafters`` parameter
lists them (see :func:`banditspec.drafters.registry.build_drafters`); a request can name an
arm only among the drafters the deployment built, so no request can switch them on.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
from banditspec.checks import check_int, is_number
from banditspec.drafters.base import Draft, Drafter, DrafterTraits, empty_draft
from banditspec.errors import BanditSpecValidationError

FAULT_RAISE = "fault_raise"
FAULT_HANG = "fault_hang"
FAULTY_DRAFTER_NAMES: tuple[str, ...] = (FAULT_RAISE, FAULT_HANG)


class InjectedFault(RuntimeError):
    """The failure a ``fault_raise`` drafter raises on purpose."""


_empty = empty_draft


class RaisingDrafter:
    """Every session returns ``fail_after`` empty drafts, then raises on each ``propose``."""

    traits = DrafterTraits()  # the deadline thread: a hang must not block the request

    def __init__(self, *, fail_after: int = 0, name: str = FAULT_RAISE):
        check_int("fail_after", fail_after, 0)
        self.name = name
        self.fail_after = fail_after
        self._lock = threading.Lock()
        self.faults_raised = 0

    def start(self, prompt_ids: Sequence[int]) -> _RaisingSession:
        return _RaisingSession(self)

    def _count_fault(self) -> None:
        with self._lock:
            self.faults_raised += 1


class _RaisingSession:
    def __init__(self, drafter: RaisingDrafter):
        self._drafter = drafter
        self._proposals = 0

    def propose(self, max_len: int) -> Draft:
        self._proposals += 1
        if self._proposals > self._drafter.fail_after:
            self._drafter._count_fault()
            raise InjectedFault(f"{self._drafter.name}: injected failure at proposal {self._proposals}")
        return _empty()

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        pass

    def close(self, finished: bool) -> None:
        pass


class HangingDrafter:
    """Every ``propose`` blocks until its session is closed, or ``max_hang_s`` seconds.

    ``hanging`` counts proposals blocked right now, ``hangs_started`` all that ever blocked.
    """

    traits = DrafterTraits()  # the deadline thread: a hang must not block the request

    def __init__(self, *, max_hang_s: float = 30.0, name: str = FAULT_HANG):
        if not is_number(max_hang_s) or not max_hang_s > 0:
            raise BanditSpecValidationError("max_hang_s", f"must be a number > 0, got {max_hang_s!r}")
        self.name = name
        self.max_hang_s = float(max_hang_s)
        self._lock = threading.Lock()
        self.hanging = 0
        self.hangs_started = 0

    def start(self, prompt_ids: Sequence[int]) -> _HangingSession:
        return _HangingSession(self)

    def _enter(self) -> None:
        with self._lock:
            self.hanging += 1
            self.hangs_started += 1

    def _leave(self) -> None:
        with self._lock:
            self.hanging -= 1


class _HangingSession:
    def __init__(self, drafter: HangingDrafter):
        self._drafter = drafter
        self._released = threading.Event()

    def propose(self, max_len: int) -> Draft:
        self._drafter._enter()
        try:
            self._released.wait(self._drafter.max_hang_s)
        finally:
            self._drafter._leave()
        return _empty()

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        pass

    def close(self, finished: bool) -> None:
        self._released.set()


def make_faulty_drafter(name: str) -> Drafter:
    """A fault-injection drafter by name (:data:`FAULTY_DRAFTER_NAMES`)."""
    if name == FAULT_RAISE:
        return RaisingDrafter()
    if name == FAULT_HANG:
        return HangingDrafter()
    raise BanditSpecValidationError("drafters", f"unknown fault drafter {name!r}; expected one of {FAULTY_DRAFTER_NAMES}")


# The drafter plug-in interface (banditspec.drafters.registry.build_drafters, ``plugin``).
DRAFTER_NAMES = FAULTY_DRAFTER_NAMES
make_drafter = make_faulty_drafter
