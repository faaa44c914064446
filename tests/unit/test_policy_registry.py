"""bandits.registry: the one place a policy string and an arm list become a policy and its arms."""

from __future__ import annotations

import pytest
from banditspec.bandits.costaware import CostAwarePolicy
from banditspec.bandits.exp3spec import EXP3Spec
from banditspec.bandits.fixed import FixedArmPolicy, UniformPolicy
from banditspec.bandits.registry import POLICY_CHOICES, check_policy, resolve_policy
from banditspec.bandits.ucbspec import UCBSpec
from banditspec.bandits.vanilla import VanillaPolicy
from banditspec.config import DEFAULT_POLICY, ArmSpec, GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.errors import BanditSpecValidationError

from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter


def _decoder() -> SpeculativeDecoder:
    drafters = {name: ScriptedDrafter(name, lambda context, n: [1] * n) for name in ("pld", "suffix")}
    return SpeculativeDecoder.for_engine(MockEngine(), drafters)


def test_default_is_a_choice_and_bad_names_are_refused():
    assert DEFAULT_POLICY in POLICY_CHOICES
    assert check_policy("fixed:pld@2") == "fixed:pld@2"
    for bad in ("best", "fixed:", ""):
        with pytest.raises(BanditSpecValidationError) as error:
            check_policy(bad)
        assert error.value.field == "policy" and "costaware" in str(error.value)


@pytest.mark.parametrize(
    "policy, kind, arms",
    [
        ("vanilla", VanillaPolicy, [ArmSpec("", 0)]),
        ("fixed:pld@2", FixedArmPolicy, [ArmSpec("pld", 2)]),
        ("ucbspec", UCBSpec, [ArmSpec("pld", 3), ArmSpec("", 0)]),
        ("exp3spec", EXP3Spec, [ArmSpec("pld", 3), ArmSpec("", 0)]),
        ("uniform", UniformPolicy, [ArmSpec("pld", 3), ArmSpec("", 0)]),
        ("costaware", CostAwarePolicy, [ArmSpec("pld", 3)]),  # plain decoding is always its choice
    ],
)
def test_each_policy_string_becomes_its_policy_and_arms(policy, kind, arms):
    request = GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=4, policy=policy, arms=["pld", "vanilla"],
                                max_draft_len=3)
    session = _decoder().start(request)
    chosen = session.controller.policy
    assert type(chosen) is kind and session.arms == arms


def test_arm_list_errors_name_the_arms_field():
    for arms in ([], ["pld", "pld"], ["nope"]):
        with pytest.raises(BanditSpecValidationError) as error:
            resolve_policy("ucbspec", arms, max_draft_len=4, known_drafters=["pld"])
        assert error.value.field == "arms"


def test_make_policy_builds_only_the_index_bandits_it_names():
    """The other policy strings (costaware, vanilla, fixed:...) are resolved elsewhere: handed to
    make_policy they are refused, whatever their place in the alphabet, not built as a bandit."""
    import numpy as np
    from banditspec.bandits.registry import make_policy

    for name in ("costaware", "vanilla", "fixed:pld", "", "zeta", "UCBSpec"):
        with pytest.raises(BanditSpecValidationError) as error:
            make_policy(name, 3, 4.0, 5.0, np.random.default_rng(0))
        assert error.value.field == "policy"


def test_a_policy_string_from_the_wire_is_matched_by_value():
    """Request strings are decoded from bytes, so they are equal to the names but never the same
    objects: "vanilla" still means the single no-draft arm, whatever arms the request lists."""
    wire = b"vanilla".decode()
    resolved = resolve_policy("".join(["van", "illa"]), ["pld"], max_draft_len=4, known_drafters=["pld"])
    assert resolved.arms == [ArmSpec("", 0)]
    session = _decoder().start(GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=4, policy=wire, arms=["pld"]))
    assert type(session.controller.policy) is VanillaPolicy and session.arms == [ArmSpec("", 0)]


def test_costaware_drops_only_the_vanilla_arm_whatever_the_drafters_are_called():
    """A drafter plugin may name its drafters anything: under costaware only "vanilla" leaves the
    arm list (plain decoding is always its choice), every named drafter stays."""
    resolved = resolve_policy("costaware", ["window", "vanilla", "pld", "zz@2"], max_draft_len=4,
                              known_drafters=["pld", "window", "zz"])
    assert resolved.arms == [ArmSpec("window", 4), ArmSpec("pld", 4), ArmSpec("zz", 2)]


@pytest.mark.parametrize("reward, lowest", [("accepted", 1.0), ("throughput", 0.0)])
def test_index_bandits_are_scaled_to_the_rewards_range(reward, lowest):
    """With max_draft_len L = 3, the reward lies in [1, L + 1] = [1, 4] (accepted + 1) or in
    [0, 4] (throughput): EXP3Spec's loss maps that interval onto [1, 0] and UCBSpec's radius
    uses its width (3, or 4)."""
    def session(policy):
        request = GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=4, policy=policy, arms=["pld", "suffix"],
                                    max_draft_len=3, reward=reward)
        return _decoder().start(request)

    exp3 = session("exp3spec").controller.policy
    assert exp3.loss(lowest) == pytest.approx(1.0)
    assert exp3.loss(4.0) == pytest.approx(0.0)
    assert exp3.loss((lowest + 4.0) / 2) == pytest.approx(0.5)
    assert session("ucbspec").controller.policy.reward_range == pytest.approx(4.0 - lowest)
