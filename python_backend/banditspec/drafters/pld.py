"""Prompt lookup decoding (PLD): copy what followed the last earlier occurrence of the context's tail.

For n from ``max_ngram`` down to ``min_ngram``, the last n tokens of the context
(prompt + everything observed) are looked up in a hash index
``n-gram -> position right after its most recent occurrence that already has a
continuation``; the first hit proposes ``context[pos : pos + max_len]``.

The index is updated incrementally: appending the token at position i registers the
n-grams that end just before i (their continuation now starts at i). A proposal is
``max_ngram`` dictionary lookups plus one slice of at most ``max_len`` tokens,
independent of the context length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from banditspec.checks import is_int
from banditspec.drafters.base import (
    TEXT_LOOKUP,
    Draft,
    draft_of,
    empty_draft,
    validated_max_len,
    validated_tokens,
)
from banditspec.errors import BanditSpecValidationError


@dataclass
class PromptLookupDrafter:
    """Stateless factory of :class:`PromptLookupSession` (safe to share between requests)."""

    traits = TEXT_LOOKUP  # a class attribute, not a field

    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "pld"

    def __post_init__(self) -> None:
        if not is_int(self.min_ngram) or self.min_ngram < 1:
            raise BanditSpecValidationError("min_ngram", f"must be an integer >= 1, got {self.min_ngram!r}")
        if not is_int(self.max_ngram) or self.max_ngram < self.min_ngram:
            raise BanditSpecValidationError("max_ngram", f"must be an integer >= min_ngram ({self.min_ngram}), got {self.max_ngram!r}")

    def start(self, prompt_ids: Sequence[int]) -> PromptLookupSession:
        return PromptLookupSession(self.max_ngram, self.min_ngram, validated_tokens(prompt_ids, "prompt_ids"))


class PromptLookupSession:
    """One request's context and its n-gram index."""

    def __init__(self, max_ngram: int, min_ngram: int, prompt_ids: list[int]):
        self._max_ngram = max_ngram
        self._min_ngram = min_ngram
        self._tokens: list[int] = []
        # (t_1, ..., t_n) -> index of the token that followed its most recent occurrence
        self._next_pos: dict[tuple[int, ...], int] = {}
        self._append(prompt_ids)

    @property
    def context_len(self) -> int:
        return len(self._tokens)

    def _append(self, new_tokens: list[int]) -> None:
        tokens = self._tokens
        index = self._next_pos
        for token in new_tokens:
            pos = len(tokens)  # the n-grams ending at pos - 1 now have a continuation
            tokens.append(token)
            for n in range(self._min_ngram, min(self._max_ngram, pos) + 1):
                index[tuple(tokens[pos - n : pos])] = pos

    def propose(self, max_len: int) -> Draft:
        max_len = validated_max_len(max_len)
        tokens = self._tokens
        if max_len == 0:
            return empty_draft()
        for n in range(min(self._max_ngram, len(tokens)), self._min_ngram - 1, -1):
            pos = self._next_pos.get(tuple(tokens[-n:]))
            if pos is not None:
                return draft_of(tokens[pos : pos + max_len], match_len=n)
        return empty_draft()

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        self._append(validated_tokens(new_tokens, "new_tokens"))

    def close(self, finished: bool) -> None:
        self._tokens = []
        self._next_pos = {}
