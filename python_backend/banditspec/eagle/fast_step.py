"""An Eagle head's incremental step for drafting, with fewer, larger kernels.

Same math as :meth:`banditspec.eagle.head.EagleHead.step` (EAGLE-1) and
:meth:`banditspec.eagle.head3.Eagle3Head.step` (EAGLE-3: q/k/v straight from the two normed
inputs, the residual over the hidden input, no output norm); what differs is only how it is
run, because at one to a few positions per call the head's cost is mostly per-op overhead
(~60 small ops for a 4.5 M-parameter layer, as much time as a target layer):

* q, k and v are one linear, gate and up another (fused weights);
* the rope table is computed once per drafter, not per call;
* the session's KV cache is a preallocated buffer written in place (:class:`KVBuffer`),
  not a concatenation of the whole cache at every call, and attention reads the grouped
  heads directly (``enable_gqa``) instead of copying them out;
* RMSNorm is one fused op.

With int8 weights and the engine's C kernels (``engine/kernels/eagle_step.c``,
``bs_eagle_step``) the whole step is one native call instead: a head call comes right after a
target forward has evicted the caches, and then each of the ~25 torch ops would pay its own
misses (dispatcher, kernel code, fbgemm's packed-weight metadata). Same math with the weights quantized the same way (per output row);
the activations stay fp32 (fbgemm quantized them per call), so it is a little closer to fp32.

Drafting writes speculative entries past the real ones and then forgets them by moving the
length back (:meth:`KVBuffer.truncate`): the next real pair overwrites them.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from banditspec.eagle.head import EagleConfig, EagleHead, rope_cos_sin
from banditspec.eagle.head3 import Eagle3Config, Eagle3Head
from banditspec.engine import panel_kernel
from banditspec.engine.fast_llama import Int8Linear, PackedLinear
from banditspec.engine.panel_kernel import PanelInt8Linear, float_rows

# Steps over at most this many pairs run natively; longer ones (a request's first call, a
# catch-up after many rounds without the head) through torch: the native kernel keeps the
# activations in fp32 and costs more per further pair than fbgemm's int8 GEMM. Where torch
# starts to win depends on the CPU (between ~5 and ~8 pairs on the CPUs tried;
# experiments/eagle/bench_step.py --pairs measures it). 7: a catch-up after two or three
# rounds without the head stays native.
NATIVE_MAX_PAIRS = 7


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


def _step_weights(head: EagleHead | Eagle3Head) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                                          list[torch.Tensor], dict[str, torch.Tensor]]:
    """(fc weight, fc bias, [qkv, o, gate_up, down] weights, the norms by role), fp32. EAGLE-3 has
    no fc in its step (its projection of the target's layers runs before: Eagle3Head.project)."""
    if isinstance(head, Eagle3Head):
        m = head.midlayer
        attn, mlp = m.self_attn, m.mlp
        fc, bias = None, None
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # [QKV, 2H]
        rest = [attn.o_proj.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight]
        norms = {"embed_norm": m.input_layernorm.weight, "feature_norm": m.hidden_norm.weight,
                 "post_attention_norm": m.post_attention_layernorm.weight, "out_norm": head.norm.weight}
    else:
        fc, bias = head.fc.weight.detach().float(), head.fc.bias.detach().float().clone()
        qkv = torch.cat([head.q_proj.weight, head.k_proj.weight, head.v_proj.weight])  # [QKV, H]
        rest = [head.o_proj.weight, torch.cat([head.gate_proj.weight, head.up_proj.weight]), head.down_proj.weight]
        norms = {name: getattr(head, name).weight for name in ("embed_norm", "feature_norm", "post_attention_norm", "out_norm")}
    return (fc, bias, [w.detach().float() for w in [qkv, *rest]],
            {k: v.detach().float().clone() for k, v in norms.items()})


class FastEagleStep:
    """Drafting-only runner of an :class:`EagleHead` or :class:`Eagle3Head` (weights copied,
    int8 or fp32)."""

    def __init__(self, head: EagleHead | Eagle3Head, int8: bool, rope_positions: int = 4096,
                 native: bool | None = None):
        """native: run each step as one C call (int8 only); None: when the kernels load here."""
        c = self.config = head.config
        linear = Int8Linear if int8 else (lambda w: PackedLinear(w, packed=False))
        with torch.no_grad():
            fc, self.fc_bias, layer, self.norms = _step_weights(head)
            self.fc = None if fc is None else linear(fc)
            self.qkv, self.o, self.gate_up, self.down = (linear(w) for w in layer)
        self.eps = c.rms_norm_eps
        self._cos, self._sin = rope_cos_sin(torch.arange(rope_positions), c.head_dim, c.rope_theta)
        self._native: _NativeStep | None = None
        self.native_max_pairs = NATIVE_MAX_PAIRS
        if int8 and native is not False and c.head_dim % 8 == 0:  # the C attention's vectors
            library = panel_kernel.load()
            if library is None and native:
                raise RuntimeError(f"native Eagle step unavailable: {panel_kernel.unavailable_reason()}")
            if library is not None:
                self._native = _NativeStep(c, library, fc, self.fc_bias, layer, self.norms)

    @property
    def native(self) -> bool:
        """Whether steps of up to NATIVE_MAX_PAIRS pairs run as one C call (bs_eagle_step)."""
        return self._native is not None

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
        if self._native is not None and t <= self.native_max_pairs:
            cos, sin = self._rope(past, t)
            cache.reserve(past + t)
            out = self._native.step(embeddings, features, cos, sin, cache, past)
            cache.length = past + t
            return out
        pair = torch.cat([self._norm(embeddings, "embed_norm"), self._norm(features, "feature_norm")], dim=-1)  # [1, T, 2H]
        if self.fc is None:  # EAGLE-3: q/k/v from the pair, the residual over the hidden input
            residual, qkv = features, self.qkv(pair)
        else:  # EAGLE-1: the pair fused to u first, the residual over u
            assert self.fc_bias is not None
            residual = self.fc(pair) + self.fc_bias  # [1, T, H]
            qkv = self.qkv(residual)
        qkv = qkv.view(t, nh + 2 * nkv, d).transpose(0, 1)  # [nh + 2 nkv, T, d]
        cos, sin = self._rope(past, t)
        q = self._rotate(qkv[:nh], cos, sin).unsqueeze(0)  # [1, nh, T, d]
        cache.reserve(past + t)
        cache.k[0, :, past: past + t] = self._rotate(qkv[nh: nh + nkv], cos, sin)
        cache.v[0, :, past: past + t] = qkv[nh + nkv:]
        cache.length = past + t
        k, v = cache.k[:, :, : past + t], cache.v[:, :, : past + t]
        mask = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past) if t > 1 else None
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [1, nh, T, d]
        x = residual + self.o(attn.transpose(1, 2).reshape(1, t, c.hidden_size))
        gate, up = self.gate_up(self._norm(x, "post_attention_norm")).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return x if self.fc is None else self._norm(x, "out_norm")  # EAGLE-3's norm belongs to its logits


