"""The EAGLE-3 draft head: one decoder layer over [token embedding ; fused multi-layer feature].

Notation (one sequence x_0 .. x_{n-1}; a_i = the outputs of the target's decoder layers
``aux_layers`` (low, middle, high; residual stream, before the final norm) at position i,
concatenated, float [k * H]):

    g_i   = fc(a_i)                                          fused feature, [H]
    s_i   = midlayer(E[x_{i+1}], g_i)                        own hidden state, [H]
            midlayer: x = [ input_layernorm(E[x_{i+1}]) ; hidden_norm(g_i) ]   (2H)
                      h = g_i + o_proj(attention(q/k/v_proj(x)))   causal, rope position i
                      s = h + mlp(post_attention_layernorm(h))
    logits of x_{i+2} over the draft vocabulary = lm_head(norm(s_i))

Chain drafting feeds s_i back in place of g: the next pair is (E[drafted token], s_i)
(EAGLE-3's "training-time test": the head is trained on its own hidden states for the
later steps, see ``banditspec_train.eagle.objective3``). The head owns its LM head over a reduced draft
vocabulary; ``draft_vocab`` (int64 [K]) maps a draft index d to the target id
``draft_vocab[d]`` (upstream stores ``d2t[d] = draft_vocab[d] - d`` and a ``t2d`` mask).

Parameter names follow upstream EAGLE-3 checkpoints (``fc``, ``midlayer.*``, ``norm``,
``lm_head``), so ``banditspec_train.eagle.export`` writes a checkpoint in that layout without renaming
logic elsewhere (docs/eagle.md, "Upstream checkpoint").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from banditspec.eagle.head import (
    EagleConfig,
    RMSNorm,
    apply_rope,
    empty_cache,
    extend_cache,
    load_weights,
    rope_cos_sin,
    save_weights,
)
from banditspec.errors import BanditSpecValidationError


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """TensorRT-LLM's default EAGLE-3 capture layers: {1, L // 2 - 1, L - 4} (30 layers: 1, 14, 26)."""
    if num_layers < 5:
        raise BanditSpecValidationError("aux_layers", f"a target of {num_layers} layers is too shallow")
    return (1, num_layers // 2 - 1, num_layers - 4)


@dataclass(frozen=True)
class Eagle3Config(EagleConfig):
    """Shape of an EAGLE-3 head (an Eagle head's, see :class:`EagleConfig`) and the target
    layers whose outputs it fuses."""

    aux_layers: tuple[int, ...] = (1, 14, 26)
    target_num_layers: int = 30

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.target_num_layers, bool) or int(self.target_num_layers) <= 0:
            raise BanditSpecValidationError("target_num_layers", f"must be > 0, got {self.target_num_layers}")
        layers = tuple(int(a) for a in self.aux_layers)
        if not layers or any(not 0 <= a < self.target_num_layers - 1 for a in layers):
            raise BanditSpecValidationError(
                "aux_layers", f"need 1+ layer indices in [0, {self.target_num_layers - 2}], got {self.aux_layers}")
        object.__setattr__(self, "aux_layers", layers)

    @property
    def feature_size(self) -> int:
        """Width of the target feature a position needs: len(aux_layers) * hidden_size."""
        return len(self.aux_layers) * self.hidden_size

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int,
                   aux_layers: tuple[int, ...] | None = None) -> Eagle3Config:
        """Copy the shape of a HF Llama config; capture layers default to TensorRT-LLM's."""
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        layers = int(target_config.num_hidden_layers)
        return cls(
            hidden_size=target_config.hidden_size,
            num_heads=target_config.num_attention_heads,
            num_kv_heads=target_config.num_key_value_heads,
            intermediate_size=target_config.intermediate_size,
            draft_vocab_size=min(draft_vocab_size, target_config.vocab_size),
            target_vocab_size=target_config.vocab_size,
            rope_theta=float(theta),
            rms_norm_eps=float(target_config.rms_norm_eps),
            aux_layers=tuple(aux_layers) if aux_layers else default_aux_layers(layers),
            target_num_layers=layers,
        )


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        kv = c.num_kv_heads * c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)


class Eagle3Head(nn.Module):
    """Weights and math of the head; the drafter and the trainer drive it.

    Tensors: ``embeddings`` float [B, T, H] (rows of E for x_{i+1}); ``hidden`` float
    [B, T, H] (g_i = fc(a_i) for a real position, or the head's own s of the previous
    position); output: own hidden states s float [B, T, H].
    """

    draft_vocab: torch.Tensor  # a registered buffer (see __init__)

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = c = config
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("draft_vocab", torch.arange(c.draft_vocab_size, dtype=torch.int64))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    # --- building blocks -------------------------------------------------------------
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """g: [.., H] from the target's multi-layer features a: [.., k * H]."""
        return self.fc(features)

    def qkv(self, embeddings: torch.Tensor, hidden: torch.Tensor,
            positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, nh, T, d], k/v [B, nkv, T, d] (k rotated) at int64 positions [T]."""
        c, m = self.config, self.midlayer
        b, t, _ = hidden.shape
        x = torch.cat([m.input_layernorm(embeddings), m.hidden_norm(hidden)], dim=-1)
        q = m.self_attn.q_proj(x).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention output [B, T, H]; k/v have nkv heads (grouped), mask bool [Tq, Tk] or None."""
        c = self.config
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        b, _, t, _ = out.shape
        return out.transpose(1, 2).reshape(b, t, c.hidden_size)

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual (over the hidden input) + MLP: own hidden states s [B, T, H]."""
        m = self.midlayer
        h = hidden + m.self_attn.o_proj(attn)
        return h + m.mlp(m.post_attention_layernorm(h))

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [.., K] from own hidden states [.., H]."""
        return self.lm_head(self.norm(states))

    # --- incremental forward with a KV cache (drafting) --------------------------------
    def step(self, embeddings: torch.Tensor, hidden: torch.Tensor, past_k: torch.Tensor,
             past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Extend a cache by T new pairs at positions P..P+T-1 (P = past length).

        embeddings/hidden: float32 [1, T, H]; past_k/past_v: float32 [1, nkv, P, d].
        Returns (own hidden states [1, T, H], k [1, nkv, P+T, d], v [1, nkv, P+T, d]).
        """
        past, t = past_k.shape[2], hidden.shape[1]
        q, k_new, v_new = self.qkv(embeddings, hidden, torch.arange(past, past + t))
        k, v, mask = extend_cache(past_k, past_v, k_new, v_new)
        return self.finish(hidden, self.attend(q, k, v, mask)), k, v

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return empty_cache(self.config.num_kv_heads, self.config.head_dim)


# --- persistence ------------------------------------------------------------------------
def save_head3(head: Eagle3Head, path: Path, metadata: dict | None = None) -> None:
    """Weights as bf16 safetensors (draft_vocab as int32) + config/metadata JSON beside it."""
    save_weights(head, path, {"format": "eagle3", "config": asdict(head.config), **(metadata or {})})


def load_head3(path: Path, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """An Eagle3Head in eval mode from ``save_head3``'s files (weights cast to ``dtype``)."""
    return load_weights(path, lambda config: Eagle3Head(Eagle3Config(**config)), dtype)


def head_info(path: Path) -> dict:
    """The JSON beside a weights file (config, training metadata, tuned cut-off); the one reader."""
    return json.loads(Path(path).with_suffix(".json").read_text())


def head_format(path: Path) -> str:
    """"eagle3" or "eagle1" (the older EAGLE-1 head) from the JSON beside a weights file."""
    return str(head_info(path).get("format", "eagle1"))
