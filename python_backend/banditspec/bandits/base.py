"""The policy protocol shared by UCBSpec, EXP3Spec and the baselines.

Arms are indices 0..n_arms-1. ``select`` must return one of ``available``
(arms whose drafter failed are removed from it for the rest of a request).
Rewards lie in [0, max_reward]; with the paper's reward (accepted + 1) and
max speculation length L, rewards lie in [1, L + 1] and the range width is L.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Policy(Protocol):
    n_arms: int

    def select(self, available: Sequence[int]) -> int: ...

    def update(self, arm: int, reward: float) -> None: ...
