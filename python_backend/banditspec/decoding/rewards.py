"""Rewards a policy learns from, one per step.

* ``accepted`` (the paper's): Y = accepted + 1, in [1, L + 1].
* ``throughput`` (cost-aware): Y = (accepted + 1) * t_plain / t_step, clipped to [0, L + 1]:
  the step's tokens per second in units of plain decoding's rate, where t_step is the
  measured wall time of the step (draft + verify) and t_plain the platform's cost of a
  one-token round from the server-wide :class:`~banditspec.bandits.cost_model.CostModel`
  (a fixed yardstick, not a moving one). Y > 1 means the step beat plain decoding. The
  decoding loop does not reward a request's first step (its time includes the prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from banditspec.bandits.cost_model import CostModel


class Reward(Protocol):
    name: str

    def __call__(self, accepted: int, step_seconds: float, tokens: int | None = None) -> float: ...


class AcceptedLengthReward:
    name = "accepted"

    def __call__(self, accepted: int, step_seconds: float, tokens: int | None = None) -> float:
        return float(accepted + 1)


@dataclass
class ThroughputReward:
    cost_model: CostModel
    max_draft_len: int
    name = "throughput"

    def __call__(self, accepted: int, step_seconds: float, tokens: int | None = None) -> float:
        plain = self.cost_model.verify_seconds(1)
        produced = max(accepted + 1, tokens or 0)
        value = float(produced) * plain / max(step_seconds, 1e-9)
        return min(max(value, 0.0), float(self.max_draft_len + 1))


def make_reward(name: str, cost_model: CostModel | None = None, max_draft_len: int = 16) -> Reward:
    if name == "throughput":
        return ThroughputReward(cost_model or CostModel(max_draft_len + 1), max_draft_len)
    return AcceptedLengthReward()