class _NativeStep:
    """The head's weights in the C kernel's int8 panels, and the call of ``bs_eagle_step``."""

    def __init__(self, config: EagleConfig | Eagle3Config, library: ctypes.CDLL, fc: torch.Tensor | None,
                 fc_bias: torch.Tensor | None, layer: list[torch.Tensor], norms: dict[str, torch.Tensor]):
        """fc (None: EAGLE-3), layer: qkv, o, gate_up, down (fp32, fused as the torch runner fuses them)."""
        self._lib, self.config, self.eagle3 = library, config, fc is None
        self.linears = [PanelInt8Linear(w, library) for w in ([] if fc is None else [fc]) + layer]
        # the kernel's fc slot (and bias), unread for EAGLE-3, points at the qkv panels (and zeros)
        slots = ([self.linears[0]] if self.eagle3 else []) + self.linears
        self.fc_bias = (torch.zeros(config.hidden_size) if fc_bias is None else fc_bias).contiguous()
        self.norms = [norms[n].contiguous() for n in ("embed_norm", "feature_norm", "post_attention_norm", "out_norm")]
        # pointer tables (kept alive as attributes) and their addresses, fixed for the runner's life
        self._tables = ((ctypes.c_void_p * 4)(*[n.data_ptr() for n in self.norms]),
                        (ctypes.c_void_p * 5)(*[lin.packed.data_ptr() for lin in slots]),
                        (ctypes.c_int64 * 5)(*[lin.stride for lin in slots]),
                        (ctypes.c_void_p * 5)(*[lin.scale.data_ptr() for lin in slots]))
        self._addresses = tuple(ctypes.addressof(table) for table in self._tables)

    def step(self, embeddings: torch.Tensor, features: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             cache: KVBuffer, past: int) -> torch.Tensor:
        """Predicted features [1, T, H]; writes the cache's rows past .. past + T - 1."""
        c = self.config
        t = features.shape[1]
        emb, feat = float_rows(embeddings, c.hidden_size), float_rows(features, c.hidden_size)
        cos, sin = cos.contiguous(), sin.contiguous()
        out = torch.empty(1, t, c.hidden_size)
        status = self._lib.bs_eagle_step(
            t, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
            emb.data_ptr(), feat.data_ptr(), *self._addresses,
            self.fc_bias.data_ptr(), cos.data_ptr(), sin.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(),
            cache.k.shape[2], past, out.data_ptr(), int(self.eagle3))
        if status != 0:
            raise MemoryError("bs_eagle_step could not allocate its scratch memory")
        return out
