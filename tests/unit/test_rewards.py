"""banditspec.decoding.rewards: the reward a policy learns from, one per step, against values derived
from the definitions in the module docstring (not from the code)."""

from __future__ import annotations

import pytest
from banditspec.bandits.cost_model import CostModel
from banditspec.decoding.rewards import AcceptedLengthReward, ThroughputReward, make_reward


def test_the_papers_reward_is_the_accepted_length_plus_one_whatever_the_time():
    reward = AcceptedLengthReward()
    assert [reward(accepted, 0.05) for accepted in range(6)] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert reward(3, 10.0) == reward(3, 0.001) == 4.0


def test_the_throughput_reward_is_tokens_per_second_in_units_of_plain_decoding():
    """Plain decoding costs 0.05 s a token here; a step's reward is its tokens (accepted + 1)
    per second over plain decoding's one token per 0.05 s, clipped to [0, L + 1] (L = 3)."""
    reward = ThroughputReward(CostModel.fixed([1.0, 1.2, 1.4, 1.6], 0.05), max_draft_len=3)
    assert reward(0, 0.05) == pytest.approx(1.0)  # one token in a plain step's time: plain's rate
    assert reward(0, 0.10) == pytest.approx(0.5)  # one token in twice that time
    assert reward(1, 0.05) == pytest.approx(2.0)  # two tokens in a plain step's time
    assert reward(1, 0.10) == pytest.approx(1.0)
    assert reward(2, 0.06) == pytest.approx(2.5)  # three tokens in 1.2 plain steps
    assert reward(3, 0.01) == 4.0  # 20x plain, clipped to L + 1
    assert reward(3, 0.0) == 4.0  # a step timed at zero (coarse clock) is the fastest, not an error


@pytest.mark.parametrize("name", ["throughput", b"throughput".decode()])  # a request's string is a new object
def test_make_reward_picks_the_reward_by_name(name):
    model = CostModel.fixed([1.0, 1.5], 0.02)
    reward = make_reward(name, model, max_draft_len=1)
    assert reward.name == "throughput" and reward(1, 0.02) == pytest.approx(2.0)
    accepted = make_reward(b"accepted".decode(), model, max_draft_len=1)
    assert accepted.name == "accepted" and accepted(1, 0.02) == 2.0 and accepted(1, 0.04) == 2.0


def test_a_throughput_reward_without_a_server_cost_model_uses_the_prior_yardstick():
    """Without the server's cost model, plain decoding is priced at the prior 0.05 s a token,
    for any L, the shortest included."""
    reward = make_reward("throughput", max_draft_len=1)
    assert reward(0, 0.05) == pytest.approx(1.0)
    assert reward(0, 0.10) == pytest.approx(0.5)
    assert reward(1, 0.025) == pytest.approx(2.0)  # 4x plain, clipped to L + 1 = 2
