"""Growable key/value storage for one sequence: a step writes its new positions in place.

Without it every step concatenated the reused KV with the step's new positions, a copy
of the whole cache per layer and step (~14 MB at 300 tokens on SmolLM2-135M, 3-8 ms of
a ~40 ms step). A buffer keeps room for :data:`GROWTH` more positions; a step whose
reused prefix ends exactly where the buffer's frozen positions end writes into that
room, and the KV it hands on (to attention, to the prefix cache) are views.

Rule that keeps the prefix cache trustworthy: positions below :attr:`KVBuffer.frozen`
are never written again. A step may write only at ``frozen`` and beyond; once it has
decided what it keeps it calls :meth:`KVBuffer.freeze` with that length, and only views
up to the frozen length are stored in the cache. Any other step (a prefix shorter than
the frozen length: a diverging sequence, a rejected draft reused by another request, a
batched step) gets a new buffer holding a copy of its prefix.

Memory: a buffer holds at most ``GROWTH`` positions beyond the longest entry using it
(SmolLM2-135M: 128 x ~46 KB, ~5.9 MB); the cache's token budget counts entries'
positions, not this room.
"""

from __future__ import annotations

from typing import cast

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]

GROWTH = 128  # positions of room a new buffer gets beyond the step that made it


class KVBuffer:
    """Per layer keys and values float32 [1, kv_heads, capacity, head_dim]; positions
    [0, frozen) are immutable, [frozen, capacity) free for the next step."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32):
        shape = (1, kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype) for _ in range(num_layers)]
        self.capacity = capacity
        self.frozen = 0

    @classmethod
    def for_step(cls, previous: KVBuffer | None, prefix: list[LayerKV] | None, cached: int,
                 fresh: int, num_layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32) -> KVBuffer:
        """The buffer a step feeding ``fresh`` positions after ``cached`` reused ones writes
        into: ``previous`` (the one the reused prefix lives in) when its frozen positions
        end at ``cached`` and it has room, else a new one with a copy of the prefix
        (``prefix``: per layer views [1, kv_heads, cached, head_dim])."""
        if previous is not None and previous.frozen == cached and cached + fresh <= previous.capacity:
            return previous
        buffer = cls(num_layers, kv_heads, head_dim, cached + fresh + GROWTH, dtype)
        if cached:
            for layer, (k, v) in enumerate(cast("list[LayerKV]", prefix)):  # given whenever cached > 0
                buffer.keys[layer][:, :, :cached].copy_(k)
                buffer.values[layer][:, :, :cached].copy_(v)
        return buffer

    def append(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> LayerKV:
        """Write keys, values [1, kv_heads, n, head_dim] at positions start .. start + n - 1
        (start >= frozen) of ``layer``; returns that layer's views of positions 0 .. start + n - 1."""
        end = start + keys.shape[2]
        if start < self.frozen or end > self.capacity:
            raise RuntimeError(f"KV buffer: positions {start}..{end} outside the free room "
                               f"[{self.frozen}, {self.capacity})")
        self.keys[layer][:, :, start:end].copy_(keys)
        self.values[layer][:, :, start:end].copy_(values)
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def freeze(self, length: int) -> None:
        """Positions below ``length`` are now referenced (stored in the cache): never written again."""
        self.frozen = max(self.frozen, length)
