"""Banned token sequences ("bad words"): their tensor form and their effect on the target.

A banned sequence ``w`` of ``n`` tokens forbids the token that would complete it: at a
position whose preceding ``n - 1`` tokens are ``w[:-1]``, token ``w[-1]`` gets probability 0
(a one-token word is banned everywhere). The preceding tokens are the whole sequence so far,
the prompt and any draft tokens before the position included, so a banned sequence is
applied to the target's distribution the same way whether a position is decoded plainly or
verified inside a draft: a draft token that would complete one is rejected like any other
token the target gives no mass.

Tensor form: TensorRT-LLM's ``bad_words_list``, int32 ``[2, N]`` per sequence: row 0 the words'
token ids one after another, row 1 the cumulative end offset of each word; row 0 is padded
with 0 and row 1 with -1 (as TensorRT-LLM's preprocessing writes it), so several sequences'
lists stack to ``[B, 2, N]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from banditspec.errors import BanditSpecValidationError

BadWords = tuple[tuple[int, ...], ...]
FIELD = "bad_words_list"


def canonical(words: Sequence[Sequence[int]] | None) -> BadWords:
    """``words`` as a tuple of non-empty int tuples (empty words dropped, as upstream's preprocessing does)."""
    return tuple(tuple(int(t) for t in word) for word in (words or ()) if len(word))


def to_word_list(words: Sequence[Sequence[int]], width: int | None = None) -> np.ndarray:
    """int32 [2, width] in the offsets form (width: at least the total token count, and at least 1)."""
    words = canonical(words)
    flat = [t for word in words for t in word]
    offsets = np.cumsum([len(word) for word in words]).tolist() if words else []
    width = max(1, len(flat), width or 0)
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def from_word_list(value: np.ndarray | None, *, where: str = "") -> BadWords:
    """The words of one sequence's ``[2, N]`` offsets form (a leading batch dimension of 1 is
    allowed); BanditSpecValidationError naming ``bad_words_list`` when it is malformed."""
    if value is None or np.size(value) == 0:
        return ()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.integer):
        raise BanditSpecValidationError(FIELD, f"must be integers, got {array.dtype}{where}")
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[0] != 2:
        raise BanditSpecValidationError(FIELD, f"must have shape [2, N], got {list(np.shape(value))}{where}")
    flat, offsets = array[0].astype(np.int64), array[1].astype(np.int64)
    ends = offsets[: int(np.argmax(offsets < 0))] if (offsets < 0).any() else offsets
    if (offsets[len(ends):] >= 0).any():
        raise BanditSpecValidationError(FIELD, f"offsets must end in -1 padding only{where}")
    words: list[tuple[int, ...]] = []
    start = 0
    for end in ends.tolist():
        if not start < end <= flat.size:
            raise BanditSpecValidationError(
                FIELD, f"offsets must increase and stay within the {flat.size} token ids{where}")
        words.append(tuple(int(t) for t in flat[start:end]))
        start = end
    return tuple(words)


def check_tokens(words: BadWords, vocab_size: int) -> None:
    """Every banned token must lie in the vocabulary, and some token must stay allowed
    (else no distribution is left to decode from)."""
    for word in words:
        if any(not 0 <= t < vocab_size for t in word):
            raise BanditSpecValidationError(FIELD, f"token ids must lie in [0, {vocab_size})")
    if len({word[-1] for word in words}) >= vocab_size:
        raise BanditSpecValidationError(FIELD, "bans every token of the vocabulary")


def banned_at(context: Sequence[int], words: BadWords) -> list[int]:
    """Tokens that would complete a banned word right after ``context`` (which need only
    hold its last ``longest word - 1`` tokens)."""
    banned = []
    for word in words:
        prefix = len(word) - 1
        if prefix == 0 or (len(context) >= prefix and tuple(context[len(context) - prefix:]) == word[:-1]):
            banned.append(word[-1])
    return banned


def mask_banned(logits: torch.Tensor, input_ids: np.ndarray, draft_ids: np.ndarray, words: BadWords) -> torch.Tensor:
    """``logits`` [gamma + 1, vocab] (row i decides the token after input_ids + draft_ids[:i])
    with every banned token of each row at -inf; ``logits`` itself when nothing is banned."""
    if not words:
        return logits
    longest = max(len(word) for word in words)
    keep = min(len(input_ids), longest - 1)
    tail = [int(t) for t in input_ids[len(input_ids) - keep:]] if keep else []
    masked = None
    for i in range(logits.shape[0]):
        context = tail + [int(t) for t in draft_ids[:i]]
        banned = banned_at(context, words)
        if banned:
            if masked is None:
                masked = logits.clone()
            masked[i, banned] = float("-inf")
    return logits if masked is None else masked
