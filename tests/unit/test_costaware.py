"""The costaware controller, its cost model, and the two reward defects it came with."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.bandits.cost_model import CostModel, calibrate, calibration_plan
from banditspec.bandits.costaware import Candidate, CostAwarePolicy, HazardCounts, SharedAcceptance
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.rewards import ThroughputReward
from banditspec.decoding.session import run_to_completion
from banditspec.drafters.base import Draft, DrafterTraits
from banditspec.evaluation.replay import VirtualClock
from banditspec.gamma_controller import make_gamma_budget

from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle

PROMPT = [3, 4, 5, 6, 7]


class TimedEngine:
    """A MockEngine whose calls advance a virtual clock by a cost curve (seconds per k fed)."""

    def __init__(self, engine: MockEngine, clock: VirtualClock, relative: list[float], one: float = 0.05,
                 per_context: float = 0.0):
        self.engine, self.clock, self.relative, self.one = engine, clock, relative, one
        self.per_context = per_context  # seconds each token of context adds to a call
        self.vocab_size, self.max_context, self.eos_id = engine.vocab_size, engine.max_context, engine.eos_id
        self.provides_hidden_states = False
        self.fed: list[int] = []

    def verify(self, requests):
        for request in requests:
            k = 1 + len(request.draft_ids)
            self.fed.append(k)
            self.clock.advance(self.one * self.relative[min(k, len(self.relative)) - 1]
                               + self.per_context * len(request.input_ids))
        return self.engine.verify(requests)


def timed_decoder(relative, objective: str = "ratio", bookkeeping: str = "now", **drafter_fns):
    clock = VirtualClock()
    engine = TimedEngine(MockEngine(), clock, relative)
    drafters = {name: ScriptedDrafter(name, fn(engine.engine)) for name, fn in drafter_fns.items()}
    decoder = SpeculativeDecoder(drafters=drafters, vocab_size=engine.vocab_size, max_context=engine.max_context,
                                 eos_id=engine.eos_id, drafter_deadline_s=None, clock=clock,
                                 cost_model=CostModel.fixed(relative, 0.05), costaware_objective=objective,
                                 bookkeeping=bookkeeping)
    return decoder, engine


STEEP = [1.0, 1.6, 2.0, 2.4, 2.8, 3.2, 3.6, 4.0, 4.4] + [4.8 + 0.4 * i for i in range(8)]
FLAT = [1.0 + 0.02 * i for i in range(17)]


# --- the cost model ---------------------------------------------------------------------


def test_cost_model_median_ignores_outliers_and_fills_unobserved_k_monotonically():
    model = CostModel(9, min_observations=3)
    for seconds in (0.050, 0.051, 0.049, 5.0):  # one outlier (a GC pause, a cache miss)
        model.observe(1, seconds)
    for seconds in (0.070, 0.071, 0.069):
        model.observe(3, seconds)
    curve = model.curve()
    assert curve[1] == pytest.approx(0.0505, abs=1e-3)
    assert curve[3] == pytest.approx(0.070, abs=1e-3)
    assert curve[2] == pytest.approx((curve[1] + curve[3]) / 2, abs=2e-3)  # the line through the medians
    assert all(np.diff(curve[1:]) >= 0)
    assert curve[9] > curve[3]


def test_a_noisy_cell_is_pooled_with_its_neighbours_not_carried_to_every_longer_length():
    """The curve is made non-decreasing in k by a weighted isotonic fit: a running maximum
    lifted k = 6..8, each observed 20 times, to the value of k = 5 observed 3 times too high
    (the calibration's k = 5 after 320 tokens on a noisy VM priced k = 5..8 ~15 % high)."""
    model = CostModel(9, min_observations=1)
    truth = [0.020 + 0.0015 * (k - 1) for k in range(1, 10)]
    for k in range(1, 10):
        for _ in range(3 if k == 5 else 20):
            model.observe(k, truth[k - 1] * (1.4 if k == 5 else 1.0))
    curve = model.curve()
    assert all(np.diff(curve[1:]) >= 0)
    for k in (7, 8, 9):  # beyond the pooled block: what was measured
        assert curve[k] == pytest.approx(truth[k - 1], rel=0.01)
    pooled = (3 * 1.4 * truth[4] + 20 * truth[5]) / 23  # k = 5 and 6, by their evidence
    assert curve[5] == pytest.approx(pooled) and curve[6] == pytest.approx(pooled)
    assert curve[6] < 1.05 * truth[5]  # a running maximum: 1.32x


def test_calibration_times_decoding_steps_that_extend_the_engines_cache_in_place():
    """The reference engine extends its KV cache in place only when a step continues the
    sequence its previous call left (engine/kv_buffer.py); any other step copies the cache
    first. Calibration used to send the same prefix with another tail every time, so every
    timed call paid the copy (30-40 ms against 22-24 ms for one token after ~300 here)."""
    from banditspec.serving.runtime import calibrate_cost_model

    clock = VirtualClock()

    class CopyingEngine(MockEngine):
        provides_hidden_states = True

        def __init__(self):
            super().__init__(vocab_size=300, max_context=512)
            self.left: list[int] | None = None  # what the previous call left: input + output
            self.copies = self.steps = 0
            self.hidden: list[tuple[int, int]] = []

        def verify(self, requests):
            (request,) = requests
            sequence = [int(t) for t in request.input_ids]
            if self.left is not None:
                self.steps += 1
                self.copies += sequence != self.left
            self.hidden.append((request.hidden_from, len(sequence)))
            (result,) = super().verify(requests)
            clock.advance(0.020 + 0.002 * len(request.draft_ids) + (0.030 if sequence != self.left else 0.0))
            self.left = sequence + [int(t) for t in result.output_ids]
            return [result]

        def clear(self):
            self.left = None

    class Head:  # a drafter that reads the target's states (Eagle)
        name = "head"
        traits = DrafterTraits(needs_hidden_states=True)

    engine = CopyingEngine()
    decoder = SpeculativeDecoder.for_engine(engine, {"head": Head()}, clock=clock, cost_model=CostModel(6))
    calibrate_cost_model(decoder, engine, max_tokens=5, reps=3, contexts=(16, 200))
    assert engine.copies == 0 and engine.steps >= 3 * (5 + 3)
    assert all(h == n - 1 for h, n in engine.hidden)  # states asked as the decoding loop asks them
    for k in range(1, 6):
        assert decoder.cost_model.verify_seconds(k) == pytest.approx(0.020 + 0.002 * (k - 1))
    assert engine.max_context > max(n for _, n in engine.hidden)


def test_cost_model_prior_until_observed_and_calibration():
    model = CostModel(5, prior_one_token_seconds=0.1, prior_slope=0.5)
    assert model.relative() == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])
    calibrate(model, lambda k: 0.02 + 0.001 * k)
    assert model.calibrated
    assert model.verify_seconds(4) == pytest.approx(0.024)
    assert model.as_dict()["observations"] == [3] * 5


