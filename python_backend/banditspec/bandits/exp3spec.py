"""EXP3Spec (Hou et al., ICML 2025, Algorithms 5/9): exponential weights for adversarial rewards.

Round t (1-based count of ``select`` calls, this one included):

* loss of a reward Y:  z = clip((max_reward - Y) / reward_range, 0, 1)
  (the paper's z = (L + 1 - Y) / L with max_reward = L + 1, reward_range = L);
* learning rate eta_t = sqrt(ln K / (K t)), K = n_arms;
* p_t,i proportional to exp(-eta_t * Zhat_i) over the available arms, Zhat_i the
  cumulative importance-weighted loss: each update adds z / p_i to the pulled arm
  (p_i: the probability it was drawn with), 0 to the others. p_1 is uniform.
* I_t is drawn from p_t with the injected generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from banditspec.bandits.fixed import check_available, check_n_arms, check_positive, check_rng, check_update
from banditspec.errors import BanditSpecValidationError


class EXP3Spec:
    """cumulative_loss: float64 [n_arms]  Zhat_i, the importance-weighted loss sums."""

    def __init__(self, n_arms: int, max_reward: float, reward_range: float, rng: np.random.Generator):
        self.n_arms = check_n_arms(n_arms)
        self.max_reward = check_positive("max_reward", max_reward)
        self.reward_range = check_positive("reward_range", reward_range)
        self.rng = check_rng(rng)
        self.cumulative_loss = np.zeros(self.n_arms, dtype=np.float64)
        self.rounds = 0
        self._pending: dict[int, float] = {}  # arm drawn by the last select -> its probability

    def learning_rate(self, t: int) -> float:
        """eta_t = sqrt(ln K / (K t))."""
        return math.sqrt(math.log(self.n_arms) / (self.n_arms * t))

    def probabilities(self, available: Sequence[int]) -> np.ndarray:
        """p: float64 [n_arms], the distribution the next ``select`` draws from (0 off ``available``)."""
        arms = check_available(available, self.n_arms)
        losses = self.cumulative_loss[arms]
        weights = np.exp(-self.learning_rate(self.rounds + 1) * (losses - losses.min()))
        probs = np.zeros(self.n_arms, dtype=np.float64)
        probs[arms] = weights / weights.sum()
        return probs

    def select(self, available: Sequence[int]) -> int:
        probs = self.probabilities(available)
        self.rounds += 1
        cdf = np.cumsum(probs)
        arm = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        arm = min(arm, self.n_arms - 1)
        while probs[arm] == 0.0:  # only reachable through rounding at the top of the cdf
            arm -= 1
        self._pending = {arm: float(probs[arm])}
        return arm

    def loss(self, reward: float) -> float:
        """z in [0, 1] for a reward."""
        return min(1.0, max(0.0, (self.max_reward - reward) / self.reward_range))

    def update(self, arm: int, reward: float) -> None:
        """Credit the reward of the arm drawn by the last ``select`` (once)."""
        arm, reward = check_update(arm, reward, self.n_arms)
        if arm not in self._pending:
            raise BanditSpecValidationError("arm", f"arm {arm} was not drawn by the last select")
        self.cumulative_loss[arm] += self.loss(reward) / self._pending.pop(arm)
