"""The EAGLE-1 draft head: one decoder layer over [next-token embedding ; target feature].

Notation (one sequence x_0 .. x_{n-1}; f_i = the target's post-norm last hidden state at
position i, i.e. the LM-head input that produced x_{i+1}):

    u_i   = fc([ rmsnorm(E[x_{i+1}]) ; rmsnorm(f_i) ])        "pair" i, at rope position i
    h_i   = decoder_layer(u_0 .. u_i)                         causal self-attention + SwiGLU MLP
    f^_{i+1} = out_norm(h_i)                                   predicted feature of position i+1
    logits over the draft vocabulary = E[draft_vocab] @ f^_{i+1}

E is the target's frozen (tied) embedding / LM-head matrix; it is not part of the head's
weights. ``draft_vocab`` (int64 [K]) lists the target ids the head may propose, most
frequent first; a draft-vocabulary index d maps back to target id ``draft_vocab[d]``.
The decoder layer follows EAGLE-1: no input layer norm before attention.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from banditspec.errors import BanditSpecValidationError

_Head = TypeVar("_Head", bound=nn.Module)


@dataclass(frozen=True)
class EagleConfig:
    """Shape of an Eagle head; the attention/rope settings copy the target's."""

    hidden_size: int = 576
    num_heads: int = 9
    num_kv_heads: int = 3
    intermediate_size: int = 1536
    draft_vocab_size: int = 8192
    target_vocab_size: int = 49152
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                     "draft_vocab_size", "target_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) <= 0:
                raise BanditSpecValidationError(name, f"must be > 0, got {value}")
        if self.hidden_size % self.num_heads:
            raise BanditSpecValidationError("num_heads", "must divide hidden_size")
        if self.num_heads % self.num_kv_heads:
            raise BanditSpecValidationError("num_kv_heads", "must divide num_heads")
        if (self.hidden_size // self.num_heads) % 2:
            raise BanditSpecValidationError("num_heads", "head_dim must be even (rope)")
        if self.draft_vocab_size > self.target_vocab_size:
            raise BanditSpecValidationError("draft_vocab_size", "must be <= target_vocab_size")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise BanditSpecValidationError("rope_theta", "rope_theta and rms_norm_eps must be > 0")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int) -> EagleConfig:
        """Copy the shape of a HF Llama config (its rope theta, heads, MLP width)."""
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        return cls(
            hidden_size=target_config.hidden_size,
            num_heads=target_config.num_attention_heads,
            num_kv_heads=target_config.num_key_value_heads,
            intermediate_size=target_config.intermediate_size,
            draft_vocab_size=min(draft_vocab_size, target_config.vocab_size),
            target_vocab_size=target_config.vocab_size,
            rope_theta=float(theta),
            rms_norm_eps=float(target_config.rms_norm_eps),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: float32 [len(positions), head_dim] (HF Llama's half-rotation layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., T, head_dim]; cos/sin: [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class EagleHead(nn.Module):
    """Weights and math of the head; the drafter and the trainer drive it.

    Tensors: ``embeddings`` float [B, T, H] (rows of E for x_{i+1}), ``features`` float
    [B, T, H] (f_i), output features float [B, T, H] (f^_{i+1}).
    """

    draft_vocab: torch.Tensor  # a registered buffer (see __init__)

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        h, c = config.hidden_size, config
        kv = c.num_kv_heads * c.head_dim
        self.embed_norm = RMSNorm(h, c.rms_norm_eps)
        self.feature_norm = RMSNorm(h, c.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, kv, bias=False)
        self.v_proj = nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.post_attention_norm = RMSNorm(h, c.rms_norm_eps)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.out_norm = RMSNorm(h, c.rms_norm_eps)
        self.register_buffer("draft_vocab", torch.arange(c.draft_vocab_size, dtype=torch.int64))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # --- building blocks -------------------------------------------------------------
    def fuse(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """u: [B, T, H] from embeddings E[x_{i+1}] and features f_i, both [B, T, H]."""
        return self.fc(torch.cat([self.embed_norm(embeddings), self.feature_norm(features)], dim=-1))

    def qkv(self, u: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, nh, T, d], k/v [B, nkv, T, d] (k rotated) for u [B, T, H] at int64 positions [T]."""
        c = self.config
        b, t, _ = u.shape
        q = self.q_proj(u).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(u).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(u).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention output [B, T, H]; k/v have nkv heads (grouped), mask bool [Tq, Tk] or None."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = out.shape
        return out.transpose(1, 2).reshape(b, t, c.hidden_size)

    def finish(self, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + MLP + out_norm: predicted features [B, T, H]."""
        x = u + self.o_proj(attn)
        y = self.post_attention_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return self.out_norm(x)

    def draft_logits(self, features: torch.Tensor, lm_head_rows: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [.., K] from features [.., H] and E[draft_vocab] [K, H]."""
        return features @ lm_head_rows.T

    # --- whole-sequence forward (training, prefill) ------------------------------------
    def forward(self, embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Causal forward over whole pairs: predicted features [B, T, H]."""
        t = features.shape[1]
        positions = torch.arange(t)
        u = self.fuse(embeddings, features)
        q, k, v = self.qkv(u, positions)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        return self.finish(u, self.attend(q, k, v, mask))

    # --- incremental forward with a KV cache (drafting) --------------------------------
    def step(self, embeddings: torch.Tensor, features: torch.Tensor, past_k: torch.Tensor,
             past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Extend a cache by T new pairs at positions P..P+T-1 (P = past length).

        embeddings/features: float32 [1, T, H]; past_k/past_v: float32 [1, nkv, P, d].
        Returns (predicted features [1, T, H], k [1, nkv, P+T, d], v [1, nkv, P+T, d]).
        """
        past, t = past_k.shape[2], features.shape[1]
        u = self.fuse(embeddings, features)
        q, k_new, v_new = self.qkv(u, torch.arange(past, past + t))
        k, v, mask = extend_cache(past_k, past_v, k_new, v_new)
        return self.finish(u, self.attend(q, k, v, mask)), k, v

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return empty_cache(self.config.num_kv_heads, self.config.head_dim)


# --- shared by the EAGLE-1 and EAGLE-3 heads ------------------------------------------------
def extend_cache(past_k: torch.Tensor, past_v: torch.Tensor, k_new: torch.Tensor,
                 v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(k, v, mask): the cache [1, nkv, P + T, d] with T new entries appended, and the causal
    mask [T, P + T] of the new queries (None for one query: it sees everything)."""
    past, t = past_k.shape[2], k_new.shape[2]
    k = torch.cat([past_k, k_new], dim=2)
    v = torch.cat([past_v, v_new], dim=2)
    mask = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past) if t > 1 else None
    return k, v, mask


def empty_cache(kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, kv_heads, 0, head_dim)
    return torch.zeros(shape), torch.zeros(shape)


def save_weights(head: nn.Module, path: Path, info: dict[str, Any]) -> None:
    """Weights as bf16 safetensors (draft_vocab as int32) + ``info`` JSON beside them."""
    from safetensors.torch import save_file

    tensors = {}
    for name, tensor in head.state_dict().items():
        tensors[name] = tensor.to(torch.int32) if name == "draft_vocab" else tensor.to(torch.bfloat16)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")


def load_weights(path: Path, build: Callable[[dict[str, Any]], _Head], dtype: torch.dtype) -> _Head:
    """``build(config dict)`` -> a head, filled from ``save_weights``' files, in eval mode."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise BanditSpecValidationError("eagle_weights", f"no such file: {path.name}")
    head = build(json.loads(path.with_suffix(".json").read_text())["config"])
    tensors = load_file(str(path))
    state = {k: (v.to(torch.int64) if k == "draft_vocab" else v.to(dtype)) for k, v in tensors.items()}
    head.load_state_dict(state)
    head.to(dtype)
    head.draft_vocab = head.draft_vocab.to(torch.int64)
    return head.eval()


# --- persistence ------------------------------------------------------------------------
def save_head(head: EagleHead, path: Path, metadata: dict | None = None) -> None:
    """Weights as bf16 safetensors (draft_vocab as int32) + config/metadata JSON beside it."""
    save_weights(head, path, {"config": asdict(head.config), **(metadata or {})})


def load_head(path: Path, dtype: torch.dtype = torch.float32) -> EagleHead:
    """An EagleHead in eval mode from ``save_head``'s files (weights cast to ``dtype``)."""
    return load_weights(path, lambda config: EagleHead(EagleConfig(**config)), dtype)
