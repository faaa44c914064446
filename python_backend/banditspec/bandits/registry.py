"""Policies by name: the one place that turns a request's ``policy`` string and arm list
into a policy and the arms it runs over.

Names (``config.DEFAULT_POLICY`` is the default):

- ``costaware``: the cost-aware controller (:mod:`banditspec.bandits.costaware`); an arm
  names a drafter (``@gamma`` caps its length), plain decoding is always a choice;
- ``vanilla``: plain decoding, the single no-draft arm (:class:`VanillaPolicy`);
- ``ucbspec`` | ``exp3spec`` | ``uniform`` (:data:`POLICY_NAMES`): bandits over arm indices,
  built by :func:`make_policy` (the simulator uses it directly);
- ``fixed:<arm>``: always that arm (:class:`FixedArmPolicy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from banditspec.bandits.base import Policy
from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import CostAwarePolicy, SharedAcceptance, regime_of
from banditspec.bandits.exp3spec import EXP3Spec
from banditspec.bandits.fixed import FixedArmPolicy, UniformPolicy
from banditspec.bandits.ucbspec import UCBSpec
from banditspec.bandits.vanilla import VanillaPolicy
from banditspec.config import DEFAULT_POLICY, VANILLA_ARM, ArmSpec, parse_arm
from banditspec.errors import BanditSpecValidationError

COSTAWARE = "costaware"
VANILLA = "vanilla"
FIXED = "fixed"
FIXED_PREFIX = FIXED + ":"
POLICY_NAMES: tuple[str, ...] = ("ucbspec", "exp3spec", "uniform")  # index bandits (make_policy)
POLICY_CHOICES: tuple[str, ...] = (COSTAWARE, VANILLA, *POLICY_NAMES)  # plus "fixed:<arm>"
# the policies that learn which arm pays, per request (what the benchmarks compare against fixed arms)
ADAPTIVE_POLICIES: tuple[str, ...] = (COSTAWARE, "ucbspec", "exp3spec")
assert DEFAULT_POLICY in POLICY_CHOICES


def make_policy(name: str, n_arms: int, reward_range: float, max_reward: float, rng: np.random.Generator) -> Policy:
    """A fresh index bandit (one per request), ``name`` in :data:`POLICY_NAMES`.

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


def check_policy(policy: str, field: str = "policy") -> str:
    """``policy`` if it names a policy, else BanditSpecValidationError(field)."""
    if not (policy in POLICY_CHOICES or (policy.startswith(FIXED_PREFIX) and len(policy) > len(FIXED_PREFIX))):
        raise BanditSpecValidationError(
            field, f"unknown policy {policy!r}; choose from {', '.join(POLICY_CHOICES)} or fixed:<arm>"
        )
    return policy


@dataclass(frozen=True)
class ResolvedPolicy:
    """A request's policy kind (costaware, vanilla, fixed or a :data:`POLICY_NAMES` name)
    and the arms it runs over."""

    kind: str
    arms: list[ArmSpec]


def resolve_policy(
    policy: str, arm_names: Sequence[str], *, max_draft_len: int, known_drafters: Sequence[str]
) -> ResolvedPolicy:
    """The policy named by ``policy`` and its arms; ``arm_names`` is the request's arm list
    (or the server's default one). Raises BanditSpecValidationError naming the field."""
    check_policy(policy)
    known = list(known_drafters)
    if policy == VANILLA:
        return ResolvedPolicy(VANILLA, [ArmSpec("", 0)])
    if policy.startswith(FIXED_PREFIX):
        return ResolvedPolicy(FIXED, [parse_arm(policy[len(FIXED_PREFIX):], max_draft_len, known)])
    names = list(arm_names)
    if not names:
        raise BanditSpecValidationError("arms", "the arm list is empty")
    if policy == COSTAWARE:  # it chooses gamma per round: an arm names a drafter (@gamma caps it)
        names = [n for n in names if n != VANILLA_ARM]  # plain decoding is always a choice
        if not names:
            return ResolvedPolicy(policy, [])
    arms = [parse_arm(n, max_draft_len, known) for n in names]
    if len({a.name for a in arms}) != len(arms):
        raise BanditSpecValidationError("arms", "an arm is listed twice")
    return ResolvedPolicy(policy, arms)


def build_policy(
    resolved: ResolvedPolicy,
    *,
    max_draft_len: int,
    seed: int,
    reward: str,
    cost_model: CostModel,
    shared_acceptance: SharedAcceptance,
    costaware_objective: str = "ratio",
    temperature: float = 0.0,
) -> Policy | CostAwarePolicy:
    """A fresh policy for one request: a :class:`CostAwarePolicy` for costaware (it chooses
    a drafter and gamma; ``costaware_objective``: see its module), else an index bandit over
    ``resolved.arms``; ``temperature``: the request's, whose sampling regime costaware's
    server-wide statistics are kept in."""
    if resolved.kind == COSTAWARE:
        return CostAwarePolicy([a.drafter for a in resolved.arms], max_draft_len, cost_model, shared_acceptance,
                               objective=costaware_objective, regime=regime_of(temperature))
    if resolved.kind == VANILLA:
        return VanillaPolicy()
    if resolved.kind == FIXED:
        return FixedArmPolicy(arm=0, n_arms=len(resolved.arms))
    # accepted + 1 lies in [1, L + 1] (width L); the throughput reward in [0, L + 1].
    width = float(max_draft_len + 1 if reward == "throughput" else max_draft_len)
    return make_policy(
        resolved.kind, n_arms=len(resolved.arms), reward_range=width, max_reward=float(max_draft_len + 1),
        rng=np.random.default_rng(seed),
    )
