"""Drafter ``eagle`` reached through named tensors: the head runs in the ``eagle`` Triton model.

Same arm, same proposals as the in-process :mod:`banditspec.drafters.eagle`; the head lives
in its own model (one copy for every controller instance, its own thread pool, its own
metrics). A session buffers what it observes and ships it with the next proposal, so an
arm that is not chosen costs no call; the first call carries the prompt and starts the
sequence, ``close`` ends it. Tensors (``model_repository/eagle/config.pbtxt``):

    sequence_id    UINT64 [1]        random per request
    prompt_ids     INT32  [T]        first call only
    input_ids      INT32  [n]        tokens observed since the last call
    hidden_states  FP32   [m, F]     their target features (optional; F = 3H for EAGLE-3)
    max_draft_len  INT32  [1]
    end            BOOL   [1]        last call
    -> draft_ids   INT32  [<= max_draft_len]
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import numpy as np

from banditspec.drafters.base import Draft, DrafterTraits
from banditspec.eagle.probe import FirstTokenProbe
from banditspec.engine.tensor_codec import InferFn

log = logging.getLogger(__name__)

EAGLE_OUTPUTS = ("draft_ids",)


class RemoteEagleSession:
    def __init__(self, drafter: RemoteEagleDrafter, prompt_ids: Sequence[int]):
        self._drafter = drafter
        self.sequence_id = secrets.randbits(63)
        self._prompt: np.ndarray | None = np.asarray(prompt_ids, dtype=np.int32).reshape(-1)
        self._tokens: list[int] = []
        self._hidden: list[np.ndarray] = []
        self._features_lost = False  # a step came without features: the head can no longer follow
        self._last_row: np.ndarray | None = None  # the target's latest feature row (the probe's input)
        self._started = False
        self._closed = False

    def propose(self, max_len: int) -> Draft:
        if max_len <= 0 or self._closed or self._features_lost:
            return Draft()
        out = self._call(max_len=max_len, end=False)
        return Draft(token_ids=np.asarray(out["draft_ids"], dtype=np.int32).reshape(-1)[:max_len])

    def hint(self) -> float | None:
        """The probe's P(a proposal now starts with a token the target accepts), with no call
        (drafters.base); None without a probe; 0.0 when the head cannot draft now (no
        features yet: before the first step's, the model would decline)."""
        probe = self._drafter.probe
        if probe is None:
            return None
        if self._closed or self._features_lost or self._last_row is None:
            return 0.0
        return probe(self._last_row)

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        if self._closed:
            return
        self._tokens.extend(int(t) for t in new_tokens)
        if hidden_states is None:
            self._features_lost = True
        elif not self._features_lost:
            rows = np.asarray(hidden_states, dtype=np.float32)
            self._hidden.append(rows)
            if rows.ndim == 2 and len(rows):
                self._last_row = np.array(rows[-1])

    def close(self, finished: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:  # free the model's session now rather than by eviction
            try:
                self._call(max_len=0, end=True)
            except Exception as exc:  # the request is over; the model evicts it anyway
                log.debug("eagle: ending sequence failed: %s", exc)

    def _call(self, *, max_len: int, end: bool) -> dict:
        tensors: dict[str, np.ndarray] = {
            "sequence_id": np.array([self.sequence_id], dtype=np.uint64),
            "input_ids": np.asarray(self._tokens, dtype=np.int32),
            "max_draft_len": np.array([max_len], dtype=np.int32),
            "end": np.array([end], dtype=bool),
        }
        if not self._started and self._prompt is not None:  # the first call carries the prompt
            tensors["prompt_ids"] = self._prompt
        if self._hidden:
            tensors["hidden_states"] = np.concatenate(self._hidden, axis=0)  # [m, H]
        out = self._drafter.infer(self._drafter.model_name, tensors, list(EAGLE_OUTPUTS))
        self._started, self._prompt = True, None
        self._tokens, self._hidden = [], []
        return out


class RemoteEagleDrafter:
    """The ``eagle`` arm over BLS; ``infer(model, tensors, outputs)`` is the controller's BLS call."""

    name = "eagle"

    def __init__(self, infer: InferFn, *, model_name: str = "eagle", feature_layers: Sequence[int] = (),
                 prompt_window: int | None = None, probe: FirstTokenProbe | None = None):
        """feature_layers: the target states the head reads (VerifyRequest.hidden_layers;
        () = the last post-norm state), as the served head's JSON says; prompt_window: the
        served head's window on the prompt (None: it reads the whole prompt), so that the
        target is asked for those positions' states only and only they travel over BLS;
        probe: the served head's first-token probe (None: sessions give no hint)."""
        self.infer = infer
        self.model_name = model_name
        self.traits = DrafterTraits(costly=True, needs_hidden_states=True, prompt_window=prompt_window,
                                    feature_layers=tuple(int(a) for a in feature_layers))
        self.probe = probe

    def start(self, prompt_ids: Sequence[int]) -> RemoteEagleSession:
        return RemoteEagleSession(self, prompt_ids)
