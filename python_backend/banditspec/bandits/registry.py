"""Policies by name, for the server's ``policy`` input and the simulator.

``fixed:<arm name>`` is resolved by the decoding loop (it knows the arm names) into a
:class:`~banditspec.bandits.fixed.FixedArmPolicy`; it is not built here.
"""

from __future__ import annotations

import numpy as np

from banditspec.bandits.base import Policy
from banditspec.bandits.exp3spec import EXP3Spec
from banditspec.bandits.fixed import UniformPolicy
from banditspec.bandits.ucbspec import UCBSpec
from banditspec.errors import BanditSpecValidationError

POLICY_NAMES: tuple[str, ...] = ("ucbspec", "exp3spec", "uniform")


def make_policy(name: str, n_arms: int, reward_range: float, max_reward: float, rng: np.random.Generator) -> Policy:
    """A fresh policy (one per request).

    With the paper's reward (accepted + 1) and max speculation length L:
    reward_range = L, max_reward = L + 1. ``rng`` is used by the random policies only.
    """
    if name == "ucbspec":
        return UCBSpec(n_arms, reward_range=reward_range)
    if name == "exp3spec":
        return EXP3Spec(n_arms, max_reward=max_reward, reward_range=reward_range, rng=rng)
    if name == "uniform":
        return UniformPolicy(n_arms, rng=rng)
    raise BanditSpecValidationError("policy", f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
