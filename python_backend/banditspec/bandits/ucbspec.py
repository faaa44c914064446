"""UCBSpec (Hou et al., ICML 2025, Algorithms 4/8): optimism for stochastic rewards.

Round t (1-based count of ``select`` calls, this one included):

* warm-up: an available arm never updated yet is pulled first (lowest index);
* otherwise I_t = argmax over available arms of  mu_i + cr_i(t), ties to the lowest index,
  with mu_i the mean reward of arm i over its n_i updates and

      cr_i(t) = (R/2) * sqrt( (1 + n_i) / n_i**2 * (1 + 2 ln(K t**2 sqrt(1 + n_i) / delta)) )

  where K = n_arms and R = ``reward_range`` (the width of the reward interval: L for
  the paper's reward accepted + 1 in [1, L + 1]).

The bonus depends on each arm's own count n_i (not on the total pull count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from banditspec.bandits.fixed import check_available, check_n_arms, check_positive, check_update
from banditspec.errors import BanditSpecValidationError


class UCBSpec:
    """Deterministic: needs no random generator.

    counts: int64 [n_arms]   n_i, updates received per arm
    sums:   float64 [n_arms] sum of the rewards received per arm
    """

    def __init__(self, n_arms: int, reward_range: float, delta: float = 0.5):
        self.n_arms = check_n_arms(n_arms)
        self.reward_range = check_positive("reward_range", reward_range)
        self.delta = check_positive("delta", delta)
        if self.delta >= 1:
            raise BanditSpecValidationError("delta", f"must be in (0, 1), got {delta!r}")
        self.counts = np.zeros(self.n_arms, dtype=np.int64)
        self.sums = np.zeros(self.n_arms, dtype=np.float64)
        self.rounds = 0

    def confidence_radius(self, arm: int, t: int) -> float:
        """cr_arm(t) from the current count of ``arm``; +inf while the arm is untried."""
        n = int(self.counts[arm])
        if n == 0:
            return math.inf
        log_term = math.log(self.n_arms * t * t * math.sqrt(1 + n) / self.delta)
        return self.reward_range / 2 * math.sqrt((1 + n) / n**2 * (1 + 2 * log_term))

    def mean(self, arm: int) -> float:
        """mu_arm, the mean reward seen so far (0.0 while untried)."""
        n = int(self.counts[arm])
        return float(self.sums[arm] / n) if n else 0.0

    def select(self, available: Sequence[int]) -> int:
        arms = check_available(available, self.n_arms)
        self.rounds += 1
        untried = [arm for arm in arms if self.counts[arm] == 0]
        if untried:
            return untried[0]
        scores = [self.mean(arm) + self.confidence_radius(arm, self.rounds) for arm in arms]
        return arms[int(np.argmax(scores))]  # argmax takes the first maximum: lowest index

    def update(self, arm: int, reward: float) -> None:
        arm, reward = check_update(arm, reward, self.n_arms)
        self.counts[arm] += 1
        self.sums[arm] += reward