def surface(k: int, context: int) -> float:
    """A CPU-like verify cost: 40 ms + 20 us per context token, each extra token fed
    2 ms + 5 us per context token."""
    return 0.040 + 2e-5 * context + (k - 1) * (0.002 + 5e-6 * context)


def test_cost_model_prices_context_once_the_contexts_spread():
    rng = np.random.default_rng(0)
    model = CostModel(5)
    for _ in range(4):
        for context in (100, 700, 1300):
            for k in range(1, 6):
                model.observe(k, surface(k, context) * rng.uniform(0.99, 1.01), context)
    model.observe(3, 9.0, 700)  # an outlier does not move the cell's median
    for context in (100, 400, 700, 1300, 1600):  # inside and beyond the observed contexts
        assert model.curve(context)[1:].tolist() == pytest.approx([surface(k, context) for k in range(1, 6)], rel=0.02)
    assert model.reference_context() == pytest.approx(700, abs=1)
    assert model.curve().tolist() == model.curve(700).tolist()  # no context: the reference one
    report = model.as_dict()
    assert report["context_ms_per_100"] == pytest.approx([2.0, 0.5], rel=0.1)
    assert report["observations"] == [12, 12, 13, 12, 12]
    # a long draft costs relatively more on a long context: the ratio the controller reads
    assert model.relative(1300)[4] > model.relative(100)[4] + 0.1


def test_cost_model_does_not_price_context_it_has_not_seen_vary_or_that_comes_out_negative():
    narrow = CostModel(3)
    for context in (300, 310, 320):  # 10 tokens apart: a slope would be noise
        for k in (1, 2, 3):
            narrow.observe(k, surface(k, context) * (1.05 if context == 320 else 1.0), context)
    assert narrow.curve(0).tolist() == narrow.curve(2000).tolist()
    assert narrow.as_dict()["context_ms_per_100"] == [0.0, 0.0]
    falling = CostModel(3, min_observations=1)  # noise that makes a long context look cheaper
    for context, scale in ((100, 1.2), (900, 1.0)):
        for k in (1, 2, 3):
            falling.observe(k, 0.05 * (1 + 0.1 * (k - 1)) * scale, context)
    assert falling.curve(100).tolist() == falling.curve(900).tolist()
    assert all(np.diff(falling.curve(5000)[1:]) >= 0)
    # one k only: what context adds is one slope (no per-extra-token term to identify)
    single = CostModel(3, min_observations=1)
    for context in (100, 900):
        single.observe(1, surface(1, context), context)
    assert single.verify_seconds(1, 500) == pytest.approx(surface(1, 500))
    assert single.as_dict()["context_ms_per_100"][1] == 0.0
    with pytest.raises(Exception, match="context_bucket"):
        CostModel(3, context_bucket=0)
    # what is timed when the target loads: every k at one context, three at the other
    assert calibration_plan(9) == [(32, list(range(1, 10))), (320, [1, 5, 9])]
    assert calibration_plan(2, (10, 20, 30)) == [(10, [1, 2]), (20, [1, 2]), (30, [1, 2])]


@pytest.mark.parametrize("objective", ["rate", "ratio"])
def test_a_known_surface_from_a_table_and_the_controller_drafts_shorter_on_a_long_context(objective):
    table = {c: {k: surface(k, c) for k in (1, 2, 3, 5)} for c in (64, 1024)}
    model = CostModel.from_table(table)
    assert model.calibrated and model.verify_seconds(5, 64) == pytest.approx(surface(5, 64))
    assert model.verify_seconds(4, 64) == pytest.approx(surface(4, 64))  # between measured k: the line
    assert model.verify_seconds(5, 1024) == pytest.approx(surface(5, 1024))
    shared = SharedAcceptance(4)
    for _ in range(20):  # the server's rounds so far: ~3 tokens per round at the short context's cost
        shared.record_round(3.0, model.verify_seconds(4, 64))
    policy = CostAwarePolicy(["d"], 4, model, shared, objective=objective)
    for _ in range(60):  # right 70 % at each position: P(accepted >= j) = 0.7^j
        for accepted in (4, 4, 4, 2, 1, 0) if _ % 2 else (4, 3, 3, 2, 1, 0):
            policy.record("d", 0, 4, accepted, 4)
    short, long = (policy.choose([Candidate("d", 4)], 4, context) for context in (64, 3000))
    assert short.gamma > long.gamma >= 0


