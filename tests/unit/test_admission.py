"""banditspec.serving.admission: the bounded first-in-first-out queue in front of the sequence slots."""

from __future__ import annotations

import threading
import time

import pytest
from banditspec.errors import parse_retry_after, retry_after_message
from banditspec.serving.admission import AdmissionLimits, AdmissionQueue, AdmissionRefused

POLL_S = 0.01


def queue(max_active=1, max_queue=4, max_wait_s=30.0, **kw) -> AdmissionQueue:
    return AdmissionQueue(AdmissionLimits(max_active, max_queue, max_wait_s), poll_s=POLL_S, **kw)


def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


class Waiter(threading.Thread):
    """acquire() on a thread; records the slot (or None / the refusal) and when it came."""

    def __init__(self, q: AdmissionQueue, name: str, log: list, hold: threading.Event | None = None):
        super().__init__(daemon=True)
        self.q, self.name, self.log, self.hold = q, name, log, hold
        self.cancel = threading.Event()
        self.slot = None
        self.refused: AdmissionRefused | None = None
        self.finished = threading.Event()

    def run(self):
        try:
            self.slot = self.q.acquire(self.cancel.is_set)
            if self.slot is not None:
                self.log.append(self.name)
                if self.hold is not None:
                    self.hold.wait(5)
                self.slot.release()
        except AdmissionRefused as exc:
            self.refused = exc
        finally:
            self.finished.set()


def enqueue(q: AdmissionQueue, names, log, hold=None) -> list[Waiter]:
    """Start waiters one at a time, each queued before the next arrives."""
    waiters = []
    for name in names:
        before = q.snapshot().queued
        w = Waiter(q, name, log, hold)
        w.start()
        wait_until(lambda expected=before + 1: q.snapshot().queued == expected)
        waiters.append(w)
    return waiters


def test_a_free_slot_is_taken_at_once_and_given_back():
    q = queue(max_active=2)
    a, b = q.acquire(), q.acquire()
    assert a is not None and b is not None and a.waited_s == 0.0
    assert q.snapshot().active == 2
    a.release()
    b.release()
    assert q.snapshot().active == 0 and q.snapshot().queued == 0


def test_waiting_requests_are_admitted_in_arrival_order():
    q = queue(max_active=1, max_queue=8)
    holder = q.acquire()
    log: list[str] = []
    waiters = enqueue(q, [f"r{i}" for i in range(6)], log)
    holder.release()
    for w in waiters:
        assert w.finished.wait(5)
    assert log == [f"r{i}" for i in range(6)]
    assert q.snapshot().active == 0 and q.snapshot().queued == 0
    assert all(w.slot.waited_s > 0 for w in waiters)


def test_a_freed_slot_goes_to_the_head_of_the_queue_not_to_a_later_arrival():
    q = queue(max_active=1, max_queue=4)
    holder = q.acquire()
    log: list[str] = []
    hold = threading.Event()
    (first,) = enqueue(q, ["queued"], log, hold)
    holder.release()  # handed to "queued" directly
    wait_until(lambda: log == ["queued"])
    late = Waiter(q, "late", log)
    late.start()
    wait_until(lambda: q.snapshot().queued == 1)  # the slot is taken: the late one waits
    assert log == ["queued"]
    hold.set()
    assert late.finished.wait(5) and log == ["queued", "late"]


def test_a_cancelled_request_leaves_the_queue_at_once_and_loses_nobody_a_place():
    q = queue(max_active=1, max_queue=4)
    holder = q.acquire()
    log: list[str] = []
    a, b, c = enqueue(q, ["a", "b", "c"], log)
    started = time.monotonic()
    b.cancel.set()
    assert b.finished.wait(1) and b.slot is None and b.refused is None
    assert time.monotonic() - started < 0.5
    assert q.snapshot().queued == 2
    holder.release()
    assert a.finished.wait(5) and c.finished.wait(5)
    assert log == ["a", "c"]
    assert q.snapshot().active == 0


def test_a_full_queue_is_refused_at_once_with_a_retry_after():
    q = queue(max_active=1, max_queue=2)
    holder = q.acquire()
    log: list[str] = []
    waiters = enqueue(q, ["a", "b"], log)
    started = time.monotonic()
    with pytest.raises(AdmissionRefused) as refused:
        q.acquire()
    assert time.monotonic() - started < 0.1
    assert refused.value.reason == "queue_full" and refused.value.retry_after_s >= 1
    assert "server busy" in str(refused.value)
    holder.release()
    for w in waiters:
        assert w.finished.wait(5)
    assert log == ["a", "b"] and q.snapshot().active == 0


