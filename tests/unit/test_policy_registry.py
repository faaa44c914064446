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
from banditspec.decoder import SpeculativeDecoder
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
    chosen = session.controller if policy == "costaware" else session.policy
    assert type(chosen) is kind and session.arms == arms


def test_arm_list_errors_name_the_arms_field():
    for arms in ([], ["pld", "pld"], ["nope"]):
        with pytest.raises(BanditSpecValidationError) as error:
            resolve_policy("ucbspec", arms, max_draft_len=4, known_drafters=["pld"])
        assert error.value.field == "arms"