def test_the_rate_objective_drafts_further_in_a_round_better_than_usual_and_less_in_a_worse_one():
    """Dinkelbach: maximising E - rate * C (rate: the throughput achieved) serves the long-run
    tokens per second; a round's own ratio E / C stops too early when the round is better
    than the usual one (its marginal token is still worth more than the average) and too
    late when it is worse."""
    model = CostModel.fixed([1.0 + 0.2 * i for i in range(9)], 0.05)  # each token fed: +0.2 of one
    shared = SharedAcceptance(8)
    for _ in range(50):  # the server achieves 2 tokens per one-token round's time
        shared.record_round(2.0, 0.05)
    choices = {}
    for objective in ("rate", "ratio"):
        policy = CostAwarePolicy(["good", "poor"], 8, model, shared, objective=objective, prior_weight=0.0)
        for _ in range(1000):  # good: P(accepted >= j) ~ 0.9^j; poor: ~ 0.3^j
            for name, p in (("good", 0.9), ("poor", 0.3)):
                for j in range(8):
                    policy.local[name].offered[0, j] += 1.0
                    policy.local[name].accepted[0, j] += p
        choices[objective] = {name: policy.best([Candidate(name, 8)], 8).gamma for name in ("good", "poor")}
    assert choices["rate"]["good"] > choices["ratio"]["good"]
    assert choices["rate"]["poor"] < choices["ratio"]["poor"]


def test_the_rate_is_the_requests_rounds_seeded_with_the_servers():
    model = CostModel.fixed(FLAT[:5], 0.05)
    cold = CostAwarePolicy(["d"], 4, model, SharedAcceptance(4), objective="rate")
    assert cold.rate(0.05) == pytest.approx(1 / 0.05)  # a cold server: plain decoding's rate
    shared = SharedAcceptance(4)
    shared.record_round(3.0, 0.06)
    assert shared.rate() == pytest.approx(50.0)
    policy = CostAwarePolicy(["d"], 4, model, shared, objective="rate")
    assert policy.rate(0.05) == pytest.approx(50.0)
    shared.record_round(1.0, 1.0)  # later rounds elsewhere: the request keeps its snapshot
    assert policy.rate(0.05) == pytest.approx(50.0)
    choice = policy.choose([], 4)  # plain: 1 token in 0.05 s, against 10 rounds' worth (0.5 s) at 50
    assert choice.drafter is None and choice.seconds == pytest.approx(0.05)
    assert policy.rate(0.05) == pytest.approx((1.0 + 50.0 * 0.5) / (0.05 + 0.5))
    with pytest.raises(ValueError, match="objective"):
        CostAwarePolicy(["d"], 4, model, None, objective="fastest")
    untouched = SharedAcceptance(4)
    CostAwarePolicy(["d"], 4, model, untouched).choose([], 4)  # the default ratio keeps no rate
    assert untouched.rate() is None


# --- decisions ----------------------------------------------------------------------------


def test_plain_decoding_when_no_draft_pays_and_long_drafts_when_they_do():
    shared = SharedAcceptance(4)
    steep = CostModel.fixed(STEEP[:5])
    policy = CostAwarePolicy(["d"], 4, steep, shared)
    for _ in range(50):  # a drafter right 30 % of the time at each position
        policy.record("d", 0, 4, 0, 4)
    for _ in range(20):
        policy.record("d", 0, 4, 1, 4)
    assert policy.choose([Candidate("d", 4)], 4).drafter is None  # 1.3 tokens cannot pay 1.6x

    flat = CostModel.fixed(FLAT[:5])
    good = CostAwarePolicy(["d"], 4, flat, SharedAcceptance(4))
    for _ in range(40):
        good.record("d", 0, 4, 4, 4)
    choice = good.choose([Candidate("d", 4)], 4)
    assert (choice.drafter, choice.gamma) == ("d", 4)
    assert good.choose([Candidate("d", 2)], 4).gamma == 2  # never more than the proposal holds
    assert good.choose([Candidate("d", 4)], 0).drafter is None  # a gamma cap of 0 means plain


def test_context_buckets_are_learned_separately():
    policy = CostAwarePolicy(["d"], 4, CostModel.fixed(STEEP[:5]), None)
    for _ in range(40):
        policy.record("d", 3, 4, 4, 4)  # long matches: always right
        policy.record("d", 1, 4, 0, 4)  # one-token matches: always wrong
    assert policy.choose([Candidate("d", 4, bucket=3)], 4).gamma >= 3
    assert policy.choose([Candidate("d", 4, bucket=1)], 4).drafter is None


def test_costly_drafter_gets_tried_then_dropped_when_it_fails():
    policy = CostAwarePolicy(["eagle"], 4, CostModel.fixed(STEEP[:5]), None)
    assert policy.choose([Candidate("eagle", 4, costly=True)], 4).drafter == "eagle"  # optimism
    for _ in range(60):
        policy.record("eagle", 0, 4, 0, 4)
    assert policy.choose([Candidate("eagle", 4, costly=True)], 4).drafter is None


