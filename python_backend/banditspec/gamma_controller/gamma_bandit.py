"""The learner of the server-wide controller: UCBSpec over speculation lengths for one
load context, with discounted statistics and an optional prior.

Arms are the speculation lengths gamma = 0..L (gamma = 0 is plain decoding); a reward is
a measured throughput in tokens/s. Throughput has no fixed range (it depends on the
hardware and on the load), so rewards are used relative to ``scale``, the best
estimated mean of this context, and UCBSpec's confidence radius (Hou et al., 2025,
Algorithm 4) is taken with reward range 1:

    cr_i = exploration * (1/2) * sqrt( (1 + n_i) / n_i**2 * (1 + 2 ln(K t**2 sqrt(1 + n_i) / delta)) )

with K = L + 1 arms, n_i the arm's (discounted, prior-augmented) count and t the sum
of the counts. ``exploration = 1`` is the paper's radius; a server uses less (0.1 by
default, chosen on a simulated batched server), because a reward here averages many
steps and its noise is far below the worst case the bound covers.

Non-stationarity: every update multiplies all counts and sums by ``discount`` (discounted
UCB), so an arm not tried for a while regains a large radius and is tried again.

Unimodality (on by default): throughput against gamma rises while drafting pays and
falls once verification costs more than it returns, so the choice is restricted to the
current leader (best estimated mean) and its two neighbours, as in unimodal bandits
(Combes & Proutiere, 2014). A context then walks from gamma = L towards its best gamma
instead of paying for every far-off gamma, and a change of load moves it step by step.

Prior: a context seen for the first time may borrow the relative means of a
neighbouring context (``set_prior``, from the neighbour's own rewards only). They count
as ``prior_weight`` pulls of each gamma the neighbour knows, discounted like real
rewards, so the context starts from its neighbour's best gamma instead of trying every
gamma once, and forgets the borrowed values as its own come in.
"""

from __future__ import annotations

import math

import numpy as np

from banditspec.checks import is_int
from banditspec.errors import BanditSpecValidationError


def ucbspec_radius(count: float, total: float, n_arms: int, delta: float) -> float:
    """UCBSpec's confidence radius for reward range 1; +inf for an untried arm."""
    if count <= 0:
        return math.inf
    t = max(total, 1.0)
    log_term = math.log(n_arms * t * t * math.sqrt(1 + count) / delta)
    return 0.5 * math.sqrt((1 + count) / count**2 * (1 + 2 * log_term))


