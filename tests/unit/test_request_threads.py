"""banditspec.serving.request_threads: a stopping model knows which request threads it waits
for and where each one is."""

from __future__ import annotations

import threading
import time

from banditspec.serving.request_threads import RequestThreads


def stuck_in_a_call(threads: RequestThreads, release: threading.Event, entered: threading.Event) -> None:
    with threads.running():
        entered.set()
        release.wait(10)


def test_a_thread_still_serving_is_waited_for_and_named_with_its_stack():
    threads, release, entered = RequestThreads(), threading.Event(), threading.Event()
    worker = threading.Thread(target=stuck_in_a_call, args=(threads, release, entered), name="banditspec_7")
    worker.start()
    assert entered.wait(5)
    began = time.monotonic()
    assert not threads.wait_idle(0.2) and time.monotonic() - began >= 0.2
    assert threads.count() == 1
    stacks = threads.stacks()
    assert "thread banditspec_7" in stacks and "stuck_in_a_call" in stacks and "release.wait" in stacks
    release.set()
    assert threads.wait_idle(5) and threads.count() == 0 and threads.stacks() == ""
    worker.join(5)


def test_a_thread_that_raises_still_leaves():
    threads = RequestThreads()

    def failing() -> None:
        try:
            with threads.running():
                raise RuntimeError("boom")
        except RuntimeError:
            pass

    worker = threading.Thread(target=failing)
    worker.start()
    worker.join(5)
    assert threads.wait_idle(0) and threads.count() == 0


def test_idle_at_once_when_nothing_runs():
    assert RequestThreads().wait_idle(0)
