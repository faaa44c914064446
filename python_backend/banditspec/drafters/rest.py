"""REST (retrieval-based speculative decoding): continue the context as a token datastore does.

For the longest suffix of the context (``max_suffix`` down to ``min_suffix`` tokens) that
occurs in the datastore, the suffix array gives the range of its occurrences. Their
continuations sit next to each other in that range, sorted, so the most frequent
continuation is read greedily: at each position the largest group of equal next tokens
(a document end never counts) narrows the range, until ``max_len`` tokens, no
continuation, or a group whose share of the remaining matches is below ``min_share``.
At most ``max_matches`` occurrences are read (evenly spaced over the range).

Only the last ``max_suffix`` context tokens matter, so a proposal costs the same at any
context length: a binary search over the suffix length (a shorter suffix of a present one
is present) with O(m log N) comparisons each (in C when the text-search library loads:
TokenDatastore.longest_suffix), then vectorised counting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from banditspec.checks import is_int
from banditspec.drafters.base import Draft, DrafterTraits, draft_of, empty_draft, validated_max_len, validated_tokens
from banditspec.drafters.rest_datastore import TokenDatastore, load_datastore
from banditspec.errors import BanditSpecValidationError


class RestDrafter:
    """Holds the datastore (read-only, shared by all sessions)."""

    # an in-memory lookup, but a binary search over a large corpus whose memory has gone cold
    # after a target forward: several times a PLD or suffix lookup, so costaware asks it only
    # when it could beat the other cheap proposals
    traits = DrafterTraits(runs_inline=True, proposes_lazily=True)

    name = "rest"

    def __init__(
        self,
        datastore: Path | TokenDatastore,
        max_suffix: int = 16,
        min_suffix: int = 2,
        max_matches: int = 5000,
        min_share: float = 0.0,
    ):
        """datastore: a datastore folder from configuration (never from a request), or a loaded one."""
        for name, value, minimum in (("min_suffix", min_suffix, 1), ("max_suffix", max_suffix, min_suffix), ("max_matches", max_matches, 1)):
            if not is_int(value) or value < minimum:
                raise BanditSpecValidationError(name, f"must be an integer >= {minimum}, got {value!r}")
        if not isinstance(min_share, (int, float)) or not 0.0 <= min_share <= 1.0:
            raise BanditSpecValidationError("min_share", f"must be in [0, 1], got {min_share!r}")
        self.datastore = datastore if isinstance(datastore, TokenDatastore) else load_datastore(Path(datastore))
        self.datastore.native_search()  # loaded now, not in a request
        self.max_suffix = max_suffix
        self.min_suffix = min_suffix
        self.max_matches = max_matches
        self.min_share = float(min_share)

    def start(self, prompt_ids: Sequence[int]) -> RestSession:
        return RestSession(self, validated_tokens(prompt_ids, "prompt_ids"))

    def longest_match(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(m, lo, hi): the longest suffix of ``context`` in the datastore (m = 0: none) and its rows."""
        separator = self.datastore.separator
        context = context[max(0, len(context) - self.max_suffix) :]
        for i in range(len(context) - 1, -1, -1):
            if context[i] >= separator:  # an id unknown to the datastore: never part of a match
                context = context[i + 1 :]
                break
        return self.datastore.longest_suffix(context, self.min_suffix, self.max_suffix)

    def continuation(self, match_len: int, lo: int, hi: int, max_len: int) -> list[int]:
        """The most frequent continuation of the occurrences in suffix-array rows [lo, hi): in C
        when the text-search library loads (TokenDatastore.native_continuation), else here."""
        native = self.datastore.native_continuation(match_len, lo, hi, max_len, self.max_matches, self.min_share)
        return native if native is not None else self.continuation_python(match_len, lo, hi, max_len)

    def continuation_python(self, match_len: int, lo: int, hi: int, max_len: int) -> list[int]:
        """:meth:`continuation` without the text-search library (and its reference in the tests)."""
        store = self.datastore
        rows = np.arange(lo, hi) if hi - lo <= self.max_matches else np.linspace(lo, hi - 1, self.max_matches).astype(np.int64)
        # positions: int64 [n] corpus index of each occurrence's next token, sorted by continuation
        positions = store.suffix_array[rows].astype(np.int64) + match_len
        out: list[int] = []
        while len(out) < max_len and positions.size:
            if positions.size == 1:  # one occurrence left: copy its document up to the separator
                segment = store.tokens[positions[0] : positions[0] + max_len - len(out)]
                ends = np.flatnonzero(segment == store.separator)
                out.extend(segment[: ends[0] if ends.size else segment.size].tolist())
                break
            next_tokens = store.tokens[positions]  # non-decreasing: the rows are sorted
            starts = np.flatnonzero(np.concatenate(([True], next_tokens[1:] != next_tokens[:-1])))
            sizes = np.diff(np.append(starts, next_tokens.size))
            sizes[next_tokens[starts] == store.separator] = 0
            group = int(np.argmax(sizes))  # first maximum: the smallest token id on ties
            if sizes[group] == 0 or sizes[group] < self.min_share * positions.size:
                break
            out.append(int(next_tokens[starts[group]]))
            positions = positions[starts[group] : starts[group] + sizes[group]] + 1
        return out


class RestSession:
    """One request: only the last ``max_suffix`` context tokens are kept."""

    def __init__(self, drafter: RestDrafter, prompt_ids: list[int]):
        self._drafter = drafter
        self._tail: list[int] = prompt_ids[-drafter.max_suffix :]

    def propose(self, max_len: int) -> Draft:
        max_len = validated_max_len(max_len)
        if max_len == 0:
            return empty_draft()
        m, lo, hi = self._drafter.longest_match(self._tail)
        if m == 0:
            return empty_draft()
        tokens = self._drafter.continuation(m, lo, hi, max_len)
        return draft_of(tokens, match_len=m) if tokens else empty_draft()

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        tail = self._tail + validated_tokens(new_tokens, "new_tokens")
        self._tail = tail[-self._drafter.max_suffix :]

    def close(self, finished: bool) -> None:
        self._tail = []