def test_hazard_counts_respect_censoring():
    counts = HazardCounts(4)
    counts.record(0, proposed=4, accepted=1, known=4)  # position 1 right, 2 wrong, 3-4 never offered
    assert counts.offered[0].tolist() == [1, 1, 0, 0] and counts.accepted[0].tolist() == [1, 0, 0, 0]
    counts.record(0, proposed=4, accepted=2, known=2)  # request ended after 2 known tokens
    assert counts.offered[0].tolist() == [2, 2, 0, 0] and counts.accepted[0].tolist() == [2, 1, 0, 0]


# --- the loop -----------------------------------------------------------------------------


@pytest.mark.parametrize("relative", [STEEP, FLAT], ids=["steep", "flat"])
def test_costaware_is_lossless_and_learns_from_every_cheap_drafter(relative):
    decoder, engine = timed_decoder(relative, right=oracle, wrong=always_wrong)
    expected = engine.engine.vanilla(PROMPT, 60)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=60, arms=["wrong", "right"], max_draft_len=4))
    result = run_to_completion(engine, session)
    assert result.token_ids == expected
    shared = decoder.shared_acceptance.as_dict()
    # full information: both drafters were scored at every step, whichever was chosen
    assert shared["wrong"]["offered"][0] == pytest.approx(shared["right"]["offered"][0], rel=0.2)
    assert shared["wrong"]["accept_rate"][0] == 0.0 and shared["right"]["accept_rate"][0] == 1.0
    chosen = [a for a in result.stats.arms[3:-1]]  # the last step: one token left, nothing to draft
    assert all(a.startswith("right@") for a in chosen)
    assert result.stats.as_dict()["steps"] < 60 / 2


def test_costaware_plain_decoding_when_drafts_are_wrong_and_verify_is_steep():
    decoder, engine = timed_decoder(STEEP, wrong=always_wrong)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=40, arms=["wrong"], max_draft_len=4))
    result = run_to_completion(engine, session)
    assert result.token_ids == engine.engine.vanilla(PROMPT, 40)
    assert result.stats.arms.count("vanilla") >= 38  # at most a try or two before the first score arrives
    assert engine.fed.count(1) >= 38


def test_a_costly_drafter_that_declines_is_scored_and_the_round_still_drafts():
    """Eagle below its confidence cut-off proposes nothing. Before the fix that outcome was
    not scored: the costly drafter's optimism never faded, it was chosen round after round,
    and each such round decoded plainly although a cheap drafter was right (measured on
    SmolLM2 chat: 146 of 220 rounds plain, 21 against 26.6 tokens/s without Eagle)."""
    decoder, engine = timed_decoder(FLAT, right=oracle, shy=lambda _engine: (lambda context, max_len: []))
    decoder.drafters["shy"].traits = DrafterTraits(costly=True)  # proposes only when chosen, like Eagle
    request = GenerationRequest(prompt_ids=PROMPT, max_tokens=60, arms=["shy", "right"], max_draft_len=4)
    result = run_to_completion(engine, decoder.start(request))
    assert result.token_ids == engine.engine.vanilla(PROMPT, 60)
    assert result.stats.arms.count("vanilla") <= 2  # the first step, and perhaps the last
    assert result.stats.as_dict()["steps"] < 60 / 3  # every round drafted with the right drafter
    shy = decoder.shared_acceptance.as_dict()["shy"]
    assert shy["offered"][0] >= 1 and shy["accept_rate"][0] == 0.0  # the declines were scored


def test_warm_start_from_the_server_statistics_and_determinism():
    decoder, engine = timed_decoder(STEEP, right=oracle, wrong=always_wrong)
    request = GenerationRequest(prompt_ids=PROMPT, max_tokens=30, arms=["wrong", "right"], max_draft_len=4)
    first = run_to_completion(engine, decoder.start(request))
    assert first.stats.arms[0] == "vanilla"  # a cold server: no drafter is trusted yet
    # A request's first proposal has a context of its own (no previous proposal of its
    # drafter yet), which each earlier request has seen once: a few requests in, the first
    # step already knows which drafter is right.
    for _ in range(2):
        run_to_completion(engine, decoder.start(request))
    second = run_to_completion(engine, decoder.start(request))
    assert second.stats.arms[0].startswith("right@")
    third = run_to_completion(engine, decoder.start(request))
    assert third.stats.arms == second.stats.arms  # same statistics + cost model -> same choices


def test_costaware_stats_report_the_cost_model():
    decoder, engine = timed_decoder(FLAT, right=oracle)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=10, arms=["right"], max_draft_len=4))
    run_to_completion(engine, session)
    stats = session.controller.stats()
    assert stats["policy"] == "costaware" and stats["cost_model"]["relative"][:3] == pytest.approx(FLAT[:3], abs=1e-3)


def test_the_decoding_loop_prices_each_round_at_its_context():
    """The loop reports each round's verify time with its context (the tokens before it):
    requests on short and long prompts teach the server's model what context costs."""
    clock = VirtualClock()
    engine = TimedEngine(MockEngine(max_context=2048), clock, FLAT, per_context=2e-5)
    decoder = SpeculativeDecoder(drafters={"right": ScriptedDrafter("right", oracle(engine.engine))},
                                 vocab_size=engine.vocab_size, max_context=engine.max_context, eos_id=engine.eos_id,
                                 drafter_deadline_s=None, clock=clock)
    for length in (5, 400, 900, 5, 400, 900):
        prompt = [3 + i % 40 for i in range(length)]
        run_to_completion(engine, decoder.start(GenerationRequest(prompt_ids=prompt, max_tokens=40, arms=["right"],
                                                                  max_draft_len=4)))
    model = decoder.cost_model.as_dict()
    assert model["context_ms_per_100"][0] == pytest.approx(2.0, rel=0.05)  # 2e-5 s a token
    assert decoder.cost_model.verify_seconds(1, 900) - decoder.cost_model.verify_seconds(1, 5) == pytest.approx(
        895 * 2e-5, rel=0.05)


