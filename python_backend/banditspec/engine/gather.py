"""Concurrent sequences' verification steps leave the controller as ONE call.

Were every sequence's step its own BLS request, the target's dynamic batcher would hold each
one up to ``max_queue_delay_microseconds`` hoping for company: a lone sequence would pay that
delay on every step, and the batcher cannot know whether company is coming. The controller does know: it counts
the sequences in flight. :class:`VerifyGatherer` waits for the sequences that are still
drafting, and only for them:

* the sequence that completes the group (every active sequence waiting) sends at once,
  so a lone sequence never waits;
* while the target is free, the first step waits at most ``window_s`` for the others (what
  the batcher's delay did, but only while company is really coming);
* while a call of this gatherer is at the target, a step goes at once: it would only queue
  behind that call, and the target's batcher (no delay) merges what queued when it frees,
  so the target never idles while steps are waiting (holding such steps in the controller
  for the busy call's members instead ran slower than the batcher's delay at 8 streams, and
  on packed passes it gained nothing consistent: docs/benchmarks/history.md;
  experiments/ab_verify_gather.sh compares the paths).

What a pass of R rows costs, and what the other sequences put into a step, is what the
controller prices a request's draft by under load (:class:`~banditspec.bandits.cost_model.BatchCost`,
``report_to``). A step sent while a call is out is merged at the target with whatever else
queued, so a group is not a pass and its wait is not a pass's cost: the reference target says,
in every answer, the pass it verified the row in (:class:`~banditspec.engine.contract.VerifyPass`:
its sequences, rows, context and engine time), and the gatherer reports each such pass once.
From a target that does not say (TensorRT-LLM), each group's call is timed and reported with
its rows, a call that queued behind another left out of the row fit; a sequence's first step
also prefills its prompt, which the gatherer tells from a continuation by remembering what
each sequence sends next.

The group goes out through ``inner.verify`` (e.g. :class:`~banditspec.engine.tensor_codec.TensorEngine`
with ``max_rows`` > 1: one request of N rows). If that call fails, each member is retried
alone, so that a request the target refuses fails only its own sequence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from banditspec.engine.contract import Engine, VerifyPass, VerifyRequest, VerifyResult

log = logging.getLogger(__name__)


class CallObserver(Protocol):
    def observe_call(self, fed: Sequence[int], contexts: Sequence[int], produced: Sequence[int],
                     seconds: float, continues: Sequence[bool], queued: bool = False) -> None: ...

    def observe_pass(self, verified: VerifyPass) -> None: ...


# Sequences whose next step the gatherer remembers (a continuation's key; bounded).
REMEMBERED_SEQUENCES = 4096
# Target passes already reported (several groups can share one pass; bounded).
REMEMBERED_PASSES = 64


def _key(ids: np.ndarray) -> int:
    return hash(np.ascontiguousarray(ids, dtype=np.int32).tobytes())


class _Slot:
    __slots__ = ("request", "result", "error", "sent", "done", "queued")

    def __init__(self, request: VerifyRequest):
        self.request = request
        self.result: VerifyResult | None = None
        self.error: BaseException | None = None
        self.sent = False  # in a group on its way to the target
        self.done = False
        self.queued = False  # (a group's first slot) sent while another call was at the target


class VerifyGatherer:
    """An :class:`~banditspec.engine.contract.Engine` in front of ``inner`` (thread-safe).

    active: the number of sequences in flight (each will call :meth:`verify` again unless it
    ends); window_s: the most a step waits for the others (0: never gather); max_rows: the
    most sequences one call carries."""

    def __init__(self, inner: Engine, *, window_s: float, max_rows: int, active: Callable[[], int] = lambda: 1,
                 clock: Callable[[], float] = time.monotonic):
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_context = inner.max_context
        self.eos_id = inner.eos_id
        self.provides_hidden_states = inner.provides_hidden_states
        self._active = active
        self._window = window_s
        self._max_rows = max_rows
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: list[_Slot] = []
        self._in_flight = 0  # calls of this gatherer at the target
        self._first_wait = 0.0  # when the oldest waiting step arrived
        self.calls = 0  # gathered calls sent
        self.rows = 0  # sequences they carried
        self._observer: CallObserver | None = None
        self._expected: OrderedDict[int, None] = OrderedDict()  # keys of the steps sequences will send next
        self._reported: OrderedDict[int, None] = OrderedDict()  # serials of the target passes reported

    def report_to(self, observer: CallObserver) -> None:
        """Report every call sent to ``observer`` (the batch cost model)."""
        self._observer = observer

    def bind_active_sequences(self, active: Callable[[], int]) -> None:
        """Count the sequences in flight with ``active`` (the controller's exact count)."""
        self._active = active

    def __getattr__(self, name: str) -> Any:  # the inner engine's other facts (e.g. its counters)
        return getattr(self.inner, name)

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        if len(requests) != 1 or self._window == 0:
            return self.inner.verify(requests)  # already a batch, or gathering is off
        slot = _Slot(requests[0])
        with self._cond:
            if not self._waiting:
                self._first_wait = self._clock()
            self._waiting.append(slot)
            self._cond.notify_all()
            group = self._wait_or_lead(slot)
        if group is not None:
            self._send(group)
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return [slot.result]

    def _wait_or_lead(self, slot: _Slot) -> list[_Slot] | None:
        """Under the lock: wait until ``slot`` is answered (None), or send ``slot`` with the
        oldest other waiting steps (the group returned). A thread only ever sends a group
        holding its own step: one that sent another's group would keep its own sequence
        waiting a whole call after its answer came."""
        while not slot.done:
            if slot.sent:  # another thread sent it
                self._cond.wait()
                continue
            now = self._clock()
            due = self._first_wait + self._window
            if self._in_flight or len(self._waiting) >= min(self._active(), self._max_rows) or now >= due:
                group = [slot] + [s for s in self._waiting if s is not slot][: self._max_rows - 1]
                for s in group:
                    s.sent = True
                slot.queued = self._in_flight > 0
                self._waiting = [s for s in self._waiting if not s.sent]
                if self._waiting:
                    self._first_wait = now
                self._in_flight += 1
                return group
            self._cond.wait(due - now)
        return None

    def _report(self, group: list[_Slot], seconds: float) -> None:
        """The passes the group was verified in, as the target measured them, to the observer;
        from a target that does not say (TensorRT-LLM), the call's rows and its time, which
        holds the wait behind the call that was at the target when it was sent (``queued``)."""
        assert self._observer is not None
        passes = [s.result.verified_in if s.result is not None else None for s in group]
        if all(p is not None for p in passes):
            fresh: list[VerifyPass] = []
            with self._cond:
                for p in passes:
                    assert p is not None
                    if p.serial not in self._reported:
                        self._reported[p.serial] = None
                        fresh.append(p)
                while len(self._reported) > REMEMBERED_PASSES:
                    self._reported.popitem(last=False)
            for p in fresh:
                self._observer.observe_pass(p)
            return
        fed, contexts, produced, continues = [], [], [], []
        with self._cond:
            for s in group:
                ids = np.asarray(s.request.input_ids).reshape(-1)
                output = np.asarray(s.result.output_ids if s.result is not None else (), dtype=np.int32).reshape(-1)
                fed.append(1 + int(np.asarray(s.request.draft_ids).size))
                contexts.append(len(ids))
                produced.append(int(output.size))
                continues.append(self._expected.pop(_key(ids), 0) is None)
                self._expected[_key(np.concatenate([ids.astype(np.int32), output]))] = None
            while len(self._expected) > REMEMBERED_SEQUENCES:
                self._expected.popitem(last=False)
        self._observer.observe_call(fed, contexts, produced, seconds, continues, queued=group[0].queued)

    def _send(self, group: list[_Slot]) -> None:
        timed: float | None = None  # the group's call, when it went through as one
        try:
            try:
                began = self._clock()
                results = self.inner.verify([s.request for s in group])
                timed = self._clock() - began
                for s, r in zip(group, results):
                    s.result = r
            except Exception as exc:
                if len(group) == 1:
                    group[0].error = exc
                else:  # one member's request may be what the target refused: each alone
                    for s in group:
                        try:
                            (s.result,) = self.inner.verify([s.request])
                        except Exception as alone:
                            s.error = alone
        except BaseException as exc:  # interrupted: nobody may wait forever
            for s in group:
                if s.result is None and s.error is None:
                    s.error = exc
            raise
        finally:
            with self._cond:
                self.calls += 1
                self.rows += len(group)
                for s in group:
                    s.done = True
                self._in_flight -= 1
                self._cond.notify_all()
        if timed is not None and self._observer is not None:
            try:
                self._report(group, timed)
            except Exception:  # the statistics' fault is no request's: they were answered
                log.exception("reporting a gathered call to the cost model failed")
