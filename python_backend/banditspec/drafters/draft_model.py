"""Drafter ``draft``: a separate small draft engine, reached through named tensors.

On the TensorRT-LLM deployment the parametric arm is a plain draft engine (the Eagle head
needs the reference engine's hidden states). Each proposal is one generation call of
``max_len`` tokens over the whole context, the same stateless contract as ``target``;
the draft engine's own KV-cache reuse keeps that cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from banditspec.drafters.base import Draft, DrafterTraits
from banditspec.engine.tensor_codec import InferFn


class DraftModelSession:
    def __init__(self, drafter: DraftModelDrafter, prompt_ids: Sequence[int]):
        self._drafter = drafter
        self._context = [int(t) for t in prompt_ids]

    def propose(self, max_len: int) -> Draft:
        if max_len <= 0:
            return Draft()
        ids = np.asarray(self._context, dtype=np.int32).reshape(1, -1)
        tensors = {
            "input_ids": ids,
            "input_lengths": np.array([[ids.shape[1]]], dtype=np.int32),
            "request_output_len": np.array([[max_len]], dtype=np.int32),
            "end_id": np.array([[self._drafter.end_id]], dtype=np.int32),
            "exclude_input_in_output": np.array([[True]], dtype=bool),
        }
        out = self._drafter.infer(self._drafter.model_name, tensors, ["output_ids", "sequence_length"])
        tokens = np.asarray(out["output_ids"]).reshape(-1)
        if "sequence_length" in out:
            tokens = tokens[: int(np.asarray(out["sequence_length"]).reshape(-1)[0])]
        return Draft(token_ids=tokens[:max_len].astype(np.int32))

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        self._context.extend(int(t) for t in new_tokens)

    def close(self, finished: bool) -> None:
        self._context = []


class DraftModelDrafter:
    name = "draft"
    traits = DrafterTraits(costly=True)  # a model call per proposal, through BLS (the deadline thread)

    def __init__(self, infer: InferFn, *, model_name: str = "draft", end_id: int):
        self.infer = infer
        self.model_name = model_name
        self.end_id = end_id

    def start(self, prompt_ids: Sequence[int]) -> DraftModelSession:
        return DraftModelSession(self, prompt_ids)