# --- defects of the paper-faithful policies -------------------------------------------------


@pytest.mark.parametrize("policy", ["ucbspec", "exp3spec"])
def test_a_server_gamma_cap_below_the_arms_gamma_still_rewards_the_policy(policy):
    """Defect: with a server-wide cap of 2 under arms of gamma 4, no round was rewarded
    and UCBSpec stayed on arm 0 (always wrong) for 399 of 400 steps."""
    engine = MockEngine()
    drafters = {"wrong": ScriptedDrafter("wrong", always_wrong(engine)), "right": ScriptedDrafter("right", oracle(engine))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters, budget=make_gamma_budget("fixed:2", 4))
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=400, policy=policy,
                                              arms=["wrong@4", "right@4"], max_draft_len=4))
    result = run_to_completion(engine, session)
    assert result.token_ids == engine.vanilla(PROMPT, 400)
    assert max(result.stats.drafted) == 2
    assert result.stats.arms.count("right@4") > result.stats.arms.count("wrong@4")


def test_throughput_reward_has_a_fixed_yardstick_and_a_bounded_range():
    """Defect: it normalised by the request's fastest step so far (a moving target)."""
    model = CostModel.fixed([1.0, 1.5, 2.0], 0.05)
    reward = ThroughputReward(model, max_draft_len=2)
    first = reward(2, 0.10)  # 3 tokens in twice a plain step: 1.5x plain
    assert first == pytest.approx(1.5)
    reward(0, 0.01)  # a very fast step must not move the yardstick
    assert reward(2, 0.10) == pytest.approx(first)
    assert reward(2, 1e-9) == 3.0 and reward(0, 10.0) >= 0.0


def test_first_step_is_not_rewarded_under_the_throughput_reward():
    engine = MockEngine()
    drafters = {"right": ScriptedDrafter("right", oracle(engine))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=20, policy="ucbspec",
                                              arms=["right@2"], reward="throughput", max_draft_len=2))
    rewarded_at = []  # the step index of each update (stats are appended after it)
    policy = session.controller.policy
    original = policy.update
    policy.update = lambda arm, value: (rewarded_at.append(session.stats.steps), original(arm, value))
    run_to_completion(engine, session)
    assert rewarded_at and 0 not in rewarded_at and rewarded_at[0] == 1


def test_cost_model_fits_a_costly_drafters_cost_per_call_and_per_token():
    model = CostModel(5)
    assert model.draft_costs() == {}
    for tokens, ms in [(0, 5.0), (0, 5.2), (1, 7.0), (2, 9.0), (2, 30.0), (2, 8.9), (4, 13.0)]:  # one outlier
        model.observe_draft("eagle", tokens, ms / 1e3)
    per_call, per_token = model.draft_costs()["eagle"]
    assert per_call == pytest.approx(0.005, abs=3e-4) and per_token == pytest.approx(0.002, abs=2e-4)
    assert model.as_dict()["draft_ms"]["eagle"]["per_call"] == pytest.approx(5.0, abs=0.3)
    noisy = CostModel(5)
    for tokens, ms in [(1, 9.0), (3, 7.0), (3, 7.2)]:  # more tokens cheaper: noise, not a negative cost
        noisy.observe_draft("eagle", tokens, ms / 1e3)
    per_call, per_token = noisy.draft_costs()["eagle"]
    assert per_token == 0.0 and per_call == pytest.approx(0.0072)


def test_a_costly_drafters_cost_is_known_server_wide_so_no_request_tries_it_for_free():
    """Before: each request measured the costly drafter's cost afresh, starting at zero, so
    every request paid for at least one pull of a drafter that never pays (measured on code:
    Eagle pulled in 30 of 161 rounds, each call ~15 % of a target step)."""
    decoder, engine = timed_decoder(FLAT, meh=lambda e: oracle(e, length_cap=1))

    def slow_but_right(context, max_len):
        decoder.clock.advance(0.3)  # six target steps per proposal
        return oracle(engine.engine)(context, max_len)

    decoder.drafters["slow"] = ScriptedDrafter("slow", slow_but_right)
    decoder.drafters["slow"].traits = DrafterTraits(costly=True)
    request = GenerationRequest(prompt_ids=PROMPT, max_tokens=30, arms=["slow", "meh"], max_draft_len=4)
    first = run_to_completion(engine, decoder.start(request))
    assert first.token_ids == engine.engine.vanilla(PROMPT, 30)
    assert any(a.startswith("slow@") for a in first.stats.arms)  # untried: tried once
    assert decoder.cost_model.draft_costs()["slow"][0] + 4 * decoder.cost_model.draft_costs()["slow"][1] == pytest.approx(0.3)
    for _ in range(3):
        later = run_to_completion(engine, decoder.start(request))
        assert later.token_ids == first.token_ids
        assert not any(a.startswith("slow@") for a in later.stats.arms)
        assert all(a == "meh@1" for a in later.stats.arms[1:-1])


