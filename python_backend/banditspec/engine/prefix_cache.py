"""A bounded LRU cache of key/value states (and features) of sequences the engine has seen.

The verify contract is stateless (every call carries the whole sequence), so the
engine finds the KV of the longest cached prefix of an incoming sequence and only
feeds the rest through the model.

Features: a request that asks for hidden states from position ``h`` (Eagle drafters)
needs the target's states at the reused positions too, which KV alone cannot give. So
an entry also keeps, per *feature kind*, the states of its positions from some position
``s`` on: float32 [n - s, F], tagged with the kind that produced them (the request's
``hidden_layers``: ``()`` = the last post-norm state, otherwise those decoder layers'
outputs concatenated) and with ``s`` (``feature_from``; 0 for ``()``, which every pass
computes). A request asking for states of kind ``K`` from ``h`` may reuse more than ``h``
positions only from an entry holding ``K`` from ``s <= h``; other entries serve it up to
``h``. Why a start: a head that reads only a window of the prompt asks for ``K`` from
``h > 0``, so its entries could never hold ``K`` from position 0, and the next turn of a
conversation would recompute that window of its history.

Rules that keep the cache trustworthy:

* an entry holds KV for exactly its ``token_ids``; nothing beyond what a verify call
  confirmed (input + accepted draft tokens) is ever stored;
* a lookup hands out views of the entry's tensors cut to the common prefix; the stored
  positions are never modified: a step either concatenates into new tensors or writes
  past them into the entry's :class:`~banditspec.engine.kv_buffer.KVBuffer`, whose
  positions below its frozen length (every stored entry's) are never written again, so a
  rejected draft or a diverging sequence cannot corrupt an entry;
* an entry's features of a kind cover exactly its positions ``feature_from[kind]``..n-1,
  so a kind is usable from that position on or not at all; they are cut like the KV on a
  lookup;
* storing a sequence drops the entries it extends (they are its prefixes), unless one
  holds a feature kind the new entry lacks, or holds from an earlier position (dropping
  it would lose those features);
* at most ``max_entries`` entries and ``max_tokens`` tokens in all; least recently
  used entries are evicted first. The budget counts positions, not bytes: a position
  of an entry costs its KV (2 * layers * kv_heads * head_dim floats, ~46 KB on
  SmolLM2-135M) plus F floats per feature kind it holds (576 floats, ~2.3 KB, for
  ``()``; ~6.9 KB for three layers' outputs), so features add up to ~20 % to an
  entry's size at a given token count.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import DynamicCache

from banditspec.errors import BanditSpecValidationError

if TYPE_CHECKING:
    from banditspec.engine.kv_buffer import KVBuffer

LayerKV = tuple[torch.Tensor, torch.Tensor]
FeatureKind = tuple[int, ...]  # a request's hidden_layers: () = the last post-norm state
Features = dict[FeatureKind, torch.Tensor]  # kind -> float32 [positions from its start, F]
FeatureStarts = dict[FeatureKind, int]  # kind -> the first position its features cover (absent: 0)


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading positions where the int arrays a and b agree (vectorised)."""
    n = min(len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if differs.size else n


def cache_layers(kv: DynamicCache) -> list[LayerKV]:
    """Per-layer (keys, values): float32 [batch, kv_heads, seq, head_dim] each."""
    # transformers types layers' keys/values as optional (and admits linear attention): these are filled attention layers
    return [(layer.keys, layer.values) for layer in kv.layers]  # type: ignore[misc, union-attr]


def cache_from_layers(layers: list[LayerKV]) -> DynamicCache:
    """A new DynamicCache holding the given per-layer tensors (no copy)."""
    return DynamicCache(ddp_cache_data=layers)


@dataclass
class CacheEntry:
    """token_ids: int32 [n]; layers: per layer (keys, values), float32 [1, kv_heads, n, head_dim];
    features: per kind, float32 [n - s, F] (positions s..n-1, s = feature_from.get(kind, 0));
    buffer: the growable storage the layers are views of (None: tensors of their own)."""

    token_ids: np.ndarray
    layers: list[LayerKV]
    features: Features = field(default_factory=dict)
    buffer: KVBuffer | None = None
    feature_from: FeatureStarts = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class PrefixHit:
    """The reusable prefix of a sequence: its length, its KV (per layer, batch 1) and the
    features its entry holds within it, per kind float32 [length - s, F] (positions s..length-1,
    s = feature_from.get(kind, 0) < length; views, like the KV); buffer: the entry's growable
    KV storage, if any (a step may append in place when ``length`` is its frozen length)."""

    length: int
    layers: list[LayerKV] | None
    features: Features = field(default_factory=dict)
    buffer: KVBuffer | None = None
    feature_from: FeatureStarts = field(default_factory=dict)

    def as_cache(self) -> DynamicCache | None:
        return None if self.layers is None else cache_from_layers(self.layers)


class PrefixCache:
    """LRU of (token ids, KV) keyed by sequence; not thread-safe (the engine locks)."""

    def __init__(self, max_entries: int = 8, max_tokens: int = 65536):
        if not isinstance(max_entries, int) or max_entries < 0:
            raise BanditSpecValidationError("cache_entries", f"must be an int >= 0, got {max_entries!r}")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise BanditSpecValidationError("cache_tokens_budget", f"must be an int >= 0, got {max_tokens!r}")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # oldest first
        self._keys = count()
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def cached_tokens(self) -> int:
        """Total tokens whose KV the cache holds."""
        return sum(len(entry) for entry in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()

    def lookup(self, token_ids: np.ndarray, max_length: int, hidden_from: int = -1,
               kind: FeatureKind = ()) -> PrefixHit:
        """The longest usable cached prefix of token_ids, at most max_length tokens long.

        token_ids: int32 [seq_len]. With hidden_from = h >= 0 the caller needs states of
        ``kind`` from position h: an entry without features of that kind from a position
        <= h serves at most h positions. Of equally long prefixes, one whose entry holds
        ``kind`` is preferred (what is stored next can keep them). The returned KV and
        features are views cut to the prefix (a kind that starts at or past its end left
        out); the entry is marked as recently used and stays unchanged.
        """
        best_key, best_rank = None, (0, False)
        for key, entry in self._entries.items():
            has_kind = kind in entry.features and entry.feature_from.get(kind, 0) <= max(hidden_from, 0)
            limit = max_length if hidden_from < 0 or has_kind else min(max_length, hidden_from)
            rank = (min(common_prefix_length(entry.token_ids, token_ids), limit), has_kind)
            if rank[0] > 0 and rank > best_rank:
                best_key, best_rank = key, rank
        if best_key is None:
            return PrefixHit(0, None)
        self._entries.move_to_end(best_key)
        self.hits += 1
        entry, length = self._entries[best_key], best_rank[0]
        layers = [(k[:, :, :length], v[:, :, :length]) for k, v in entry.layers]
        starts = {name: entry.feature_from.get(name, 0) for name in entry.features}
        features = {name: f[: length - starts[name]] for name, f in entry.features.items() if starts[name] < length}
        return PrefixHit(length, layers, features, entry.buffer, {name: starts[name] for name in features if starts[name]})

    def store(self, token_ids: np.ndarray, layers: list[LayerKV], features: Features | None = None,
              buffer: KVBuffer | None = None, feature_from: FeatureStarts | None = None) -> None:
        """Keep the KV of token_ids (int32 [n]); layers: float32 [1, kv_heads, n, head_dim];
        features: per kind float32 [n - s, F], the states of positions s..n-1 with s =
        ``feature_from.get(kind, 0)``; buffer: the KVBuffer the layers are views of (its
        frozen length must cover n).

        The tensors are kept as given (not copied): the caller must not modify them
        afterwards. Entries that are prefixes of token_ids and hold no feature kind this
        one lacks are dropped (this one supersedes them); then least recently used
        entries are evicted until both bounds hold. A sequence longer than the whole
        token budget is not kept.
        """
        n = len(token_ids)
        features = dict(features or {})
        starts = {kind: (feature_from or {}).get(kind, 0) for kind in features}
        if n == 0 or n > self.max_tokens or self.max_entries == 0:
            return
        if layers and layers[0][0].shape[2] != n:
            raise ValueError(f"KV length {layers[0][0].shape[2]} != {n} token ids")
        for kind, states in features.items():
            if not 0 <= starts[kind] < n or states.shape[0] != n - starts[kind]:
                raise ValueError(f"features {kind} cover {states.shape[0]} positions from {starts[kind]} "
                                 f"!= {n} token ids")
        superseded = [
            key
            for key, entry in self._entries.items()
            if len(entry) <= n and common_prefix_length(entry.token_ids, token_ids) == len(entry)
            and all(kind in features and starts[kind] <= entry.feature_from.get(kind, 0) for kind in entry.features)
        ]
        for key in superseded:
            del self._entries[key]
        if buffer is not None and buffer.frozen < n:
            raise ValueError(f"KV buffer frozen at {buffer.frozen} < {n} stored positions")
        self._entries[next(self._keys)] = CacheEntry(np.array(token_ids, dtype=np.int32), layers, features, buffer,
                                                     {kind: s for kind, s in starts.items() if s})
        self._evict()

    def _evict(self) -> None:
        total = self.cached_tokens()
        while self._entries and (len(self._entries) > self.max_entries or total > self.max_tokens):
            _, entry = self._entries.popitem(last=False)
            total -= len(entry)
            self.evictions += 1
