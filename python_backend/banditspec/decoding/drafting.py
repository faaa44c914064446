"""A request's drafter sessions: started once, asked to propose within the decoder's
deadline, told the target's tokens, closed at the end. A drafter that fails in any of
these (raises, misses its deadline, proposes ids outside the vocabulary) is dropped for the
rest of the request through ``on_drop``; the request itself carries on without it."""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

import numpy as np

from banditspec.drafters.base import Draft, Drafter, DraftSession, Preview, PreviewingSession
from banditspec.drafters.deadline import ProposeTimeout, ProposeWorker

log = logging.getLogger(__name__)


class RequestDrafters:
    """drafters: the decoder's drafters by name; names: those this request's arms use."""

    def __init__(self, drafters: Mapping[str, Drafter], names: Iterable[str], prompt: Sequence[int], *,
                 vocab_size: int, deadline_s: float | None, on_drop: Callable[[str, str], None]):
        self._drafters = drafters
        self._vocab_size = vocab_size
        self._deadline = deadline_s
        self._on_drop = on_drop
        self._sessions: dict[str, DraftSession] = {}
        self._worker: ProposeWorker | None = None  # created at the first proposal that needs it
        self._inline = {name for name in self._drafters if self._drafters[name].traits.runs_inline}
        for name in names:
            try:
                self._sessions[name] = drafters[name].start(prompt)
            except Exception as exc:  # a broken drafter costs its arms, not the request
                self.drop(name, f"start failed: {type(exc).__name__}")

    def names(self) -> list[str]:
        """The drafters still serving this request."""
        return list(self._sessions)

    def drafter(self, name: str) -> Drafter | None:
        return self._drafters.get(name)

    def propose(self, name: str, max_len: int) -> Draft | None:
        """Up to ``max_len`` tokens from drafter ``name``; None when it failed and was dropped."""
        session = self._sessions.get(name)
        if session is None:
            self.drop(name, "unavailable")
            return None
        began = time.perf_counter()
        try:
            draft = self._call(session, max_len, name in self._inline)
            ids = _token_ids(draft.token_ids, max_len)
            # range-checked as Python ints: numpy's min/max cost more than a short list's
            if ids.size and not 0 <= min(listed := ids.tolist()) <= max(listed) < self._vocab_size:
                raise ValueError("draft token id out of range")
            probs = draft.probs[: ids.size] if draft.probs is not None else None
        except ProposeTimeout:
            log.warning("drafter %s missed its %.3f s deadline", name, self._deadline)
            self._worker = None  # its thread is stuck in propose(); the next proposal gets a new one
            self.drop(name, "deadline exceeded")
            return None
        except Exception as exc:
            log.warning("drafter %s failed: %s", name, exc)
            self.drop(name, f"propose failed: {type(exc).__name__}")
            return None
        # Lossless either way: this draft is still verified, but the arm is too slow to keep.
        self._drop_if_late(name, began)
        return Draft(token_ids=ids.astype(np.int32, copy=False), probs=probs, match_len=int(getattr(draft, "match_len", 0)))

    def previews(self, name: str) -> bool:
        """Whether drafter ``name``'s session offers ``preview()`` (see drafters.base)."""
        return callable(getattr(self._sessions.get(name), "preview", None))

    def preview(self, name: str) -> Preview | None:
        """Drafter ``name``'s preview of its next proposal; None when it has none now, or
        failed (and was dropped, as a failed proposal drops it)."""
        session = self._sessions.get(name)
        if session is None or not self.previews(name):
            return None
        began = time.perf_counter()
        try:
            preview = cast(PreviewingSession, session).preview()
            if preview is not None and not 0 <= int(preview.token) < self._vocab_size:
                raise ValueError("preview token id out of range")
        except Exception as exc:
            log.warning("drafter %s failed to preview: %s", name, exc)
            self.drop(name, f"preview failed: {type(exc).__name__}")
            return None
        return None if self._drop_if_late(name, began) else preview

    def hint(self, name: str) -> float | None:
        """Drafter ``name``'s estimate, with no model call, of the chance that a proposal now
        starts with an accepted token (see drafters.base); None when it offers none, or
        failed (and was dropped)."""
        session = self._sessions.get(name)
        estimate = getattr(session, "hint", None)
        if session is None or not callable(estimate):
            return None
        try:
            value = estimate()
            if value is not None and not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"hint {value!r} outside [0, 1]")
        except Exception as exc:
            log.warning("drafter %s failed to give a hint: %s", name, exc)
            self.drop(name, f"hint failed: {type(exc).__name__}")
            return None
        return None if value is None else float(value)

    def _drop_if_late(self, name: str, began: float) -> bool:
        """Drop drafter ``name`` when its call, begun at ``began``, overran the deadline."""
        late = self._deadline is not None and time.perf_counter() - began > self._deadline
        if late:
            self.drop(name, "deadline exceeded")
        return late

    def _call(self, session: DraftSession, max_len: int, inline: bool) -> Draft:
        """``session.propose(max_len)``, bounded by the deadline when there is one.
        ``inline``: a drafter that cannot hang (``runs_inline``: the built-in lookups, an
        in-memory index, microseconds in ``banditspec bench-drafters``; the in-process Eagle
        head, bounded compute, no I/O) is called directly: the hand-off to the deadline thread
        cost ~2 ms per call here (thread wake-up), more than a lookup, and costaware asks every
        cheap drafter at every step. Too slow a call still drops the drafter (see propose)."""
        if self._deadline is None or inline:
            return session.propose(max_len)
        if self._worker is None:
            self._worker = ProposeWorker()
            weakref.finalize(self, self._worker.stop)  # a request dropped unfinished frees its thread
        return self._worker.call(session.propose, max_len, timeout=self._deadline)

    def observe(self, output: Sequence[int], hidden_states: np.ndarray | None) -> None:
        """Every session learns the target's tokens (and features, for those that read them)."""
        for name, session in list(self._sessions.items()):
            try:
                session.observe(output, hidden_states)
            except Exception as exc:
                self.drop(name, f"observe failed: {type(exc).__name__}")

    def drop(self, name: str, reason: str) -> None:
        session = self._sessions.pop(name, None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.close(finished=False)
        self._on_drop(name, reason)

    def close(self, finished: bool) -> None:
        for session in self._sessions.values():
            with contextlib.suppress(Exception):
                session.close(finished=finished)
        self._sessions.clear()
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


def _token_ids(values: object, max_len: int) -> np.ndarray:
    """[<= max_len] a proposal's token ids, unchecked: a drafter's own int32 array sliced
    (not copied: a Draft is not changed after it is made), anything else as int64."""
    if isinstance(values, np.ndarray) and values.dtype == np.int32 and values.ndim == 1:
        return values[:max_len]
    return np.asarray(values, dtype=np.int64).reshape(-1)[:max_len]