def test_cost_model_edges_pinned():
    """Edges the mutation run found unpinned (docs/reliability.md, "Mutation testing")."""
    from banditspec.errors import BanditSpecValidationError

    CostModel(3, prior_one_token_seconds=1e-6, prior_slope=0.0)  # the smallest valid priors
    for bad in ({"prior_one_token_seconds": 0.0}, {"prior_slope": -0.01}):
        with pytest.raises(BanditSpecValidationError):
            CostModel(3, **bad)
    # one observed k: the rest follows the prior slope from it
    one = CostModel(4, prior_slope=0.5, min_observations=1)
    one.observe(2, 0.030)
    assert one.curve()[1:].tolist() == pytest.approx([0.020, 0.030, 0.040, 0.050])
    # the largest k counts as observed; an even number of observations takes the middle pair
    top = CostModel(3, min_observations=1)
    for k, seconds in ((1, 0.010), (3, 0.050), (3, 0.070), (3, 0.020), (3, 0.040)):
        top.observe(k, seconds)
    assert top.curve()[3] == pytest.approx(0.045)
    assert top.as_dict()["verify_ms"] == pytest.approx([10.0, 27.5, 45.0])
    # the overhead of a round is added to every k and reported; a negative one is ignored
    top.observe_overhead(0.002)
    top.observe_overhead(-1.0)
    assert top.as_dict()["overhead_ms"] == pytest.approx(2.0)
    assert top.curve()[1] == pytest.approx(0.012)
    # a fitted line through the origin's far side: all of the cost is per token
    steep = CostModel(5)
    for tokens, ms in ((1, 1.0), (4, 10.0)):
        steep.observe_draft("d", tokens, ms / 1e3)
    assert steep.draft_costs()["d"] == pytest.approx((0.0, 0.00175))


def test_costaware_edges_pinned():
    """Edges the mutation run found unpinned (docs/reliability.md, "Mutation testing")."""
    from banditspec.bandits.costaware import context_bucket

    assert [context_bucket(m) for m in (-2, 0, 1, 2, 3, 7)] == [0, 0, 1, 2, 3, 3]
    assert context_bucket(5, agreed=True) == 7 and context_bucket(0, agreed=True) == 4
    assert context_bucket(2, last_hit=False) == 10 and context_bucket(9, agreed=True, last_hit=True) == 23
    assert context_bucket(2, last_hit=True) == 18 and context_bucket(2, last_hit=None) == 2
    # an untried costly drafter: optimism lifts the first position only; deeper ones keep the prior
    fresh = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), None)
    bonus = 0.5 * np.sqrt(np.log(2) / 1.0)
    assert fresh.survival("d", 0, optimistic=True) == pytest.approx(np.cumprod([0.25 + bonus, 0.25, 0.25, 0.25]))
    assert fresh.survival("d", 0) == pytest.approx(np.cumprod([0.25] * 4))
    # warm start: the server's counts enter capped at prior_weight pseudo-observations a position
    shared = SharedAcceptance(4, decay=1.0)
    for _ in range(100):
        shared.record("d", 0, 4, 4, 4)
    warm = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
    assert warm.prior["d"].offered[0].tolist() == pytest.approx([5.0] * 4)
    assert warm.evidence["d"][0, 0] == pytest.approx(100.0)
    # plain decoding's own candidate: one token per one-token round
    plain = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), None).choose([], 4)
    assert (plain.drafter, plain.gamma, plain.expected_tokens) == (None, 0, 1.0)
    assert plain.utility == pytest.approx(1 / 0.05)
    # gamma never passes what the cost curve covers (k <= max_tokens)
    short = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:3]), shared)
    assert short.choose([Candidate("d", 4)], 4).gamma == 2
    # a costly drafter's cost per drafted token shortens (or cancels) its draft
    for per_token, expected in ((0.0, 4), (0.1, 0)):
        policy = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
        assert policy.choose([Candidate("d", 4, costly=True, draft_seconds_per_token=per_token)], 4).gamma == expected
    costly_call = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
    assert costly_call.choose([Candidate("d", 4, costly=True, draft_seconds_per_call=1.0)], 4).drafter is None


def test_a_costly_drafters_per_token_cost_shortens_its_draft_before_it_cancels_it():
    """The drafting cost of a costly drafter grows with the tokens it drafts: as that cost per
    token rises, the chosen gamma can only shrink, and there is a range in which it is still
    worth drafting, just fewer tokens (a cost subtracted instead of added would lengthen drafts)."""
    shared = SharedAcceptance(4, decay=1.0)
    for _ in range(100):  # every position accepted: without a drafting cost the full draft pays
        shared.record("d", 0, 4, 4, 4)
    gammas = []
    for per_token in (0.0, 0.01, 0.02, 0.03, 0.05):
        policy = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
        gammas.append(policy.choose([Candidate("d", 4, costly=True, draft_seconds_per_token=per_token)], 4).gamma)
    assert gammas[0] == 4 and gammas[-1] == 0  # 0.05 s a token: dearer than a whole plain round
    assert gammas == sorted(gammas, reverse=True)
    assert any(0 < g < 4 for g in gammas)


def test_a_gamma_cap_of_zero_means_plain_decoding_whatever_the_candidates():
    shared = SharedAcceptance(4, decay=1.0)
    for _ in range(100):
        shared.record("d", 0, 4, 4, 4)  # a drafter always right: any room would be used
    policy = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
    assert policy.choose([Candidate("d", 4), Candidate("d", 4, costly=True)], 0).drafter is None
    assert policy.choose([Candidate("d", 4)], 1).gamma == 1


