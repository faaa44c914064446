"""Stopping-time regret of the bandit policies on simulated arms (paper §6.1, "TGD").

Arm i accepts a truncated geometric number of draft tokens per step: each of the
L drafted tokens is accepted with probability alpha_i until the first rejection,
so P(accepted = k) = alpha_i**k (1 - alpha_i) for k < L and P(accepted = L) = alpha_i**L.
The step's reward is Y = accepted + 1 (the target always adds one token).

Regret (the paper's stopping-time regret): generating N tokens with policy pi takes
tau_pi(N) = min{t : Y_1 + ... + Y_t >= N} steps; the regret is
E[tau_pi(N)] - E[tau_best(N)], where tau_best always pulls the arm of largest mean
reward. E[tau_best(N)] is computed exactly by the renewal recursion
E[tau(n)] = 1 + sum_y P(Y = y) E[tau(n - y)], E[tau(n <= 0)] = 0.

A policy does not know N, so one trajectory run until max(lengths) tokens gives
tau_pi(N) for every length at once. Every policy of a run sees the same reward
table (the k-th pull of arm i returns table[i, k]): common random numbers, so the
comparison between policies has less noise.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from banditspec.bandits.registry import POLICY_NAMES, make_policy
from banditspec.errors import BanditSpecValidationError
from banditspec.paths import cache_dir


@dataclass(frozen=True)
class TruncatedGeometricArms:
    """alphas: per-token acceptance rate of each arm, each in [0, 1); max_draft_len: L >= 1."""

    alphas: tuple[float, ...]
    max_draft_len: int

    def __post_init__(self) -> None:
        if not self.alphas or not all(0.0 <= a < 1.0 for a in self.alphas):
            raise BanditSpecValidationError("alphas", f"need one or more rates in [0, 1), got {self.alphas!r}")
        if self.max_draft_len < 1:
            raise BanditSpecValidationError("L", f"must be >= 1, got {self.max_draft_len!r}")

    @property
    def n_arms(self) -> int:
        return len(self.alphas)

    def reward_pmf(self, arm: int) -> np.ndarray:
        """pmf: float64 [L + 2], pmf[y] = P(Y = y) (pmf[0] = 0)."""
        alpha, length = self.alphas[arm], self.max_draft_len
        pmf = np.zeros(length + 2)
        pmf[1 : length + 1] = [alpha**k * (1 - alpha) for k in range(length)]
        pmf[length + 1] = alpha**length
        return pmf

    def mean_rewards(self) -> np.ndarray:
        """float64 [n_arms], E[Y] per arm = (1 - alpha**(L+1)) / (1 - alpha)."""
        return np.array([self.reward_pmf(arm) @ np.arange(self.max_draft_len + 2) for arm in range(self.n_arms)])

    def sample_rewards(self, rng: np.random.Generator, pulls: int) -> np.ndarray:
        """table: int64 [n_arms, pulls], rewards of the first ``pulls`` pulls of each arm."""
        failure = 1.0 - np.asarray(self.alphas)[:, None]
        leading_successes = rng.geometric(failure, size=(self.n_arms, pulls)) - 1
        return np.minimum(leading_successes, self.max_draft_len) + 1


def expected_stopping_time(pmf: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """float64 [len(lengths)]: E[steps to reach >= N tokens] always pulling one arm with reward ``pmf``."""
    top = max(lengths)
    expected = np.zeros(top + 1)
    probs = pmf[1:]  # rewards 1 .. L + 1
    for n in range(1, top + 1):
        previous = expected[np.maximum(n - np.arange(1, len(probs) + 1), 0)]
        expected[n] = 1.0 + probs @ previous
    return expected[list(lengths)]


def stopping_times(policy_name: str, table: np.ndarray, lengths: Sequence[int], max_reward: float,
                   reward_range: float, rng: np.random.Generator) -> np.ndarray:
    """int64 [len(lengths)]: steps a fresh policy needs to generate each length, rewards from ``table``."""
    n_arms = table.shape[0]
    policy = make_policy(policy_name, n_arms, reward_range=reward_range, max_reward=max_reward, rng=rng)
    rewards, arms, pulls = table.tolist(), list(range(n_arms)), [0] * n_arms
    generated, history = 0, []
    while generated < max(lengths):
        arm = policy.select(arms)
        reward = rewards[arm][pulls[arm]]
        pulls[arm] += 1
        policy.update(arm, reward)
        generated += reward
        history.append(generated)
    return np.searchsorted(np.array(history), np.asarray(lengths), side="left") + 1


@dataclass
class RegretTable:
    """regrets: float64 [n_policies, runs, n_lengths], tau_pi(N) - E[tau_best(N)] per run."""

    policies: tuple[str, ...]
    lengths: tuple[int, ...]
    regrets: np.ndarray

    def mean(self) -> np.ndarray:
        """float64 [n_policies, n_lengths]."""
        return self.regrets.mean(axis=1)

    def stderr(self) -> np.ndarray:
        """float64 [n_policies, n_lengths]; 0 with a single run."""
        runs = self.regrets.shape[1]
        return self.regrets.std(axis=1, ddof=1) / math.sqrt(runs) if runs > 1 else np.zeros_like(self.mean())


def simulate_regret(arms: TruncatedGeometricArms, policies: Sequence[str], lengths: Sequence[int], runs: int,
                    seed: int, progress: bool = False) -> RegretTable:
    """Mean stopping-time regret of each policy, ``runs`` seeded runs per policy."""
    if runs < 1:
        raise BanditSpecValidationError("runs", f"must be >= 1, got {runs!r}")
    if not lengths or min(lengths) < 1:
        raise BanditSpecValidationError("lengths", f"need one or more lengths >= 1, got {lengths!r}")
    best = int(np.argmax(arms.mean_rewards()))
    oracle = expected_stopping_time(arms.reward_pmf(best), lengths)
    max_reward, reward_range = arms.max_draft_len + 1.0, float(arms.max_draft_len)
    regrets = np.zeros((len(policies), runs, len(lengths)))
    with tqdm(total=runs * len(policies), desc="simulate", disable=not progress) as bar:
        for run in range(runs):
            table = arms.sample_rewards(np.random.default_rng([seed, run]), max(lengths))
            for index, name in enumerate(policies):
                policy_rng = np.random.default_rng([seed, run, index + 1])
                steps = stopping_times(name, table, lengths, max_reward, reward_range, policy_rng)
                regrets[index, run] = steps - oracle
                bar.update()
    return RegretTable(tuple(policies), tuple(lengths), regrets)


def format_table(table: RegretTable) -> str:
    """Policy x length -> 'mean ± stderr' as aligned text."""
    mean, err = table.mean(), table.stderr()
    cells = [[f"{m:.1f} ± {e:.1f}" for m, e in zip(mean[p], err[p])] for p in range(len(table.policies))]
    width = max(12, *(len(c) for row in cells for c in row))
    header = f"{'policy':<10}" + "".join(f"{f'N={n}':>{width + 2}}" for n in table.lengths)
    rows = [f"{name:<10}" + "".join(f"{c:>{width + 2}}" for c in cells[p]) for p, name in enumerate(table.policies)]
    return "\n".join([header, *rows])


def plot_regret(table: RegretTable, path: Path, title: str) -> None:
    """Regret vs number of generated tokens (log x axis), one line per policy, error bars = stderr."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, mean, err in zip(table.policies, table.mean(), table.stderr()):
        axes.errorbar(table.lengths, mean, yerr=err, marker="o", capsize=3, label=name)
    axes.set_xscale("log")
    axes.set_xlabel("tokens generated N")
    axes.set_ylabel("stopping-time regret (steps)")
    axes.set_title(title, fontsize=9)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _numbers(text: str, kind: type) -> tuple:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``banditspec simulate``."""
    parser.add_argument("--lengths", type=lambda s: _numbers(s, int), default=(250, 500, 1000, 2000, 4000, 8000, 16000, 32000),
                        help="tokens to generate, comma-separated (default 250,...,32000)")
    parser.add_argument("--runs", type=int, default=20, help="seeded runs per policy (default 20)")
    parser.add_argument("--L", type=int, default=4, help="max speculation length L (default 4)")
    parser.add_argument("--alphas", type=lambda s: _numbers(s, float), default=(0.2, 0.4, 0.6, 0.9),
                        help="per-token acceptance rate of each arm (default 0.2,0.4,0.6,0.9)")
    parser.add_argument("--policies", type=lambda s: tuple(p for p in s.split(",") if p),
                        default=POLICY_NAMES, help=f"comma-separated (default {','.join(POLICY_NAMES)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png", type=Path, default=None,
                        help="where to write the plot (default <cache>/simulate_regret.png)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace) -> int:
    """Simulate, print the regret table, write the plot; 0 on success, 2 on bad options."""
    try:
        arms = TruncatedGeometricArms(tuple(args.alphas), args.L)
        for name in args.policies:
            make_policy(name, arms.n_arms, reward_range=1.0, max_reward=1.0, rng=np.random.default_rng(0))
        table = simulate_regret(arms, args.policies, sorted(args.lengths), args.runs, args.seed,
                                progress=not args.no_progress)
    except BanditSpecValidationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    means = ", ".join(f"{m:.3f}" for m in arms.mean_rewards())
    print(f"TGD arms alpha={','.join(map(str, arms.alphas))} L={arms.max_draft_len}: E[Y] = {means}; "
          f"{args.runs} runs, seed {args.seed}. Regret = E[steps] - E[steps of the best arm].")
    print(format_table(table))
    png = args.png or cache_dir() / "simulate_regret.png"
    plot_regret(table, png, f"TGD alphas={','.join(map(str, arms.alphas))}, L={arms.max_draft_len}, {args.runs} runs")
    print(f"plot: {png}")
    return 0
