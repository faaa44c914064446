"""A bounded LRU cache of key/value states of sequences the engine has seen.

The verify contract is stateless (every call carries the whole sequence), so the
engine finds the KV of the longest cached prefix of an incoming sequence and only
feeds the rest through the model.

Rules that keep the cache trustworthy:

* an entry holds KV for exactly its ``token_ids``; nothing beyond what a verify call
  confirmed (input + accepted draft tokens) is ever stored;
* a lookup hands out a fresh :class:`~transformers.DynamicCache` built from views of
  the entry's tensors cut to the common prefix; the stored entry is never modified
  (``DynamicCache.update`` concatenates into new tensors, ``crop`` re-slices), so a
  rejected draft or a diverging sequence cannot corrupt it;
* storing a sequence drops the entries it extends (they are its prefixes);
* at most ``max_entries`` entries and ``max_tokens`` tokens in all; least recently
  used entries are evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

import numpy as np
import torch
from transformers import DynamicCache

from banditspec.errors import BanditSpecValidationError

LayerKV = tuple[torch.Tensor, torch.Tensor]


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading positions where the int arrays a and b agree (vectorised)."""
    n = min(len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if differs.size else n


def cache_layers(kv: DynamicCache) -> list[LayerKV]:
    """Per-layer (keys, values): float32 [batch, kv_heads, seq, head_dim] each."""
    return [(layer.keys, layer.values) for layer in kv.layers]


def cache_from_layers(layers: list[LayerKV]) -> DynamicCache:
    """A new DynamicCache holding the given per-layer tensors (no copy)."""
    return DynamicCache(ddp_cache_data=layers)


@dataclass
class CacheEntry:
    """token_ids: int32 [n]; layers: per layer (keys, values), float32 [1, kv_heads, n, head_dim]."""

    token_ids: np.ndarray
    layers: list[LayerKV]

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class PrefixHit:
    """The reusable prefix of a sequence: its length and its KV (per layer, batch 1)."""

    length: int
    layers: list[LayerKV] | None

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

    def lookup(self, token_ids: np.ndarray, max_length: int) -> PrefixHit:
        """The longest cached prefix of token_ids, at most max_length tokens long.

        token_ids: int32 [seq_len]. The returned KV are views cut to the prefix; the
        entry is marked as recently used and stays in the cache unchanged.
        """
        best_key, best_length = None, 0
        for key, entry in self._entries.items():
            length = min(common_prefix_length(entry.token_ids, token_ids), max_length)
            if length > best_length:
                best_key, best_length = key, length
        if best_key is None:
            return PrefixHit(0, None)
        self._entries.move_to_end(best_key)
        self.hits += 1
        entry = self._entries[best_key]
        layers = [(k[:, :, :best_length], v[:, :, :best_length]) for k, v in entry.layers]
        return PrefixHit(best_length, layers)

    def store(self, token_ids: np.ndarray, layers: list[LayerKV]) -> None:
        """Keep the KV of token_ids (int32 [n]); layers: float32 [1, kv_heads, n, head_dim].

        Entries that are prefixes of token_ids are dropped (this one supersedes them);
        then least recently used entries are evicted until both bounds hold. A
        sequence longer than the whole token budget is not kept.
        """
        n = len(token_ids)
        if n == 0 or n > self.max_tokens or self.max_entries == 0:
            return
        if layers and layers[0][0].shape[2] != n:
            raise ValueError(f"KV length {layers[0][0].shape[2]} != {n} token ids")
        superseded = [
            key
            for key, entry in self._entries.items()
            if len(entry) <= n and common_prefix_length(entry.token_ids, token_ids) == len(entry)
        ]
        for key in superseded:
            del self._entries[key]
        self._entries[next(self._keys)] = CacheEntry(np.array(token_ids, dtype=np.int32), layers)
        self._evict()

    def _evict(self) -> None:
        total = self.cached_tokens()
        while self._entries and (len(self._entries) > self.max_entries or total > self.max_tokens):
            _, entry = self._entries.popitem(last=False)
            total -= len(entry)
            self.evictions += 1