def test_the_first_position_bonus_shrinks_with_the_servers_and_the_requests_evidence():
    """Optimism on a costly drafter's first position: 0.5 * sqrt(ln(rounds + 2) / (seen + 1)), where
    seen counts the first positions offered in this request plus those the server has seen (its
    uncapped counts), so that a drafter the server knows well is not re-explored per request."""
    shared = SharedAcceptance(4, decay=1.0)
    for _ in range(100):  # the server offered the first token 100 times, never accepted it
        shared.record("d", 0, 4, 0, 4)
    policy = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), shared)
    # the warm prior: the 100 rejections capped to 5 pseudo-observations; Beta(0.5, 1.5) prior
    prior_hazard = 0.5 / (5 + 0.5 + 1.5)
    assert policy.survival("d", 0, optimistic=True)[0] == pytest.approx(prior_hazard + 0.5 * np.sqrt(np.log(2) / 101))
    for _ in range(3):  # and this request offered it 3 times more, rejected
        policy.record("d", 0, 4, 0, 4)
    local_hazard = 0.5 / (5 + 3 + 0.5 + 1.5)
    assert policy.survival("d", 0, optimistic=True)[0] == pytest.approx(local_hazard + 0.5 * np.sqrt(np.log(2) / 104))
    # a request of a server that never saw the drafter: its own 3 offers only
    alone = CostAwarePolicy(["d"], 4, CostModel.fixed(FLAT[:5]), None)
    for _ in range(3):
        alone.record("d", 0, 4, 0, 4)
    assert alone.survival("d", 0, optimistic=True)[0] == pytest.approx(0.5 / 5 + 0.5 * np.sqrt(np.log(2) / 4))


def test_speculation_stats_report_each_steps_time_and_its_target_share():
    """step_ms / verify_ms per step: the verify part is the target call as the virtual clock
    advanced it (50 ms x the curve at the tokens fed); the step adds nothing else here."""
    decoder, engine = timed_decoder(STEEP, right=oracle)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=20, policy="fixed:right@3"))
    result = run_to_completion(engine, session)
    stats = result.stats.as_dict()
    assert len(stats["step_ms"]) == len(stats["verify_ms"]) == stats["steps"] == len(engine.fed)
    assert stats["verify_ms"] == pytest.approx([50.0 * STEEP[k - 1] for k in engine.fed])
    assert all(v <= s + 1e-9 for v, s in zip(stats["verify_ms"], stats["step_ms"]))


class MatchSession:
    """Proposes like a ScriptedSession and says how long a context match it came from."""

    def __init__(self, prompt, propose_fn, match_len):
        self.context, self.propose_fn, self.match_len = list(prompt), propose_fn, match_len

    def propose(self, max_len):
        return Draft(token_ids=np.asarray(self.propose_fn(self.context, max_len), dtype=np.int32), match_len=self.match_len)

    def observe(self, new_tokens, hidden_states=None):
        self.context.extend(int(t) for t in new_tokens)

    def close(self, finished):
        pass


class MatchDrafter:
    traits = DrafterTraits()

    def __init__(self, name, propose_fn, match_len):
        self.name, self.propose_fn, self.match_len = name, propose_fn, match_len

    def start(self, prompt_ids):
        return MatchSession(prompt_ids, self.propose_fn, self.match_len)


def test_a_proposals_match_length_and_its_drafters_last_outcome_reach_the_controller():
    """The context the controller learns under is the proposal's own: its match length as
    the drafter reported it (it was once dropped on the way, so every proposal counted as
    'match length unknown'), and whether the drafter's previous first token was right."""
    clock = VirtualClock()
    engine = TimedEngine(MockEngine(), clock, STEEP)
    drafters = {"long": MatchDrafter("long", oracle(engine.engine), 7),
                "short": MatchDrafter("short", always_wrong(engine.engine), 1)}
    decoder = SpeculativeDecoder(drafters=drafters, vocab_size=engine.vocab_size, max_context=engine.max_context,
                                 eos_id=engine.eos_id, drafter_deadline_s=None, clock=clock,
                                 cost_model=CostModel.fixed(STEEP, 0.05))
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=40, arms=["long", "short"], max_draft_len=4))
    run_to_completion(engine, session)
    offered = {name: decoder.shared_acceptance.snapshot(name).offered[:, 0] for name in drafters}
    # "long": match length 7 (bucket 3); first proposal: no previous one; after it, always right (+16)
    assert offered["long"][3] == pytest.approx(1, abs=0.1) and offered["long"][19] > 5
    assert offered["long"].sum() == pytest.approx(offered["long"][3] + offered["long"][19])
    # "short": match length 1, first no previous one, then always wrong (+8)
    assert offered["short"][1] == pytest.approx(1, abs=0.1) and offered["short"][9] > 5
    assert offered["short"].sum() == pytest.approx(offered["short"][1] + offered["short"][9])


def test_curve_is_shared_per_context_until_the_fit_or_the_overhead_changes():
    """curve(context) is memoised (a round asks for it two or three times): the same
    read-only array while nothing changed, a new one after a refit or a new overhead, and
    always what a fresh model over the same observations gives."""
    model = CostModel(4, min_observations=1, window=10)  # young: refits after each observation
    for k, seconds in ((1, 0.010), (2, 0.012), (4, 0.020)):
        model.observe(k, seconds, 100)
    first = model.curve(100)
    assert model.curve(100) is first
    with pytest.raises(ValueError):
        first[1] = 0.0  # read-only: a caller cannot change what the next one reads
    model.observe_overhead(0.001)
    after_overhead = model.curve(100)
    assert after_overhead is not first
    assert after_overhead[1:].tolist() == pytest.approx((first[1:] + 0.001).tolist())
    model.observe(1, 0.030, 100)  # young model: refits on the next read
    refitted = model.curve(100)
    fresh = CostModel(4, min_observations=1, window=10)
    for k, seconds in ((1, 0.010), (2, 0.012), (4, 0.020), (1, 0.030)):
        fresh.observe(k, seconds, 100)
    fresh.observe_overhead(0.001)
    assert refitted.tolist() == fresh.curve(100).tolist()
    assert refitted[1] > after_overhead[1]


