"""SuffixDecoding-style drafter: frequency-scored suffix tries over this request and past outputs.

A :class:`SuffixTrie` counts every substring of length <= ``max_depth`` of the sequences it
holds: ``count(s)`` = number of occurrences of s. Two tries serve a request:

* a per-request trie over prompt + output, extended token by token in ``observe``;
* a global trie over the outputs of finished requests, shared by all sessions, bounded by a
  token budget (the oldest sequences are evicted) and guarded by a lock.

Proposal: take the longest suffix of the context (m tokens, m <= max_depth - max_len) that
occurred before with a continuation, then follow the most frequent child greedily for at
most ``ceil(alpha * m)`` tokens, stopping when the chosen child's share of its siblings'
counts falls below ``min_share``. Each trie proposes; the draft with the higher score
(sum over positions of the product of shares = expected accepted length under the counts)
wins, the per-request one on ties.

Compact representation: a path that only one occurrence takes is not expanded. Its first
node is a *tail* (count 1) that remembers where that occurrence continues in its sequence
(``tail_seq[tail_pos:]``); it is expanded one level at a time when a second occurrence
arrives. Appending a token therefore only touches the explicit nodes on the context's
current suffixes (about as many as the longest repeated suffix is long), and the trie has
about (sequence length x mean repeat length) nodes instead of length x depth.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

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

NO_NODE = -1
_KEY_STRIDE = 2**31  # child key = parent id * stride + token id (ids are int32)


@dataclass
class Proposal:
    """A draft from one trie and how much the counts trust it."""

    tokens: list[int]
    score: float  # sum over positions of the product of the shares up to it


class SuffixTrie:
    """Counts of all substrings (length <= max_depth) of the sequences added to it. Not thread-safe.

    Nodes are int ids into flat int32 arrays (no Python object per node: compact, and
    invisible to the garbage collector). Node ``n`` spells ``depth[n]`` tokens and occurs
    ``count[n]`` times; ``total[n]`` is the sum of its children's counts, ``best[n]`` its
    most frequent child (NO_NODE: no child, or stale after a decrement), children are a
    doubly linked sibling list (first/next/prev) plus the ``_children`` hash for lookup.
    A tail has ``tail_seq[n]`` >= 0: its one occurrence continues at
    ``sequence(tail_seq[n])[tail_pos[n]:]``.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self._token, self._depth, self._count, self._total = array("i"), array("i"), array("i"), array("i")
        self._best, self._first, self._next, self._prev = array("i"), array("i"), array("i"), array("i")
        self._tail_seq, self._tail_pos = array("i"), array("i")
        self._children: dict[int, int] = {}
        self._sequences: dict[int, Sequence[int]] = {}
        self._next_sequence_id = 0
        self._free: list[int] = []
        self.root = self._new_node(0, 0, NO_NODE, 0)
        self._count[self.root] = 0

    @property
    def num_nodes(self) -> int:
        return len(self._token) - len(self._free)

    def add_sequence(self, seq: Sequence[int]) -> int:
        """Register a sequence (kept by reference; it may only ever be appended to); returns its id."""
        seq_id = self._next_sequence_id
        self._next_sequence_id += 1
        self._sequences[seq_id] = seq
        return seq_id

    def sequence(self, seq_id: int) -> Sequence[int]:
        return self._sequences[seq_id]

    # ------------------------------------------------------------------ nodes
    def _new_node(self, token: int, depth: int, tail_seq: int, tail_pos: int) -> int:
        """A childless node with count 1 (a tail when tail_seq >= 0)."""
        if self._free:
            node = self._free.pop()
            self._token[node], self._depth[node], self._count[node], self._total[node] = token, depth, 1, 0
            self._best[node] = self._first[node] = self._next[node] = self._prev[node] = NO_NODE
            self._tail_seq[node], self._tail_pos[node] = tail_seq, tail_pos
            return node
        self._token.append(token)
        self._depth.append(depth)
        self._count.append(1)
        self._total.append(0)
        self._best.append(NO_NODE)
        self._first.append(NO_NODE)
        self._next.append(NO_NODE)
        self._prev.append(NO_NODE)
        self._tail_seq.append(tail_seq)
        self._tail_pos.append(tail_pos)
        return len(self._token) - 1

    def _better(self, a: int, b: int) -> bool:
        """Ranking of siblings: higher count first, then smaller token id (canonical tie-break)."""
        count = self._count
        return count[a] > count[b] or (count[a] == count[b] and self._token[a] < self._token[b])

    def _link(self, parent: int, child: int) -> None:
        self._children[parent * _KEY_STRIDE + self._token[child]] = child
        first = self._first[parent]
        self._next[child], self._prev[child] = first, NO_NODE
        if first != NO_NODE:
            self._prev[first] = child
        self._first[parent] = child
        self._total[parent] += self._count[child]
        best = self._best[parent]
        if best == NO_NODE:
            if first == NO_NODE:  # the only child
                self._best[parent] = child
        elif self._better(child, best):
            self._best[parent] = child

    def _unlink(self, parent: int, child: int) -> None:
        del self._children[parent * _KEY_STRIDE + self._token[child]]
        before, after = self._prev[child], self._next[child]
        if before != NO_NODE:
            self._next[before] = after
        else:
            self._first[parent] = after
        if after != NO_NODE:
            self._prev[after] = before
        self._total[parent] -= self._count[child]
        if self._best[parent] == child:
            self._best[parent] = NO_NODE

    def _free_subtree(self, node: int) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            child = self._first[current]
            while child != NO_NODE:
                del self._children[current * _KEY_STRIDE + self._token[child]]
                stack.append(child)
                child = self._next[child]
            self._free.append(current)

    def children(self, node: int) -> dict[int, int]:
        """{token: child id} (for inspection and tests)."""
        out = {}
        child = self._first[node]
        while child != NO_NODE:
            out[self._token[child]] = child
            child = self._next[child]
        return out

    def depth(self, node: int) -> int:
        return self._depth[node]

    # ------------------------------------------------------------------ building
    def extend(self, active: list[int], seq_id: int, end: int) -> list[int]:
        """Count the substrings of sequence ``seq_id`` that end with its token at ``end - 1``.

        Call it for end = 1, 2, ... in order. active: the explicit nodes of the suffixes of
        ``seq[:end - 1]`` shorter than max_depth (deepest first), as returned by the previous
        call (``[]`` for end = 1). Returns those of ``seq[:end]``.
        """
        token = self._sequences[seq_id][end - 1]
        children, depth, count, total, best = self._children, self._depth, self._count, self._total, self._best
        next_active: list[int] = []
        for node in (*active, self.root):
            child = children.get(node * _KEY_STRIDE + token)
            if child is None:  # a new substring: its one occurrence continues at seq[end:]
                self._link(node, self._new_node(token, depth[node] + 1, seq_id, end))
                continue
            if self._tail_seq[child] != NO_NODE:
                self._expand(child)
            count[child] += 1
            total[node] += 1
            if best[node] != NO_NODE and best[node] != child and self._better(child, best[node]):
                best[node] = child
            if depth[child] < self.max_depth:
                next_active.append(child)
        return next_active

    def _expand(self, tail: int) -> None:
        """Make a tail explicit: its one occurrence moves into a new tail child.

        That occurrence ended before the one now arriving, so its next token is already
        in its sequence (unless the sequence ended there).
        """
        seq_id, pos = self._tail_seq[tail], self._tail_pos[tail]
        self._tail_seq[tail] = NO_NODE
        seq = self._sequences[seq_id]
        if self._depth[tail] < self.max_depth and pos < len(seq):
            self._link(tail, self._new_node(seq[pos], self._depth[tail] + 1, seq_id, pos + 1))

    def insert(self, seq: Sequence[int]) -> int:
        """Count all substrings of a complete sequence (kept by reference: do not mutate it); returns its id."""
        seq_id = self.add_sequence(seq)
        active: list[int] = []
        for end in range(1, len(seq) + 1):
            active = self.extend(active, seq_id, end)
        return seq_id

    def remove(self, seq_id: int) -> None:
        """Uncount a sequence added by :meth:`insert`."""
        seq = self._sequences.pop(seq_id)
        children, count, total, best = self._children, self._count, self._total, self._best
        for start in range(len(seq)):
            node = self.root
            for token in seq[start : start + self.max_depth]:
                child = children[node * _KEY_STRIDE + token]
                total[node] -= 1
                count[child] -= 1
                if count[child] == 0:  # its only occurrence was this one (a tail or not)
                    self._unlink(node, child)
                    self._free_subtree(child)
                    break
                if best[node] == child:
                    best[node] = NO_NODE  # may no longer be the most frequent: recomputed when needed
                node = child

    # ------------------------------------------------------------------ reading
    def best_child(self, node: int) -> int:
        best = self._best[node]
        if best == NO_NODE and self._first[node] != NO_NODE:
            child = best = self._first[node]
            while child != NO_NODE:
                if self._better(child, best):
                    best = child
                child = self._next[child]
            self._best[node] = best
        return best

    def locate(self, pattern: Sequence[int]) -> tuple[int, int] | None:
        """Where ``pattern`` ends: (node, k) = k tokens past ``node`` along its tail; None if absent."""
        node, k = self.root, 0
        for token in pattern:
            seq_id = self._tail_seq[node]
            if seq_id != NO_NODE:
                seq, pos = self._sequences[seq_id], self._tail_pos[node] + k
                if pos >= len(seq) or seq[pos] != token:
                    return None
                k += 1
                continue
            child = self._children.get(node * _KEY_STRIDE + token)
            if child is None:
                return None
            node = child
        return node, k

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (0 < len <= max_depth) in the sequences held."""
        where = self.locate(pattern)
        return 0 if where is None else self._count[where[0]]

    def has_continuation(self, node: int, k: int) -> bool:
        seq_id = self._tail_seq[node]
        if seq_id != NO_NODE:
            return self._tail_pos[node] + k < len(self._sequences[seq_id])
        return self._total[node] > 0

    def deepest_repeated(self, active: list[int], max_match: int) -> int:
        """The deepest node of ``active`` (depth <= max_match) with a continuation, else NO_NODE."""
        for node in active:  # deepest first
            if self._depth[node] <= max_match and self._total[node] > 0:
                return node
        return NO_NODE

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[int, int, int]:
        """(m, node, k): the longest suffix of ``context`` (m <= max_match) held with a continuation.

        Binary search on m: a shorter suffix of a held substring is held too.
        """
        lo, lo_where = 0, (self.root, 0)
        hi = min(max_match, len(context))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            where = self.locate(context[len(context) - mid :])
            if where is not None and self.has_continuation(*where):
                lo, lo_where = mid, where
            else:
                hi = mid - 1
        return lo, lo_where[0], lo_where[1]

    def walk(self, node: int, k: int, max_tokens: int, min_share: float) -> Proposal:
        """Follow the most frequent continuation of (node, k) for at most ``max_tokens`` tokens."""
        tokens: list[int] = []
        score, prob = 0.0, 1.0
        while len(tokens) < max_tokens:
            seq_id = self._tail_seq[node]
            if seq_id != NO_NODE:  # one occurrence: its continuation, share 1
                start = self._tail_pos[node] + k
                rest = self._sequences[seq_id][start : start + max_tokens - len(tokens)]
                tokens.extend(rest)
                score += prob * len(rest)
                break
            child = self.best_child(node)
            if child == NO_NODE:
                break
            share = self._count[child] / self._total[node]
            if share < min_share:
                break
            prob *= share
            score += prob
            tokens.append(self._token[child])
            node = child
        return Proposal(tokens, score)


@dataclass
class SuffixTreeDrafter:
    """Shared by all requests: the global trie of past outputs lives here (thread-safe)."""

    traits = TEXT_LOOKUP  # a class attribute, not a field

    max_depth: int = 64
    alpha: float = 2.0
    min_share: float = 0.1
    max_global_tokens: int = 50_000  # ~0.85 KB of memory per token held
    name: str = "suffix"
    _global: SuffixTrie = field(init=False, repr=False)
    _outputs: deque = field(init=False, repr=False)  # (sequence id, length), oldest first
    _global_tokens: int = field(init=False, repr=False, default=0)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_int("max_depth", self.max_depth, 2)
        _check_int("max_global_tokens", self.max_global_tokens, 0)
        if not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha) or self.alpha <= 0:
            raise BanditSpecValidationError("alpha", f"must be a finite number > 0, got {self.alpha!r}")
        if not isinstance(self.min_share, (int, float)) or not 0.0 <= self.min_share <= 1.0:
            raise BanditSpecValidationError("min_share", f"must be in [0, 1], got {self.min_share!r}")
        self._global = SuffixTrie(self.max_depth)
        self._outputs = deque()
        self._lock = threading.Lock()

    def start(self, prompt_ids: Sequence[int]) -> SuffixTreeSession:
        return SuffixTreeSession(self, validated_tokens(prompt_ids, "prompt_ids"))

    @property
    def global_tokens(self) -> int:
        """Tokens held by the global trie (<= max_global_tokens)."""
        return self._global_tokens

    def add_output(self, output_ids: Sequence[int]) -> None:
        """Learn a finished request's output; evict the oldest outputs beyond the token budget."""
        seq = tuple(output_ids[max(0, len(output_ids) - self.max_global_tokens) :])
        if not seq:
            return
        with self._lock:
            while self._outputs and self._global_tokens + len(seq) > self.max_global_tokens:
                old_id, old_len = self._outputs.popleft()
                self._global.remove(old_id)
                self._global_tokens -= old_len
            self._outputs.append((self._global.insert(seq), len(seq)))
            self._global_tokens += len(seq)

    def global_count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` in the outputs the global trie holds."""
        with self._lock:
            return self._global.count(pattern)

    @property
    def global_nodes(self) -> int:
        return self._global.num_nodes

    def global_outputs(self) -> list[Sequence[int]]:
        """The outputs the global trie holds, oldest first."""
        with self._lock:
            return [self._global.sequence(seq_id) for seq_id, _ in self._outputs]

    def propose_global(self, context: Sequence[int], max_match: int, max_len: int) -> tuple[Proposal, int]:
        """(proposal, match length) from the global trie."""
        with self._lock:
            m, node, k = self._global.longest_match(context, max_match)
            if m == 0:
                return Proposal([], 0.0), 0
            limit = min(max_len, math.ceil(self.alpha * m))
            return self._global.walk(node, k, limit, self.min_share), m


def _check_int(name: str, value: int, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise BanditSpecValidationError(name, f"must be an integer >= {minimum}, got {value!r}")


class SuffixTreeSession:
    """One request: its own trie over prompt + output, plus read access to the global trie."""

    def __init__(self, drafter: SuffixTreeDrafter, prompt_ids: list[int]):
        self._drafter = drafter
        self._trie = SuffixTrie(drafter.max_depth)
        self._tokens: list[int] = []
        self._seq_id = self._trie.add_sequence(self._tokens)
        self._active: list[int] = []  # explicit nodes of the context's suffixes, deepest first
        self._prompt_len = len(prompt_ids)
        self._closed = False
        self._append(prompt_ids)

    @property
    def trie(self) -> SuffixTrie:
        return self._trie

    def _append(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            self._tokens.append(token)
            self._active = self._trie.extend(self._active, self._seq_id, len(self._tokens))

    def propose(self, max_len: int) -> Draft:
        max_len = validated_max_len(max_len)
        if max_len == 0 or self._closed:
            return empty_draft()
        drafter = self._drafter
        max_match = drafter.max_depth - min(max_len, drafter.max_depth - 1)
        best, match = Proposal([], 0.0), 0
        node = self._trie.deepest_repeated(self._active, max_match)
        if node != NO_NODE:  # the longest suffix that occurred before in this request
            match = self._trie.depth(node)
            limit = min(max_len, math.ceil(drafter.alpha * match))
            best = self._trie.walk(node, 0, limit, drafter.min_share)
        if drafter.global_tokens:
            shared, shared_match = drafter.propose_global(self._tokens, max_match, max_len)
            if shared.score > best.score:
                best, match = shared, shared_match
        return draft_of(best.tokens, match_len=match) if best.tokens else empty_draft()

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        if self._closed:
            raise RuntimeError("observe() after close()")
        self._append(validated_tokens(new_tokens, "new_tokens"))

    def close(self, finished: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if finished:
            self._drafter.add_output(self._tokens[self._prompt_len :])
        self._trie = SuffixTrie(self._drafter.max_depth)
        self._tokens, self._active = [], []