def test_no_queue_means_refused_when_every_slot_is_taken():
    q = queue(max_active=1, max_queue=0)
    holder = q.acquire()
    with pytest.raises(AdmissionRefused) as refused:
        q.acquire()
    assert refused.value.reason == "queue_full"
    holder.release()
    assert q.acquire() is not None


def test_an_expired_wait_is_refused_and_leaves_the_queue():
    q = queue(max_active=1, max_queue=4, max_wait_s=0.2)
    holder = q.acquire()
    started = time.monotonic()
    with pytest.raises(AdmissionRefused) as refused:
        q.acquire()
    waited = time.monotonic() - started
    assert 0.2 <= waited < 1.0
    assert refused.value.reason == "wait_expired" and refused.value.retry_after_s >= 1
    assert q.snapshot().queued == 0 and q.snapshot().active == 1
    holder.release()
    assert q.snapshot().active == 0


def test_a_slot_handed_over_while_the_waiter_cancels_is_passed_on_not_lost():
    """The holder releases inside the waiter's cancellation check: the slot was granted to a
    request that is leaving; it must go to the next one (or back to the pool)."""
    q = queue(max_active=1, max_queue=4)
    holder = q.acquire()
    log: list[str] = []

    def cancelled_after_release():
        holder.release()
        return True

    leaving = threading.Thread(target=lambda: log.append(q.acquire(cancelled_after_release)))
    leaving.start()
    leaving.join(5)
    assert log == [None]
    assert q.snapshot().active == 0 and q.snapshot().queued == 0
    assert q.acquire() is not None  # the slot is free again


def test_no_slot_is_lost_when_the_holder_fails():
    q = queue(max_active=2, max_queue=2)
    for _ in range(5):
        with pytest.raises(RuntimeError), q.acquire():
            raise RuntimeError("decoding failed")
    slot = q.acquire()
    slot.release()
    slot.release()  # a second release is a no-op, not a slot too many
    assert q.snapshot().active == 0
    a, b = q.acquire(), q.acquire()
    with pytest.raises(AdmissionRefused):  # both slots held, the queue filled: still exactly 2 slots
        _fill(q)
    a.release()
    b.release()


def _fill(q: AdmissionQueue):
    """Fill the queue with waiters that leave once cancelled; then acquire (refused: full)."""
    cancel = threading.Event()
    threads = [threading.Thread(target=q.acquire, args=(cancel.is_set,), daemon=True) for _ in range(q.limits.max_queue)]
    for t in threads:
        t.start()
    wait_until(lambda: q.snapshot().queued == q.limits.max_queue)
    try:
        return q.acquire()
    finally:
        cancel.set()
        for t in threads:
            t.join(5)


def test_the_retry_after_follows_how_long_slots_are_held():
    now = [0.0]
    q = AdmissionQueue(AdmissionLimits(2, 0, 60.0), clock=lambda: now[0])
    q.acquire()
    q.acquire()
    # nothing released yet: the wait limit stands in for the unknown hold time (60 s / 2 slots)
    with pytest.raises(AdmissionRefused) as before:
        q.acquire()
    assert before.value.retry_after_s == 30
    now[0] = 10.0
    q._release(0.0)  # one slot held 10 s
    q.acquire()
    with pytest.raises(AdmissionRefused) as after:
        q.acquire()
    assert after.value.retry_after_s == 5  # a slot frees every 10 s / 2 slots


def test_observers_see_the_queue_length_change():
    seen: list[int] = []
    q = queue(max_active=1, max_queue=4, on_change=lambda snap: seen.append(snap.queued))
    holder = q.acquire()
    log: list[str] = []
    waiters = enqueue(q, ["a", "b"], log)
    holder.release()
    for w in waiters:
        assert w.finished.wait(5)
    assert max(seen) == 2 and seen[-1] == 0


def test_limits_are_checked():
    for bad in ((0, 1, 1.0), (1, -1, 1.0), (1, 1, 0.0)):
        with pytest.raises(ValueError):
            AdmissionLimits(*bad)


def test_the_retry_after_suffix_round_trips():
    message = retry_after_message("server busy: queue full", 7)
    assert message.endswith("(retry after 7 s)") and parse_retry_after(message) == 7
    assert parse_retry_after(retry_after_message("x", 0)) == 1
