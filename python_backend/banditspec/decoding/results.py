"""What decoding produces: per-step events, a request's speculation statistics and its
result, and the finish reasons. Plain data, shared by the step protocol
(:mod:`banditspec.decoding.session`), the Triton adapter and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_EOS, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED = "eos", "stop", "length", "cancelled"


@dataclass
class StepEvent:
    """What one step produced.

    new_token_ids: tokens now safe to emit (a tail that could still become a stop word
                   is held back until it is decided)
    """

    arm: str
    drafted: int
    accepted: int
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    step_seconds: float


@dataclass
class SpeculationStats:
    arms: list[str] = field(default_factory=list)  # arm per step
    drafted: list[int] = field(default_factory=list)  # draft length per step
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per step
    step_seconds: list[float] = field(default_factory=list)  # whole step: choose, draft, verify, score
    verify_seconds: list[float] = field(default_factory=list)  # the target's part of each step
    dropped_arms: dict[str, str] = field(default_factory=dict)  # arm -> reason
    generated_tokens: int = 0
    controller: dict | None = None  # costaware: the cost model the request decided with
    # KV-cache blocks the target reused / allocated (engines that report it: TensorRT-LLM)
    kv_cache_reused_blocks: int | None = None
    kv_cache_alloc_new_blocks: int | None = None
    seed: int | None = None  # the request's random seed: sending it again reproduces a sampled text
    # prompt tokens the target found in its prefix cache on the first call (engines that say: the
    # reference target): a conversation's history, resent with each turn, is not prefilled again
    cached_prompt_tokens: int | None = None

    @property
    def steps(self) -> int:
        return len(self.arms)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens per target call (accepted draft tokens + the target's own), the usual MAT."""
        return self.generated_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        elapsed = sum(self.step_seconds)
        per_arm: dict[str, dict] = {}
        for arm, drafted, accepted in zip(self.arms, self.drafted, self.accepted):
            entry = per_arm.setdefault(arm, {"pulls": 0, "drafted": 0, "accepted": 0})
            entry["pulls"] += 1
            entry["drafted"] += drafted
            entry["accepted"] += accepted
        return {
            "steps": self.steps,
            "generated_tokens": self.generated_tokens,
            "arms": list(self.arms),
            "drafted": list(self.drafted),
            "accepted": list(self.accepted),
            # per step, milliseconds: the whole step and the target call within it
            "step_ms": [round(1000.0 * s, 3) for s in self.step_seconds],
            "verify_ms": [round(1000.0 * s, 3) for s in self.verify_seconds],
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "tokens_per_second": round(self.generated_tokens / elapsed, 3) if elapsed > 0 else 0.0,
            "per_arm": per_arm,
            "dropped_arms": dict(self.dropped_arms),
            **({"seed": self.seed} if self.seed is not None else {}),
            **({"cached_prompt_tokens": self.cached_prompt_tokens} if self.cached_prompt_tokens is not None else {}),
            **({"controller": self.controller} if self.controller is not None else {}),
            **({"kv_cache_reused_blocks": self.kv_cache_reused_blocks,
                "kv_cache_alloc_new_blocks": self.kv_cache_alloc_new_blocks}
               if self.kv_cache_reused_blocks is not None else {}),
        }


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only; EOS and stop words excluded
    finish_reason: str
    stats: SpeculationStats
