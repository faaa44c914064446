"""costaware's server-wide acceptance statistics are kept per sampling regime (greedy, or
sampled in a temperature band): a greedy request's evidence does not price a sampled
request's drafts, nor the other way round."""

from __future__ import annotations

import pytest
from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import GREEDY, PLAIN, Candidate, CostAwarePolicy, SharedAcceptance, regime_of
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion

from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, oracle

FLAT = [1.0 + 0.1 * i for i in range(9)]


@pytest.mark.parametrize("temperature, regime", [
    (0.0, GREEDY), (-0.0, GREEDY), (1e-6, "t<=0.5"), (0.5, "t<=0.5"), (0.51, "t<=0.9"), (0.7, "t<=0.9"),
    (0.9, "t<=0.9"), (0.95, "t>0.9"), (1.5, "t>0.9"),
])
def test_regimes_are_greedy_and_temperature_bands(temperature, regime):
    assert regime_of(temperature) == regime


def test_a_regimes_evidence_seeds_only_requests_of_that_regime():
    shared = SharedAcceptance(8, decay=1.0)
    for _ in range(200):  # greedy: the drafter is always right; sampled at 0.7: always wrong
        shared.record("d", 0, 8, 8, 9, regime=GREEDY)
        shared.record("d", 0, 8, 0, 9, regime=regime_of(0.7))
    model = CostModel.fixed(FLAT)
    greedy = CostAwarePolicy(["d"], 8, model, shared, regime=GREEDY)
    sampled = CostAwarePolicy(["d"], 8, model, shared, regime=regime_of(0.8))  # the same band as 0.7
    hot = CostAwarePolicy(["d"], 8, model, shared, regime=regime_of(1.0))  # a band nobody has seen
    assert greedy.best([Candidate("d", 8)], 8).gamma >= 3  # its capped prior: ~0.8 a position
    assert sampled.best([Candidate("d", 8)], 8).drafter is PLAIN
    assert "d" not in hot.prior  # starts cold: the pessimistic prior, not another regime's counts
    assert shared.regimes() == [GREEDY, "t<=0.9"]
    assert shared.as_dict()["d"]["accept_rate"][0] == 1.0 and shared.as_dict("t<=0.9")["d"]["accept_rate"][0] == 0.0


def test_a_request_records_in_its_own_regime():
    shared = SharedAcceptance(4, decay=1.0)
    policy = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared, regime="t<=0.5")
    policy.record("d", 0, 4, 2, 5)
    assert shared.snapshot("d") is None
    counts = shared.snapshot("d", "t<=0.5")
    assert counts is not None and counts.offered[0, :3].tolist() == [1.0, 1.0, 1.0]


def test_the_decoder_keys_each_requests_statistics_by_its_temperature():
    engine = MockEngine()
    decoder = SpeculativeDecoder(drafters={"right": ScriptedDrafter("right", oracle(engine))},
                                 vocab_size=engine.vocab_size, max_context=engine.max_context, eos_id=engine.eos_id,
                                 drafter_deadline_s=None, cost_model=CostModel.fixed(FLAT))
    greedy = decoder.start(GenerationRequest(prompt_ids=[3, 4, 5], max_tokens=30, arms=["right"], max_draft_len=8))
    run_to_completion(engine, greedy)
    assert decoder.shared_acceptance.regimes() == [GREEDY]
    sampled = decoder.start(GenerationRequest(prompt_ids=[3, 4, 5], max_tokens=30, arms=["right"], max_draft_len=8,
                                              temperature=0.7, seed=1))
    assert sampled.controller.policy.regime == "t<=0.9"
    assert sampled.controller.policy.prior == {}  # the greedy evidence does not seed it
    run_to_completion(engine, sampled)
    assert decoder.shared_acceptance.regimes() == [GREEDY, "t<=0.9"]
    again = decoder.start(GenerationRequest(prompt_ids=[3, 4, 5], max_tokens=30, arms=["right"], max_draft_len=8,
                                            temperature=0.6, seed=2))
    assert "right" in again.controller.policy.prior
