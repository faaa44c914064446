"""Bandit policies: formulas against hand-computed values, warm-up, availability, seeding, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from banditspec.bandits.exp3spec import EXP3Spec
from banditspec.bandits.fixed import FixedArmPolicy, UniformPolicy
from banditspec.bandits.registry import POLICY_NAMES, make_policy
from banditspec.bandits.ucbspec import UCBSpec
from banditspec.bandits.vanilla import VanillaPolicy
from banditspec.errors import BanditSpecValidationError


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- UCBSpec


def test_ucb_radius_matches_hand_computation_k2():
    # K=2, L=4, delta=0.5, n=1, t=3: 2*sqrt(2 * (1 + 2 ln(2*9*sqrt(2)/0.5))) = 8.419114
    policy = UCBSpec(n_arms=2, reward_range=4.0)
    policy.update(0, 3.0)
    assert policy.confidence_radius(0, 3) == pytest.approx(8.419113994938975, rel=1e-12)
    assert policy.confidence_radius(1, 3) == math.inf


def test_ucb_radius_matches_hand_computation_k3():
    # K=3, L=4, delta=0.5, n=4, t=10: 2*sqrt(5/16 * (1 + 2 ln(3*100*sqrt(5)/0.5))) = 4.387952
    policy = UCBSpec(n_arms=3, reward_range=4.0)
    for _ in range(4):
        policy.update(2, 1.0)
    assert policy.confidence_radius(2, 10) == pytest.approx(4.38795186033108, rel=1e-12)


def test_ucb_radius_shrinks_with_pulls_and_grows_with_rounds():
    policy = UCBSpec(n_arms=2, reward_range=4.0)
    policy.update(0, 1.0)
    one_pull = policy.confidence_radius(0, 5)
    policy.update(0, 1.0)
    assert policy.confidence_radius(0, 5) < one_pull
    assert policy.confidence_radius(0, 50) > policy.confidence_radius(0, 5)


def test_ucb_warm_up_pulls_each_available_untried_arm_lowest_first():
    policy = UCBSpec(n_arms=4, reward_range=4.0)
    order = []
    for _ in range(3):
        arm = policy.select([3, 1, 2])  # arm 0 unavailable, unsorted input
        order.append(arm)
        policy.update(arm, 1.0)
    assert order == [1, 2, 3]
    assert policy.select([0, 1, 2, 3]) == 0  # arm 0 becomes available: still untried
    assert policy.rounds == 4


def test_ucb_selects_argmax_of_mean_plus_radius():
    policy = UCBSpec(n_arms=2, reward_range=4.0)
    for arm, reward in [(0, 5.0), (1, 1.0)]:
        assert policy.select([0, 1]) == arm
        policy.update(arm, reward)
    assert policy.select([0, 1]) == 0  # equal counts and radius: the higher mean wins
    # many pulls of arm 0 at the same mean as arm 1's single pull: arm 1's radius wins
    policy = UCBSpec(n_arms=2, reward_range=4.0)
    for _ in range(20):
        policy.update(0, 3.0)
    policy.update(1, 3.0)
    assert policy.select([0, 1]) == 1


def test_ucb_an_arm_pulled_once_competes_on_its_index_not_as_untried():
    # K=2, L=4, delta=0.5, t=1. Arm 0: one reward 1 -> 1 + 2*sqrt(2 (1 + 2 ln(2 sqrt2 / 0.5))) = 6.977;
    # arm 1: two rewards 5 -> 5 + 2*sqrt(3/4 (1 + 2 ln(2 sqrt3 / 0.5))) = 8.823. Warm-up is over
    # (both tried): arm 1 wins; re-pulling the once-tried arm first would be a second warm-up.
    policy = UCBSpec(n_arms=2, reward_range=4.0)
    policy.update(0, 1.0)
    policy.update(1, 5.0)
    policy.update(1, 5.0)
    assert policy.select([0, 1]) == 1


def test_ucb_ties_go_to_lowest_index_and_availability_is_respected():
    policy = UCBSpec(n_arms=3, reward_range=4.0)
    for arm in range(3):
        policy.update(arm, 2.0)
    assert policy.select([2, 1, 0]) == 0
    assert policy.select([2, 1]) == 1
    policy.update(1, 5.0)
    assert policy.select([2]) == 2


def test_ucb_finds_the_best_of_three_arms():
    generator = rng(1)
    means = [1.5, 2.0, 3.5]
    policy = UCBSpec(n_arms=3, reward_range=4.0)
    pulls = [0, 0, 0]
    for _ in range(3000):
        arm = policy.select([0, 1, 2])
        pulls[arm] += 1
        policy.update(arm, float(np.clip(generator.normal(means[arm], 1.0), 1.0, 5.0)))
    assert pulls[2] > 0.8 * sum(pulls)


# ---------------------------------------------------------------- EXP3Spec


def test_exp3_first_round_uniform_then_hand_computed_k2():
    policy = EXP3Spec(n_arms=2, max_reward=5.0, reward_range=4.0, rng=rng())
    np.testing.assert_allclose(policy.probabilities([0, 1]), [0.5, 0.5])
    arm = policy.select([0, 1])
    policy.update(arm, 1.0)  # z = (5 - 1) / 4 = 1, Zhat = 1 / 0.5 = 2
    assert policy.cumulative_loss[arm] == pytest.approx(2.0)
    assert policy.learning_rate(2) == pytest.approx(0.41627730557884884)
    # p_2(arm) = exp(-2 eta_2) / (exp(-2 eta_2) + 1) = 0.303105
    assert policy.probabilities([0, 1])[arm] == pytest.approx(0.3031051821872988, rel=1e-12)


def test_exp3_hand_computed_k3_and_restriction_to_available():
    policy = EXP3Spec(n_arms=3, max_reward=5.0, reward_range=4.0, rng=rng(3))
    arm = policy.select([0, 1, 2])
    policy.update(arm, 3.0)  # z = 0.5, Zhat = 0.5 / (1/3) = 1.5
    probs = policy.probabilities([0, 1, 2])
    assert probs[arm] == pytest.approx(0.20833292257722746, rel=1e-12)
    assert probs.sum() == pytest.approx(1.0)
    other = (arm + 1) % 3
    missing = (arm + 2) % 3
    restricted = policy.probabilities([arm, other])
    assert restricted[missing] == 0.0
    assert restricted[arm] == pytest.approx(0.3448270235538706, rel=1e-12)
    assert all(policy.select([arm, other]) in (arm, other) for _ in range(30))


def test_exp3_update_uses_probability_of_the_restricted_draw():
    policy = EXP3Spec(n_arms=4, max_reward=5.0, reward_range=4.0, rng=rng())
    arm = policy.select([1, 3])  # p = 1/2, not 1/4
    policy.update(arm, 1.0)
    assert policy.cumulative_loss[arm] == pytest.approx(2.0)


def test_exp3_loss_is_clipped_to_unit_interval():
    policy = EXP3Spec(n_arms=2, max_reward=5.0, reward_range=4.0, rng=rng())
    assert policy.loss(7.0) == 0.0
    assert policy.loss(-3.0) == 1.0
    assert policy.loss(4.0) == pytest.approx(0.25)


def test_exp3_is_numerically_stable_with_huge_losses():
    policy = EXP3Spec(n_arms=3, max_reward=5.0, reward_range=4.0, rng=rng())
    policy.cumulative_loss[:] = [1e9, 1e9 + 1.0, 5e9]
    probs = policy.probabilities([0, 1, 2])
    assert np.all(np.isfinite(probs)) and probs.sum() == pytest.approx(1.0)
    assert probs[0] > probs[1] > probs[2]


def test_exp3_update_must_follow_its_select():
    policy = EXP3Spec(n_arms=2, max_reward=5.0, reward_range=4.0, rng=rng())
    with pytest.raises(BanditSpecValidationError) as error:
        policy.update(0, 2.0)
    assert error.value.field == "arm"
    arm = policy.select([0, 1])
    policy.update(arm, 2.0)
    with pytest.raises(BanditSpecValidationError):
        policy.update(arm, 2.0)  # once per select


def test_exp3_concentrates_on_the_best_arm():
    generator = rng(2)
    policy = EXP3Spec(n_arms=3, max_reward=5.0, reward_range=4.0, rng=rng(5))
    means = [1.5, 2.5, 4.0]
    for _ in range(3000):
        arm = policy.select([0, 1, 2])
        policy.update(arm, float(np.clip(generator.normal(means[arm], 0.5), 1.0, 5.0)))
    assert policy.probabilities([0, 1, 2])[2] > 0.9


# ---------------------------------------------------------------- seeding, baselines, registry


def _arm_sequence(name: str, seed: int) -> list[int]:
    policy = make_policy(name, 4, reward_range=4.0, max_reward=5.0, rng=rng(seed))
    arms = []
    for step in range(60):
        arm = policy.select([0, 1, 2, 3])
        policy.update(arm, float(1 + (step * 7 + arm) % 5))
        arms.append(arm)
    return arms


@pytest.mark.parametrize("name", ["exp3spec", "uniform"])
def test_random_policies_are_reproducible_from_their_seed(name):
    assert _arm_sequence(name, 11) == _arm_sequence(name, 11)
    assert _arm_sequence(name, 11) != _arm_sequence(name, 12)


def test_uniform_covers_available_arms_only():
    policy = UniformPolicy(n_arms=5, rng=rng())
    seen = {policy.select([0, 2, 4]) for _ in range(200)}
    assert seen == {0, 2, 4}


def test_fixed_arm_and_fallback_to_lowest_available():
    policy = FixedArmPolicy(arm=2, n_arms=4)
    assert policy.select([0, 1, 2, 3]) == 2
    assert policy.select([3, 1]) == 1
    policy.update(2, 3.0)  # learns nothing, accepts the call


def test_vanilla_is_the_single_no_draft_arm():
    policy = VanillaPolicy()
    assert policy.n_arms == 1 and policy.select([0]) == 0
    assert isinstance(policy, FixedArmPolicy)


def test_registry_builds_each_named_policy():
    assert set(POLICY_NAMES) == {"ucbspec", "exp3spec", "uniform"}
    kinds = {name: type(make_policy(name, 3, 4.0, 5.0, rng())) for name in POLICY_NAMES}
    assert kinds == {"ucbspec": UCBSpec, "exp3spec": EXP3Spec, "uniform": UniformPolicy}
    with pytest.raises(BanditSpecValidationError) as error:
        make_policy("thompson", 3, 4.0, 5.0, rng())
    assert error.value.field == "policy" and "ucbspec" in str(error.value)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: UCBSpec(0, 4.0), "n_arms"),
        (lambda: UCBSpec(2.5, 4.0), "n_arms"),
        (lambda: UCBSpec(2, 0.0), "reward_range"),
        (lambda: UCBSpec(2, float("nan")), "reward_range"),
        (lambda: UCBSpec(2, 4.0, delta=1.0), "delta"),
        (lambda: UCBSpec(2, 4.0, delta=0.0), "delta"),
        (lambda: EXP3Spec(2, 5.0, -1.0, rng()), "reward_range"),
        (lambda: EXP3Spec(2, float("inf"), 4.0, rng()), "max_reward"),
        (lambda: EXP3Spec(2, 5.0, 4.0, rng=None), "rng"),
        (lambda: UniformPolicy(2, rng=np.random.RandomState(0)), "rng"),
        (lambda: FixedArmPolicy(arm=3, n_arms=3), "arm"),
    ],
)
def test_constructor_arguments_are_validated(build, field):
    with pytest.raises(BanditSpecValidationError) as error:
        build()
    assert error.value.field == field and str(error.value).startswith(field)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_select_and_update_arguments_are_validated(name):
    policy = make_policy(name, 3, 4.0, 5.0, rng())
    for available in ([], [3], [-1], [True]):
        with pytest.raises(BanditSpecValidationError) as error:
            policy.select(available)
        assert error.value.field == "available"
    arm = policy.select([0, 1, 2])
    with pytest.raises(BanditSpecValidationError) as error:
        policy.update(arm, float("nan"))
    assert error.value.field == "reward"
    with pytest.raises(BanditSpecValidationError) as error:
        policy.update(7, 1.0)
    assert error.value.field == "arm"