def test_best_follows_a_drafters_new_outcomes():
    """best() caches a drafter's hazards per context; a recorded outcome must refresh them
    (a stale cache would keep choosing a drafter that has started to fail)."""
    model = CostModel.fixed([1.0, 1.5, 2.0, 2.5, 3.0])
    policy = CostAwarePolicy(["a"], 4, model)
    candidate = [Candidate("a", 4, bucket=3)]
    before = policy.best(candidate, 4)
    assert before.drafter is None  # the pessimistic prior: plain decoding
    for _ in range(20):
        policy.record("a", 3, 4, 4, 5)
    after = policy.best(candidate, 4)
    assert after.drafter == "a" and after.gamma == 4
    assert after.expected_tokens > 4.0


def _utility_bound_reference(policy, candidate, cap, context, buckets):
    """utility_bound as numpy arrays over [buckets, gamma] (its former implementation)."""
    curve = policy.cost_model.curve(context)
    top = max(0, min(candidate.max_gamma, cap, policy.max_len, len(curve) - 2))
    if top <= 0:
        return 0.0
    counts, evidence = policy.local[candidate.drafter], policy.evidence.get(candidate.drafter)
    hazard = policy._hazard(candidate.drafter, buckets)[:, :top]
    seen = counts.offered[:, 0].sum() + (evidence[:, 0].sum() if evidence is not None else 0.0)
    hazard[:, 0] = np.minimum(1.0, hazard[:, 0] + 0.5 * np.sqrt(np.log(policy.rounds + 2) / (seen + 1.0)))
    expected = 1.0 + np.cumsum(np.cumprod(hazard, axis=1), axis=1)
    cost = (curve[2 : top + 2] + candidate.draft_seconds_per_call
            + candidate.draft_seconds_per_token * np.arange(1, top + 1))
    if policy.objective == "rate":
        return float((expected - policy.rate(float(curve[1])) * cost).max())
    return float((expected / cost).max())


@pytest.mark.parametrize("objective", ["ratio", "rate"])
def test_utility_bound_is_the_best_value_over_the_contexts_and_lengths(objective):
    """The scalar utility_bound gives what the array formula gives (the same operations in
    the same order), over random counts, server evidence, contexts, caps and drafting costs."""
    rng = np.random.default_rng(7)
    shared = SharedAcceptance(6)
    for _ in range(300):
        proposed = int(rng.integers(1, 7))
        shared.record("a", int(rng.integers(0, 24)), proposed, int(rng.integers(0, proposed + 1)), 9)
    model = CostModel.from_table({64: {1: 0.030, 3: 0.034, 7: 0.045}, 640: {1: 0.036, 4: 0.046, 7: 0.058}})
    policy = CostAwarePolicy(["a"], 6, model, shared, objective=objective)
    for round_ in range(60):
        proposed = int(rng.integers(1, 7))
        policy.record("a", int(rng.integers(0, 24)), proposed, int(rng.integers(0, proposed + 1)), 9)
        policy.choose([Candidate("a", proposed, int(rng.integers(0, 24)))], 6, 100 + round_)
        for buckets in (slice(None), slice(0, 8), slice(8, 16), slice(16, 24)):
            for candidate in (Candidate("a", int(rng.integers(1, 9))),
                              Candidate("a", 6, costly=True, draft_seconds_per_call=0.004, draft_seconds_per_token=0.002)):
                cap, context = int(rng.integers(0, 8)), int(rng.integers(0, 900))
                got = policy.utility_bound(candidate, cap, context, buckets)
                assert got == pytest.approx(_utility_bound_reference(policy, candidate, cap, context, buckets), rel=1e-12)


def test_the_hazard_cache_drops_only_the_bucket_recorded_in():
    """best()'s cached hazards stay equal to a fresh estimate in every bucket while outcomes
    arrive in some of them (a record changes the request's counts in its own bucket only)."""
    rng = np.random.default_rng(3)
    policy = CostAwarePolicy(["a", "b"], 5, CostModel.fixed([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]), SharedAcceptance(5))
    for _ in range(200):
        drafter, bucket = str(rng.choice(["a", "b"])), int(rng.integers(0, 24))
        proposed = int(rng.integers(1, 6))
        policy.record(drafter, bucket, proposed, int(rng.integers(0, proposed + 1)), 9)
        for name in ("a", "b"):
            for b in rng.integers(0, 24, size=3).tolist():
                assert policy._hazard_list(name, b) == policy._hazard(name, b).tolist()


def test_curve_list_is_the_curve_as_floats_and_shared_with_it():
    model = CostModel(4, min_observations=1, window=10)
    for k, seconds in ((1, 0.010), (2, 0.012), (4, 0.020)):
        model.observe(k, seconds, 100)
    listed = model.curve_list(100)
    assert listed == model.curve(100).tolist() and model.curve_list(100) is listed
    model.observe_overhead(0.001)
    assert model.curve_list(100) is not listed and model.curve_list(100) == model.curve(100).tolist()