class DiscountedGammaUCB:
    """UCBSpec over gamma = 0..max_gamma for one context. Not thread-safe (the
    controller holds a lock).

    counts:       float64 [max_gamma + 1]  discounted number of rewards per gamma
    sums:         float64 [max_gamma + 1]  discounted sum of rewards (tokens/s) per gamma
    prior:        float64 [max_gamma + 1]  relative means borrowed from another context (NaN: none)
    prior_counts: float64 [max_gamma + 1]  their weight, discounted like the rewards
    """

    def __init__(
        self,
        max_gamma: int,
        *,
        discount: float = 0.98,
        exploration: float = 0.1,
        delta: float = 0.5,
        prior_weight: float = 1.0,
        unimodal: bool = True,
    ):
        if not is_int(max_gamma) or max_gamma < 1:
            raise BanditSpecValidationError("max_gamma", f"must be an integer >= 1, got {max_gamma!r}")
        if not 0 < discount <= 1:
            raise BanditSpecValidationError("discount", f"must be in (0, 1], got {discount!r}")
        if not 0 <= exploration < math.inf:
            raise BanditSpecValidationError("exploration", f"must be a finite number >= 0, got {exploration!r}")
        if not 0 < delta < 1:
            raise BanditSpecValidationError("delta", f"must be in (0, 1), got {delta!r}")
        if not 0 <= prior_weight < math.inf:
            raise BanditSpecValidationError("prior_weight", f"must be a finite number >= 0, got {prior_weight!r}")
        self.max_gamma = max_gamma
        self.discount = float(discount)
        self.exploration = float(exploration)
        self.delta = float(delta)
        self.prior_weight = float(prior_weight)
        self.unimodal = bool(unimodal)
        self.counts = np.zeros(max_gamma + 1, dtype=np.float64)
        self.sums = np.zeros(max_gamma + 1, dtype=np.float64)
        self.prior = np.full(max_gamma + 1, np.nan)
        self.prior_counts = np.zeros(max_gamma + 1, dtype=np.float64)
        self.updates = 0

    @property
    def n_arms(self) -> int:
        return self.max_gamma + 1

    @property
    def scale(self) -> float:
        """The best estimated mean reward (tokens/s) among gammas with rewards; 0 before any."""
        tried = self.counts > 0
        return float(np.max(self.sums[tried] / self.counts[tried])) if tried.any() else 0.0

    def set_prior(self, relative_means: np.ndarray) -> None:
        """Borrow relative means (float [max_gamma + 1]; NaN = nothing known) from another context."""
        prior = np.asarray(relative_means, dtype=np.float64).reshape(-1)
        if prior.shape != (self.n_arms,) or np.any(np.isinf(prior)):
            raise BanditSpecValidationError("prior", f"must be {self.n_arms} finite numbers or NaN, got {prior.shape}")
        self.prior = prior.copy()
        self.prior_counts = np.where(np.isnan(prior), 0.0, self.prior_weight)

    def relative_means(self) -> np.ndarray:
        """float64 [max_gamma + 1]: each gamma's estimated reward / scale, the prior included;
        NaN for a gamma with neither rewards nor prior."""
        counts, means = self._effective()
        return np.where(counts > 0, means, np.nan)

    def observed_relative_means(self) -> np.ndarray:
        """float64 [max_gamma + 1]: mean reward / scale from this context's own rewards
        only (NaN for a gamma it has no reward for): what a neighbour may borrow."""
        scale = self.scale if self.scale > 0 else 1.0
        tried = self.counts > 0
        return np.divide(self.sums, self.counts * scale, out=np.full(self.n_arms, np.nan), where=tried)

    def _effective(self) -> tuple[np.ndarray, np.ndarray]:
        """(counts, relative means), both float64 [max_gamma + 1], the prior included."""
        scale = self.scale if self.scale > 0 else 1.0
        prior = np.nan_to_num(self.prior, nan=0.0)
        counts = self.counts + self.prior_counts
        weighted = self.sums / scale + self.prior_counts * prior
        means = np.divide(weighted, counts, out=np.zeros(self.n_arms), where=counts > 0)
        return counts, means

    def scores(self) -> np.ndarray:
        """float64 [max_gamma + 1]: relative mean + radius per gamma (+inf when untried)."""
        counts, means = self._effective()
        total = float(counts.sum())
        radius = np.array([ucbspec_radius(c, total, self.n_arms, self.delta) for c in counts])
        return means + self.exploration * radius

    def select(self) -> int:
        """The gamma to play next. Untried gammas first, the longest first (the server's
        behaviour without a controller); then the highest score, ties to the longer gamma."""
        scores = self.scores()
        if self.unimodal:
            counts, means = self._effective()
            if counts.any():
                known = np.where(counts > 0, means, -np.inf)
                leader = int(np.flatnonzero(known == known.max())[-1])
                outside = np.ones(self.n_arms, dtype=bool)
                outside[max(0, leader - 1) : leader + 2] = False
                scores = np.where(outside, -np.inf, scores)
        best = np.flatnonzero(scores == scores.max())
        return int(best[-1])

    def update(self, gamma: int, reward: float) -> None:
        """One measured throughput (tokens/s, >= 0) for ``gamma``."""
        if not is_int(gamma) or not 0 <= gamma <= self.max_gamma:
            raise BanditSpecValidationError("gamma", f"must be an integer in 0..{self.max_gamma}, got {gamma!r}")
        if not math.isfinite(reward) or reward < 0:
            raise BanditSpecValidationError("reward", f"must be a finite number >= 0, got {reward!r}")
        self.counts *= self.discount
        self.sums *= self.discount
        self.prior_counts *= self.discount
        self.counts[gamma] += 1.0
        self.sums[gamma] += reward
        self.updates += 1

    def best_gamma(self) -> int | None:
        """The gamma with the highest estimated reward (no exploration); None before any data."""
        means = self.relative_means()
        if np.all(np.isnan(means)):
            return None
        best = np.nanmax(means)
        return int(np.flatnonzero(means == best)[-1])
