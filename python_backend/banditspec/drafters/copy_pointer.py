"""Copy pointer: keep copying from where the output last copied the context, and after an
edit pick the copy up again further along.

Edit traffic (rewrite this function, fix this paragraph) produces long runs that copy the
prompt in order, broken by short edits. Prompt lookup proposes what followed the most recent
occurrence of the context's last n-gram, the suffix drafter what followed the longest match
anywhere: in code, where short n-grams (``self.``, ``(x)``, indentation) recur all over the
prompt, both may jump to another place. This drafter follows the copy instead:

* **Copying**: a pointer into the context holds the position the next token is expected to
  copy. Each observed token equal to it moves the pointer one on; the proposal is the
  context from the pointer, its ``match_len`` the anchoring n-gram plus the tokens copied
  since (the controller's confidence context, as PLD's n-gram length).
* **An edit** (a token that differs) drops the pointer. After each token the context's last
  ``ngram`` tokens are looked up among their earlier occurrences (an index n-gram ->
  positions after it, kept as tokens arrive); the pointer goes to the first occurrence past
  the last position copied (the copy goes on forward), else to the first occurrence.

As a fixed arm alone it is weaker than suffix: its value is in what it adds to costaware's
other arms, mostly on code edits (experiments/copy_pointer_study.py replays it with and without;
``ngram`` 2 replays better than 1 or 3). Neither a window around the broken copy nor a guess
during an edit (that it replaced as many tokens as it produced) added anything, so neither is
here.

Costs: observing a token is O(1) while copying, a dictionary append and a binary search
over the tail n-gram's occurrences otherwise; a proposal is one slice.
"""

from __future__ import annotations

from bisect import bisect_right
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
class CopyPointerDrafter:
    """Stateless factory of :class:`CopyPointerSession` (safe to share between requests).

    ngram: how many of the context's last tokens re-anchor a broken copy."""

    traits = TEXT_LOOKUP  # a class attribute, not a field

    ngram: int = 2
    name: str = "copy"

    def __post_init__(self) -> None:
        if not is_int(self.ngram) or self.ngram < 1:
            raise BanditSpecValidationError("ngram", f"must be an integer >= 1, got {self.ngram!r}")

    def start(self, prompt_ids: Sequence[int]) -> CopyPointerSession:
        return CopyPointerSession(self.ngram, validated_tokens(prompt_ids, "prompt_ids"))


class CopyPointerSession:
    """One request's context, its n-gram occurrences and the copy pointer."""

    def __init__(self, ngram: int, prompt_ids: list[int]):
        self._n = ngram
        self._tokens: list[int] = []
        # (t_1, ..., t_n) -> ascending positions q with tokens[q - n : q] == key (q < len: a continuation exists)
        self._after: dict[tuple[int, ...], list[int]] = {}
        self._src: int | None = None  # the context position the next token is expected to copy
        self._run = 0  # tokens copied since the pointer was (re)anchored
        self._last_src = 0  # where the copy has got to in the context
        for token in prompt_ids:
            self._push(token)
        self._anchor()  # a prompt whose tail occurred before in it (a repeated line)

    @property
    def context_len(self) -> int:
        return len(self._tokens)

    def _push(self, token: int) -> None:
        tokens, n = self._tokens, self._n
        pos = len(tokens)  # the n-gram ending at pos - 1 now has a continuation (this token)
        tokens.append(token)
        if pos >= n:
            self._after.setdefault(tuple(tokens[pos - n : pos]), []).append(pos)

    def _anchor(self) -> None:
        """Point at the first occurrence of the context's last n tokens past the last
        position copied, else at their first occurrence (None: they never occurred)."""
        found = self._after.get(tuple(self._tokens[-self._n :])) if len(self._tokens) >= self._n else None
        self._src, self._run = None, 0
        if found:
            i = bisect_right(found, self._last_src)
            self._src = self._last_src = found[i] if i < len(found) else found[0]

    def _observe_one(self, token: int) -> None:
        src = self._src
        self._push(token)
        if src is not None and self._tokens[src] == token:
            self._src, self._run, self._last_src = src + 1, self._run + 1, src + 1
        else:  # not copying, or an edit: the copy broke here
            self._anchor()

    def propose(self, max_len: int) -> Draft:
        max_len = validated_max_len(max_len)
        if max_len == 0 or self._src is None:
            return empty_draft()
        return draft_of(self._tokens[self._src : self._src + max_len], match_len=self._n + self._run)

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        for token in validated_tokens(new_tokens, "new_tokens"):
            self._observe_one(token)

    def close(self, finished: bool) -> None:
        self._tokens, self._after = [], {}
        self._src = None
