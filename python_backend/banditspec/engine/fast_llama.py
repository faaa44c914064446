"""A compact fp32 Llama forward for the reference engine, built for small verify steps.

Why not transformers' forward: a verify step feeds 1 + gamma (1..17) new tokens, and
on CPU the cost of torch's default GEMM over a row-major weight grows almost linearly
with those few rows (it re-packs the weight on every call), so checking 5 tokens cost
~2x checking one. Here every projection is a oneDNN linear over a weight packed ONCE
at load (``torch.ops.mkldnn._reorder_linear_weight``), q/k/v and gate/up are fused
into one GEMM each (fewer, wider calls), and the per-layer Python work is a handful
of ops. With the default "panel" projections (engine/panel_kernel.py) the projections,
the LM head and the attention run in the C kernels instead, in an order that does not
depend on the rows of a call (bitwise exact across steps). Numerics stay fp32 throughout; the math is the Llama decoder's (RMSNorm,
rotary positions, grouped-query attention, SiLU-gated MLP) as transformers computes
it, so greedy tokens agree with transformers' forward up to float rounding.

Shapes (B = batch, T = new tokens, C = cached tokens, H = hidden, hd = head dim):
  input_ids, position_ids: int64 [B, T]
  past: per layer (keys, values) float32 [B, kv_heads, C, hd], or None (C = 0)
  key_mask: bool [B, C + T] (True = a real token) or None (no padding)
  returns hidden float32 [B, T, H] (after the final norm) and per layer (keys, values)
  float32 [B, kv_heads, C + T, hd]; ``forward_capture`` also the outputs of chosen decoder
  layers, float32 [B, T, H] each (EAGLE-3 features)
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from banditspec.engine.kv_buffer import KVBuffer
from banditspec.engine.panel_kernel import attention, attention_packed

LayerKV = tuple[torch.Tensor, torch.Tensor]
# A prefill of more than 2 x PREFILL_CHUNK new tokens on the panel kernels runs in passes of
# equal size, at most PREFILL_CHUNK each (FastLlama._chunked). Measured on this 2-core VM
# (SmolLM2-135M, one pass against passes of <= 128 / <= 192): one thread 1.3-2.1x faster for
# 450-1500 tokens (1500: 19.9 s -> 9.6-10.3 s), but 0.85-0.96x at 300 tokens; two threads
# 1.0-1.5x for 400-1500. A single pass slows down sharply somewhere between 300 and 450
# rows (its [T, intermediate] activations outgrow the caches), hence the threshold.
PREFILL_CHUNK = 192
Linear = Callable[[torch.Tensor], torch.Tensor]  # x [..., in] -> y [..., out]


def _packed_linear_available() -> bool:
    try:
        w = torch.ones(4, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 4), packed, None, "none", [], "")
        return bool(torch.allclose(out, torch.full((2, 4), 4.0)))
    except Exception:  # a torch build without oneDNN: plain GEMM over a column-major copy
        return False


PACKED_LINEAR = torch.backends.mkldnn.is_available() and _packed_linear_available()


class PackedLinear:
    """y = x @ W^T for x float32 [..., in], W [out, in].

    Two layouts of one weight, chosen per call by the number of input rows: a
    column-major copy ([in, out] contiguous) for one row, the fastest GEMV here, and
    a oneDNN-packed copy for two or more rows, whose cost stays nearly flat in the
    row count (the weight is packed once, not on every call).
    """

    def __init__(self, weight: torch.Tensor, *, packed: bool = True):
        weight = weight.detach().float().contiguous()
        self.out_features, self.in_features = weight.shape
        self.weight_t = weight.t().contiguous()  # [in, out]
        self._packed = None
        if packed and PACKED_LINEAR:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None or x.numel() == self.in_features:
            return x @ self.weight_t
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")

    def tie(self, modules: list[torch.nn.Linear]) -> None:
        """Point each module's weight at its slice of the column-major copy (same values,
        no second copy in memory); modules are listed in the order they were fused."""
        start = 0
        for module in modules:
            end = start + module.out_features
            module.weight.data = self.weight_t[:, start:end].t()
            start = end


class Int8Linear(PackedLinear):
    """y ~= x @ W^T with W quantized per output row to int8 (symmetric) and x quantized per
    call to 7-bit (fbgemm's dynamic linear): ~4x less weight memory to stream and a cost
    almost flat in the rows. NOT exact: the activation scale is taken over all rows of the
    call, so a token's logits depend (slightly) on how many tokens a verify step carries;
    the fp32 copy is kept for the transformers model's views."""

    def __init__(self, weight: torch.Tensor):
        super().__init__(weight, packed=False)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks quantized tensor creation deprecated
            w = weight.detach().float().contiguous()
            scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()
            qweight = torch.quantize_per_channel(w, scales, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
            self._int8 = torch.ops.quantized.linear_prepack(qweight, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).contiguous(), self._int8, True)
        return out.reshape(*shape[:-1], self.out_features)


def int8_available() -> bool:
    try:
        Int8Linear(torch.ones(4, 4))(torch.ones(1, 4))
        return True
    except Exception:
        return False


@dataclass
class _Layer:
    input_norm: torch.Tensor  # [H]
    qkv: Linear  # H -> (heads + 2 * kv_heads) * hd
    o: Linear  # heads * hd -> H
    post_norm: torch.Tensor  # [H]
    gate_up: Linear  # H -> 2 * intermediate
    down: Linear  # intermediate -> H


def make_linear(weight: torch.Tensor, kind: str) -> Linear:
    """The projection for one weight: "panel" (the panel kernel, exact across row counts),
    "onednn" (:class:`PackedLinear`) or "int8" (:class:`Int8Linear`)."""
    if kind == "panel":
        from banditspec.engine.panel_kernel import PanelLinear, load

        library = load()
        if library is None:
            raise RuntimeError("the panel kernel is unavailable")
        return PanelLinear(weight, library)
    if kind == "int8":
        return Int8Linear(weight)
    if kind == "onednn":
        return PackedLinear(weight)
    raise ValueError(f"unknown linear kind {kind!r}")


class FastLlama:
    """The decoder of a transformers ``LlamaForCausalLM`` (no bias, default RoPE), re-laid
    for small-step CPU inference. With "onednn" and "int8" projections the model's decoder
    weights are re-pointed at the fused column-major copies (same values), so the model
    stays usable and the packed copies are the only extra memory; "panel" projections
    leave the model's weights as they are and add one packed copy (about the decoder's
    size again either way)."""

    def __init__(self, model: Any, *, linear_kind: str = "onednn"):
        """linear_kind: see :func:`make_linear` ("int8" is not exact)."""

        def linear(weight: torch.Tensor) -> Linear:
            return make_linear(weight, linear_kind)

        # "panel": attention on the same library's fixed-order kernel, so that every op of
        # a row is independent of the rows beside it (bitwise the same in any step)
        self._kernels = None
        if linear_kind == "panel":
            from banditspec.engine.panel_kernel import load

            self._kernels = load()
        config = model.config
        rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"FastLlama supports default RoPE only, not {rope_type!r}")
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise ValueError("FastLlama supports bias-free Llama projections only")
        self.num_heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.hidden_size = int(config.hidden_size)
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        decoder = model.model
        self.embed = decoder.embed_tokens.weight.detach()  # [vocab, H]
        self.final_norm = decoder.norm.weight.detach().float()
        rotary = decoder.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float()  # [hd / 2]
        self.attention_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for layer in decoder.layers:
                attn, mlp = layer.self_attn, layer.mlp
                fused = _Layer(
                    input_norm=layer.input_layernorm.weight.detach().float(),
                    qkv=linear(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
                    o=linear(attn.o_proj.weight),
                    post_norm=layer.post_attention_layernorm.weight.detach().float(),
                    gate_up=linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    down=linear(mlp.down_proj.weight),
                )
                if isinstance(fused.qkv, PackedLinear):
                    # The transformers model keeps working (Eagle tools read it) on the same memory.
                    fused.qkv.tie([attn.q_proj, attn.k_proj, attn.v_proj])
                    cast(PackedLinear, fused.o).tie([attn.o_proj])  # one linear_kind for all four
                    cast(PackedLinear, fused.gate_up).tie([mlp.gate_proj, mlp.up_proj])
                    cast(PackedLinear, fused.down).tie([mlp.down_proj])
                self.layers.append(fused)
        self.num_layers = len(self.layers)
        # rows per pass of a long prefill on the panel kernels (see _chunked)
        self.prefill_chunk = PREFILL_CHUNK

    @staticmethod
    def _key_range(batch: int, fresh: int, cached: int, key_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """lo, hi: int64 [B, T]: new token t of sequence b sees keys lo <= j < hi = cached + t + 1
        (causal); lo skips the sequence's left padding (its real keys are contiguous)."""
        hi = (torch.arange(fresh, dtype=torch.long) + cached + 1).expand(batch, fresh)
        if key_mask is None:
            lo = torch.zeros(batch, fresh, dtype=torch.long)
        else:
            lo = key_mask.long().argmax(dim=1, keepdim=True).expand(batch, fresh)
        return lo, hi

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + self.eps))

    def _rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: float32 [B, 1, T, hd] for the given positions."""
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).unsqueeze(1)
        sin = (emb.sin() * self.attention_scaling).unsqueeze(1)
        return cos, sin

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[LayerKV] | None,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        hidden, layers, _ = self.forward_capture(input_ids, position_ids, past, key_mask)
        return hidden, layers

    def forward_capture(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[LayerKV] | None,
        key_mask: torch.Tensor | None = None,
        capture: tuple[int, ...] = (),
        kv_out: KVBuffer | None = None,
    ) -> tuple[torch.Tensor, list[LayerKV], list[torch.Tensor]]:
        """:meth:`forward`, plus the outputs of decoder layers ``capture`` (residual stream,
        before the final norm; float32 [B, T, H] each, in the order asked): EAGLE-3's features.

        kv_out (batch 1): a buffer already holding ``past`` at positions 0 .. C - 1; the new
        positions are written into it (no concatenation) and the returned KV are its views.

        A long run of new tokens (a prefill of more than 2 x :attr:`prefill_chunk`) on the
        panel kernels is fed in passes (:meth:`_chunked`): bitwise the same result, faster."""
        batch, fresh = input_ids.shape
        if (self._kernels is not None and kv_out is not None and batch == 1 and key_mask is None
                and fresh > 2 * self.prefill_chunk):
            return self._chunked(input_ids, position_ids, past, capture, kv_out)
        captured: dict[int, torch.Tensor] = {}
        cached = past[0][0].shape[2] if past else 0
        heads, kv_heads, hd = self.num_heads, self.kv_heads, self.head_dim
        x = F.embedding(input_ids, self.embed)  # [B, T, H]
        cos, sin = self._rotary(position_ids)
        # Attention mask [B, 1, T, C + T]: causal over the new tokens, all cached keys
        # visible, padding hidden. None when a single real row needs no mask at all.
        mask = key_range = None
        if self._kernels is not None:
            key_range = self._key_range(batch, fresh, cached, key_mask)
        elif fresh > 1 or key_mask is not None:
            causal = torch.ones(fresh, cached + fresh, dtype=torch.bool).tril(diagonal=cached)
            mask = causal[None, None]
            if key_mask is not None:
                mask = mask & key_mask[:, None, None, :]
        new_layers: list[LayerKV] = []
        q_end, k_end = heads * hd, (heads + kv_heads) * hd
        kernels = cast(ctypes.CDLL, self._kernels)  # loaded whenever key_range is set
        for index, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            qkv = layer.qkv(h)  # [B, T, (heads + 2 kv_heads) * hd]
            q = qkv[..., :q_end].view(batch, fresh, heads, hd).transpose(1, 2)
            k = qkv[..., q_end:k_end].view(batch, fresh, kv_heads, hd).transpose(1, 2)
            v = qkv[..., k_end:].view(batch, fresh, kv_heads, hd).transpose(1, 2)
            q = self._rotate(q, cos, sin)
            k = self._rotate(k, cos, sin)
            if kv_out is not None:
                k, v = kv_out.append(index, cached, k, v)
            elif past:
                k = torch.cat((past[index][0], k), dim=2)
                v = torch.cat((past[index][1], v), dim=2)
            else:
                k, v = k.contiguous(), v.contiguous()
            new_layers.append((k, v))
            if key_range is not None:
                attn = attention(kernels, q, k, v, key_range[0], key_range[1], self.scale)
            else:
                attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=True)
                attn = attn.transpose(1, 2).reshape(batch, fresh, heads * hd)
            x = self._output_and_mlp(layer, x, attn)
            if index in capture:
                captured[index] = x
        return self._norm(x, self.final_norm), new_layers, [captured[i] for i in capture]

    def _output_and_mlp(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The rest of a decoder layer after attention: x [..., H] plus the output projection of
        ``attn`` [..., heads * hd], then plus the SiLU-gated MLP of its post-attention norm."""
        x = x + layer.o(attn)
        h = self._norm(x, layer.post_norm)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)

    def forward_packed(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        segments: list[tuple[int, int]],
        buffers: list[KVBuffer],
        capture: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[list[LayerKV]], list[torch.Tensor]]:
        """Several sequences in one pass without padding (panel kernels only): their new
        tokens side by side in one row block, as TensorRT-LLM's packed (remove_input_padding)
        batches are. Every projection runs once over all R rows (the weight streams once);
        attention runs per sequence against its own buffer, which the step's keys and values
        are written into in place (no copy of anyone's cache, no padded rows or keys).

        input_ids, position_ids: int64 [1, R], the sequences' new tokens one after another;
        segments: per sequence (cached tokens, new tokens), in that order (sum of new = R);
        buffers: per sequence, its KV buffer holding its cached positions (KVBuffer rules).
        Returns hidden float32 [1, R, H] (after the final norm), per sequence per layer its
        (keys, values) views of positions 0 .. cached + new - 1, and the captured layers'
        outputs float32 [1, R, H] each. Every op of a row is the one a solo pass applies to it
        (row-independent projections, the same attention over the same keys), so each
        sequence's results are bitwise its solo results."""
        if self._kernels is None:
            raise RuntimeError("packed passes need the panel kernels")
        kernels = self._kernels
        rows = input_ids.shape[1]
        heads, kv_heads, hd = self.num_heads, self.kv_heads, self.head_dim
        q_end, k_end = heads * hd, (heads + kv_heads) * hd
        bounds: list[tuple[int, int, int]] = []  # per sequence: first row, end row, cached
        first = 0
        for cached, fresh in segments:
            bounds.append((first, first + fresh, cached))
            first += fresh
        if first != rows:
            raise ValueError(f"segments feed {first} rows, input_ids has {rows}")
        # key ranges: new token t of a sequence sees keys 0 <= j < cached + t + 1 of its own buffer
        lo = torch.zeros(rows, dtype=torch.long)
        hi = torch.cat([torch.arange(cached + 1, cached + 1 + end - start, dtype=torch.long)
                        for start, end, cached in bounds])
        first_rows = torch.tensor([start for start, _, _ in bounds] + [rows], dtype=torch.long)  # [S + 1]
        captured: dict[int, torch.Tensor] = {}
        layers: list[list[LayerKV]] = [[] for _ in segments]
        x = F.embedding(input_ids, self.embed)  # [1, R, H]
        cos, sin = self._rotary(position_ids)  # [1, 1, R, hd]
        for index, layer in enumerate(self.layers):
            h = self._norm(x, layer.input_norm)
            qkv = layer.qkv(h)  # [1, R, (heads + 2 kv_heads) * hd]
            q = self._rotate(qkv[..., :q_end].view(1, rows, heads, hd).transpose(1, 2), cos, sin)
            k = self._rotate(qkv[..., q_end:k_end].view(1, rows, kv_heads, hd).transpose(1, 2), cos, sin)
            v = qkv[..., k_end:].view(1, rows, kv_heads, hd).transpose(1, 2)
            for b, (start, end, cached) in enumerate(bounds):
                layers[b].append(buffers[b].append(index, cached, k[:, :, start:end], v[:, :, start:end]))
            attn = attention_packed(kernels, q, [kv[index][0] for kv in layers], [kv[index][1] for kv in layers],
                                    first_rows, lo, hi, self.scale)
            x = self._output_and_mlp(layer, x, attn)  # attn [1, R, heads * hd] -> x [1, R, H]
            if index in capture:
                captured[index] = x
        return self._norm(x, self.final_norm), layers, [captured[i] for i in capture]

    def _chunked(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[LayerKV] | None,
        capture: tuple[int, ...],
        kv_out: KVBuffer,
    ) -> tuple[torch.Tensor, list[LayerKV], list[torch.Tensor]]:
        """:meth:`forward_capture` of batch 1 in equal passes of at most :attr:`prefill_chunk` new tokens,
        each pass attending to the KV the earlier ones wrote into ``kv_out``. Every op of a
        row on the panel kernels is independent of the rows beside it, so the hidden
        states, captured layers and KV are bitwise those of one pass; what changes is speed
        (see :data:`PREFILL_CHUNK`)."""
        fresh = input_ids.shape[1]
        passes = -(-fresh // self.prefill_chunk)
        size = -(-fresh // passes)  # passes of equal size (no short last pass)
        hidden: list[torch.Tensor] = []
        captured: list[list[torch.Tensor]] = []
        layers = past
        for start in range(0, fresh, size):
            end = min(start + size, fresh)
            h, layers, c = self.forward_capture(input_ids[:, start:end], position_ids[:, start:end], layers,
                                                None, capture, kv_out)
            hidden.append(h)
            captured.append(c)
        assert layers is not None
        return torch.cat(hidden, dim=1), layers, [torch.cat(parts, dim=1) for parts in zip(*captured)]
