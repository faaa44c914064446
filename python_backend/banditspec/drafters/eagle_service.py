"""The Eagle head as a service: the logic of the ``eagle`` Triton model, without Triton.

The ``banditspec`` controller reaches the head through BLS (``drafters/eagle_remote.py``);
this module keeps one :class:`~banditspec.drafters.eagle.EagleSession` per sequence, in a
bounded least-recently-used table, so that a call carries only what is new since the last
one (a few tokens and their target features), never the whole sequence.

One call (:class:`EagleCall`), in this order:

1. ``prompt_ids`` present: start the sequence afresh (a known id is replaced);
   absent: the sequence must be known (else ``sequence_id`` is named in the error:
   it was never started, already ended, or evicted by newer sequences);
2. ``new_tokens`` / ``hidden_states``: what the target produced since the last call
   (``EagleSession.observe`` semantics, several steps concatenated);
3. ``end``: forget the sequence (no draft); otherwise
4. propose up to ``max_draft_len`` tokens.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from banditspec.drafters.eagle import EagleDrafter, EagleSession
from banditspec.engine.tensor_codec import scalar_input
from banditspec.errors import BanditSpecValidationError


@dataclass
class EagleCall:
    """One request to the ``eagle`` model.

    sequence_id:   uint64, chosen by the caller (random per request)
    prompt_ids:    int32 [T] or None: starts the sequence
    new_tokens:    int32 [n]: tokens appended since the last call (may be empty)
    hidden_states: float32 [m, hidden] or None: the target features that came with them
    max_draft_len: int >= 0: tokens to propose (0: observe only)
    end:           forget the sequence
    """

    sequence_id: int
    prompt_ids: np.ndarray | None = None
    new_tokens: np.ndarray | None = None
    hidden_states: np.ndarray | None = None
    max_draft_len: int = 0
    end: bool = False


# The model's inputs, in config.pbtxt order.
EAGLE_INPUTS = ("sequence_id", "prompt_ids", "input_ids", "hidden_states", "max_draft_len", "end")


def call_from_tensors(tensors: Mapping[str, np.ndarray]) -> EagleCall:
    """An :class:`EagleCall` from the model's input tensors (absent optional ones: defaults)."""
    sequence_id = scalar_input(tensors, "sequence_id", None, int)
    if sequence_id is None:
        raise BanditSpecValidationError("sequence_id", "is required")

    def ids(name: str) -> np.ndarray | None:
        return None if tensors.get(name) is None else np.asarray(tensors[name]).reshape(-1)

    hidden = tensors.get("hidden_states")
    return EagleCall(
        sequence_id=sequence_id,
        prompt_ids=ids("prompt_ids"),
        new_tokens=ids("input_ids"),
        hidden_states=None if hidden is None else np.asarray(hidden, dtype=np.float32),
        max_draft_len=scalar_input(tensors, "max_draft_len", 0, int),
        end=scalar_input(tensors, "end", False, bool),
    )


class EagleService:
    """Sessions of one shared :class:`EagleDrafter`, at most ``max_sequences`` of them."""

    def __init__(self, drafter: EagleDrafter, *, max_sequences: int = 64, max_draft_len: int = 16):
        if isinstance(max_sequences, bool) or int(max_sequences) < 1:
            raise BanditSpecValidationError("max_sequences", f"must be >= 1, got {max_sequences!r}")
        if isinstance(max_draft_len, bool) or int(max_draft_len) < 0:
            raise BanditSpecValidationError("max_draft_len", f"must be >= 0, got {max_draft_len!r}")
        self.drafter = drafter
        self.max_sequences = int(max_sequences)
        self.max_draft_len = int(max_draft_len)
        self._sessions: OrderedDict[int, EagleSession] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0  # sequences dropped to make room (a caller then loses its eagle arm)

    def __len__(self) -> int:
        return len(self._sessions)

    def handle(self, call: EagleCall) -> np.ndarray:
        """draft_ids: int32 [<= max_draft_len] (empty when ``end`` or nothing to propose)."""
        max_len = self._validated(call)
        session = self._session_for(call)
        session.observe([] if call.new_tokens is None else call.new_tokens, call.hidden_states)
        if call.end:
            self._forget(call.sequence_id)
            return np.zeros(0, dtype=np.int32)
        return session.propose(max_len).token_ids.astype(np.int32)

    # --- internals -------------------------------------------------------------------
    def _validated(self, call: EagleCall) -> int:
        if isinstance(call.sequence_id, bool) or not 0 <= int(call.sequence_id) < 2**64:
            raise BanditSpecValidationError("sequence_id", "must be an unsigned 64-bit integer")
        max_len = int(call.max_draft_len)
        if not 0 <= max_len <= self.max_draft_len:
            raise BanditSpecValidationError("max_draft_len", f"must be in [0, {self.max_draft_len}], got {max_len}")
        for name in ("prompt_ids", "new_tokens"):
            value = getattr(call, name)
            if value is not None and np.asarray(value).ndim != 1:
                raise BanditSpecValidationError(name, f"expected a 1-D list of token ids, got shape {np.asarray(value).shape}")
        return max_len

    def _session_for(self, call: EagleCall) -> EagleSession:
        key = int(call.sequence_id)
        with self._lock:
            if call.prompt_ids is not None:
                old = self._sessions.pop(key, None)
                if old is not None:
                    old.close(finished=False)
                session = self.drafter.start(call.prompt_ids)  # validates the ids
                self._sessions[key] = session
                while len(self._sessions) > self.max_sequences:
                    _, evicted = self._sessions.popitem(last=False)
                    evicted.close(finished=False)
                    self.evicted += 1
                return session
            known = self._sessions.get(key)
            if known is None:
                raise BanditSpecValidationError(
                    "sequence_id", f"unknown sequence {key}: never started (send prompt_ids), "
                    "already ended, or evicted by newer sequences (raise max_sequences)")
            self._sessions.move_to_end(key)
            return known

    def _forget(self, key: int) -> None:
        with self._lock:
            session = self._sessions.pop(int(key), None)
        if session is not None:
            session.close(finished=True)
