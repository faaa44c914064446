"""Rewards a policy learns from, one per step.

* ``accepted`` (the paper's): Y = accepted + 1, in [1, L + 1].
* ``throughput`` (cost-aware): Y = (accepted + 1) * t_fastest / t_step, where t_step is the
  measured wall time of the step (draft + verify) and t_fastest the fastest step the
  request has seen. It is the step's tokens per second in units of the request's best
  step rate, so an arm that drafts long and gets rejected pays for its verification
  cost. Also in (0, L + 1].
"""

from __future__ import annotations

from dataclasses import dataclass


class AcceptedLengthReward:
    name = "accepted"

    def __call__(self, accepted: int, step_seconds: float) -> float:
        return float(accepted + 1)


@dataclass
class ThroughputReward:
    """Per-request state: the fastest step time seen so far."""

    name = "throughput"
    fastest_step_seconds: float = float("inf")

    def __call__(self, accepted: int, step_seconds: float) -> float:
        step_seconds = max(step_seconds, 1e-6)
        self.fastest_step_seconds = min(self.fastest_step_seconds, step_seconds)
        return float(accepted + 1) * self.fastest_step_seconds / step_seconds


def make_reward(name: str):
    return ThroughputReward() if name == "throughput" else AcceptedLengthReward()
