"""The threads serving requests right now, so that a model that is stopping can say which of
them it is still waiting for, and where each one is (its stack), instead of waiting blind."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager


class RequestThreads:
    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running: dict[int, str] = {}  # thread ident -> thread name

    @contextmanager
    def running(self) -> Iterator[None]:
        """Count the calling thread as serving a request for the duration of the block."""
        thread = threading.current_thread()
        with self._idle:
            self._running[thread.ident or 0] = thread.name
        try:
            yield
        finally:
            with self._idle:
                self._running.pop(thread.ident or 0, None)
                self._idle.notify_all()

    def count(self) -> int:
        with self._idle:
            return len(self._running)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every request thread ended within ``timeout_s``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout=timeout_s)

    def stacks(self) -> str:
        """Where each request thread still running is now, innermost call last."""
        with self._idle:
            running = dict(self._running)
        frames = sys._current_frames()
        parts = []
        for ident, name in sorted(running.items()):
            frame = frames.get(ident)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "  (no frame)\n"
            parts.append(f"thread {name} ({ident}):\n{where}")
        return "".join(parts)
