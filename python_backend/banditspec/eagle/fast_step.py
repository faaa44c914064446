"""The EAGLE-1 head's incremental step for drafting, with fewer, larger kernels.

Same math as :meth:`banditspec.eagle.head.EagleHead.step`; what differs is only how it is
run, because at one to a few positions per call the head's cost was mostly per-op overhead
(~60 small ops for a 4.5 M-parameter layer: ~0.9 ms a token here, as much as a target
layer):

* q, k and v are one linear, gate and up another (fused weights);
* the rope table is computed once per drafter, not per call;
* the session's KV cache is a preallocated buffer written in place (:class:`KVBuffer`),
  not a concatenation of the whole cache at every call, and attention reads the grouped
  heads directly (``enable_gqa``) instead of copying them out;
* RMSNorm is one fused op.

Drafting writes speculative entries past the real ones and then forgets them by moving the
length back (:meth:`KVBuffer.truncate`): the next real pair overwrites them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from banditspec.eagle.head import EagleHead, rope_cos_sin
from banditspec.engine.fast_llama import Int8Linear, PackedLinear


class KVBuffer:
    """One session's head cache: k/v float32 [1, nkv, capacity, d], the first ``length``
    positions valid; grows by doubling."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int = 128):
        self.k = torch.zeros(1, kv_heads, capacity, head_dim)
        self.v = torch.zeros(1, kv_heads, capacity, head_dim)
        self.length = 0

    def reserve(self, needed: int) -> None:
        capacity = self.k.shape[2]
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class FastEagleStep:
    """Drafting-only runner of an :class:`EagleHead` (weights copied, int8 or fp32)."""

    def __init__(self, head: EagleHead, int8: bool, rope_positions: int = 4096):
        c = self.config = head.config
        linear = Int8Linear if int8 else (lambda w: PackedLinear(w, packed=False))
        with torch.no_grad():
            self.fc = linear(head.fc.weight)
            self.fc_bias = head.fc.bias.detach().float().clone()
            self.qkv = linear(torch.cat([head.q_proj.weight, head.k_proj.weight, head.v_proj.weight]))
            self.o = linear(head.o_proj.weight)
            self.gate_up = linear(torch.cat([head.gate_proj.weight, head.up_proj.weight]))
            self.down = linear(head.down_proj.weight)
            self.norms = {name: getattr(head, name).weight.detach().float().clone()
                          for name in ("embed_norm", "feature_norm", "post_attention_norm", "out_norm")}
        self.eps = c.rms_norm_eps
        self._cos, self._sin = rope_cos_sin(torch.arange(rope_positions), c.head_dim, c.rope_theta)

    def new_cache(self) -> KVBuffer:
        return KVBuffer(self.config.num_kv_heads, self.config.head_dim)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.norms[name], self.eps)

    def _rope(self, past: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        if past + t > self._cos.shape[0]:
            positions = max(past + t, 2 * self._cos.shape[0])
            self._cos, self._sin = rope_cos_sin(torch.arange(positions), self.config.head_dim, self.config.rope_theta)
        return self._cos[past: past + t], self._sin[past: past + t]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def step(self, embeddings: torch.Tensor, features: torch.Tensor, cache: KVBuffer) -> torch.Tensor:
        """Append T pairs at positions cache.length .. +T-1; predicted features [1, T, H].

        embeddings/features: float32 [1, T, H] (E[x_{i+1}] and f_i, as EagleHead.step)."""
        c = self.config
        t, past = features.shape[1], cache.length
        d, nh, nkv = c.head_dim, c.num_heads, c.num_kv_heads
        u = self.fc(torch.cat([self._norm(embeddings, "embed_norm"), self._norm(features, "feature_norm")], dim=-1))
        u = u + self.fc_bias  # [1, T, H]
        qkv = self.qkv(u).view(t, nh + 2 * nkv, d).transpose(0, 1)  # [nh + 2 nkv, T, d]
        cos, sin = self._rope(past, t)
        q = self._rotate(qkv[:nh], cos, sin).unsqueeze(0)  # [1, nh, T, d]
        cache.reserve(past + t)
        cache.k[0, :, past: past + t] = self._rotate(qkv[nh: nh + nkv], cos, sin)
        cache.v[0, :, past: past + t] = qkv[nh + nkv:]
        cache.length = past + t
        k, v = cache.k[:, :, : past + t], cache.v[:, :, : past + t]
        mask = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past) if t > 1 else None
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [1, nh, T, d]
        x = u + self.o(attn.transpose(1, 2).reshape(1, t, c.hidden_size))
        gate, up = self.gate_up(self._norm(x, "post_attention_norm")).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return self._norm(x, "out_norm")
