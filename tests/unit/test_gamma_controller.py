"""The server-wide speculation-length controller (banditspec.gamma_controller): its learner, its
round accounting, tracking of load, thread safety, wiring into the server, and that
batched verification under it stays lossless."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from banditspec.bandits.ucbspec import UCBSpec
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion
from banditspec.drafters.pld import PromptLookupDrafter
from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.engine.target_metrics import VerifyBatchMetrics
from banditspec.errors import BanditSpecValidationError
from banditspec.gamma_controller import (
    DiscountedGammaUCB,
    FixedGammaBudget,
    GammaControllerConfig,
    ThroughputGammaController,
    make_gamma_budget,
)
from banditspec.gamma_controller.budget import UnlimitedBudget
from banditspec.gamma_controller.gamma_bandit import ucbspec_radius

from tests.mock_engine import MockEngine


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BatchedServerModel:
    """N sequences stepping in lockstep on a fake clock. A step of the batch takes
    ``overhead + per_token * sum(gamma_i + 1)`` seconds; each draft token is accepted with
    probability ``acceptance`` until the first rejection. Speculation pays at low N and
    costs at high N."""

    def __init__(self, controller_config: GammaControllerConfig, *, overhead=0.04, per_token=0.006, acceptance=0.8, seed=0):
        self.clock = FakeClock()
        self.sequences = 1
        self.controller = ThroughputGammaController(controller_config, active_sequences=lambda: self.sequences, clock=self.clock)
        self.overhead, self.per_token, self.acceptance = overhead, per_token, acceptance
        self.rng = np.random.default_rng(seed)

    def expected_throughput(self, gamma: int, n: int) -> float:
        tokens = (1 - self.acceptance ** (gamma + 1)) / (1 - self.acceptance)
        return n * tokens / (self.overhead + self.per_token * n * (gamma + 1))

    def best_gamma(self, n: int) -> int:
        return max(range(self.controller.config.max_gamma + 1), key=lambda g: self.expected_throughput(g, n))

    def run(self, n: int, seconds: float) -> tuple[float, list[int]]:
        """(tokens/s achieved, the cap given to each step)."""
        self.sequences = n
        start, tokens, caps = self.clock.now, 0, []
        while self.clock.now - start < seconds:
            gammas = [self.controller.gamma_cap() for _ in range(n)]
            caps += gammas
            produced = []
            for gamma in gammas:
                accepted = 0
                while accepted < gamma and self.rng.random() < self.acceptance:
                    accepted += 1
                produced.append(accepted + 1)
            before = self.clock.now
            self.clock.now += (self.overhead + self.per_token * sum(g + 1 for g in gammas)) * (1 + 0.05 * self.rng.standard_normal())
            step_seconds = self.clock.now - before
            for gamma, made in zip(gammas, produced):
                self.controller.record_step(gamma, made, step_seconds)
            tokens += sum(produced)
        return tokens / (self.clock.now - start), caps


# --- configuration --------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_gamma", 0),
        ("max_gamma", 99),
        ("max_bucket", 24),
        ("steps_per_sequence", 0),
        ("min_round_steps", 0),
        ("min_round_seconds", -1.0),
        ("max_gap_seconds", 0.0),
        ("stall_factor", 0.5),
        ("discount", 0.0),
        ("discount", 1.5),
        ("exploration", float("nan")),
        ("delta", 1.0),
        ("prior_weight", -1.0),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(BanditSpecValidationError) as info:
        GammaControllerConfig(**{field: value})
    assert info.value.field == field and str(info.value).startswith(field)


@pytest.mark.parametrize("active, label", [(1, "1"), (2, "2"), (3, "4"), (5, "4"), (6, "8"), (7, "8"), (11, "8"), (12, "16"), (31, "32+"), (500, "32+"), (0, "1")])
def test_load_contexts_are_powers_of_two_on_a_log_scale(active, label):
    config = GammaControllerConfig()
    assert config.bucket_label(config.bucket_of(active)) == label


# --- the learner ----------------------------------------------------------------------


@pytest.mark.parametrize("count, t", [(1, 1), (3, 10), (40, 500)])
def test_radius_is_ucbspecs_with_reward_range_one(count, t):
    reference = UCBSpec(n_arms=5, reward_range=1.0)
    reference.counts[2] = count
    assert ucbspec_radius(count, t, 5, 0.5) == pytest.approx(reference.confidence_radius(2, t))
    assert ucbspec_radius(0, t, 5, 0.5) == math.inf


def test_without_unimodality_every_gamma_is_tried_once_longest_first():
    learner = DiscountedGammaUCB(4, unimodal=False)
    order = []
    for _ in range(5):
        gamma = learner.select()
        order.append(gamma)
        learner.update(gamma, 10.0)
    assert order == [4, 3, 2, 1, 0]


def test_unimodal_search_walks_down_only_while_it_pays():
    learner = DiscountedGammaUCB(4, exploration=0.05)
    rewards = {4: 20.0, 3: 30.0, 2: 40.0, 1: 35.0, 0: 25.0}
    tried = []
    for _ in range(60):
        gamma = learner.select()
        tried.append(gamma)
        learner.update(gamma, rewards[gamma])
    assert tried[:3] == [4, 3, 2]
    assert max(set(tried[-20:]), key=tried[-20:].count) == 2
    assert learner.best_gamma() == 2


def test_discounting_tracks_a_change_of_the_best_gamma():
    learner = DiscountedGammaUCB(4, discount=0.9, exploration=0.1)
    for phase_best in (4, 0):
        rewards = {g: 100.0 - 15.0 * abs(g - phase_best) for g in range(5)}
        played = []
        for _ in range(150):
            gamma = learner.select()
            played.append(gamma)
            learner.update(gamma, rewards[gamma])
        assert played[-30:].count(phase_best) >= 20, (phase_best, played[-30:])


def test_a_prior_starts_at_the_neighbours_best_and_leaves_unknown_gammas_untried():
    learner = DiscountedGammaUCB(4, unimodal=False)
    learner.set_prior(np.array([np.nan, 0.5, 1.0, 0.9, np.nan]))
    assert learner.select() in (0, 4)  # untried gammas still come first
    learner.update(0, 50.0)
    learner.update(4, 50.0)
    assert learner.select() == 2
    counts_before = learner.prior_counts.copy()
    learner.update(2, 100.0)
    assert np.all(learner.prior_counts <= counts_before * learner.discount + 1e-12)  # the prior fades


@pytest.mark.parametrize("gamma, reward, field", [(5, 1.0, "gamma"), (-1, 1.0, "gamma"), (1, -2.0, "reward"), (1, float("inf"), "reward")])
def test_learner_rejects_bad_updates(gamma, reward, field):
    with pytest.raises(BanditSpecValidationError, match=f"^{field}"):
        DiscountedGammaUCB(4).update(gamma, reward)


# --- rounds ---------------------------------------------------------------------------


def test_a_round_settles_then_rewards_tokens_per_step_second_times_the_sequences():
    clock = FakeClock()
    config = GammaControllerConfig(min_round_steps=4, steps_per_sequence=2, min_round_seconds=0.0)
    controller = ThroughputGammaController(config, active_sequences=lambda: 2, clock=clock)
    first = controller.gamma_cap()
    # settle: 2 steps (one per sequence), not measured
    for _ in range(2):
        clock.now += 0.1
        controller.record_step(first, 99, 0.1)
    # measure: 4 steps of 3 tokens, 0.25 s each -> each sequence makes 12 tokens/s, two of them 24
    for _ in range(4):
        clock.now += 0.125
        controller.record_step(first, 3, 0.25)
    (record,) = controller.history
    assert record.gamma == first and record.steps == 4 and record.tokens == 12 and record.stalled == 0
    assert record.tokens_per_second == pytest.approx(24.0)
    assert record.wall_seconds == pytest.approx(0.5) and record.bucket == config.bucket_of(2)


def test_a_step_stalled_by_something_else_is_left_out_of_the_reward():
    clock = FakeClock()
    config = GammaControllerConfig(min_round_steps=8, steps_per_sequence=1, min_round_seconds=0.0, stall_factor=3.0)
    controller = ThroughputGammaController(config, active_sequences=lambda: 1, clock=clock)
    gamma = controller.gamma_cap()
    controller.record_step(gamma, 1, 0.1)  # settle
    for seconds in [0.1, 0.1, 0.1, 2.0, 0.1, 0.1, 0.1, 0.1]:  # one step waited for a prefill
        clock.now += seconds
        controller.record_step(gamma, 2, seconds)
    (record,) = controller.history
    assert record.stalled == 1 and record.steps == 7
    assert record.tokens_per_second == pytest.approx(20.0)


def test_steps_of_an_earlier_round_are_ignored():
    clock = FakeClock()
    config = GammaControllerConfig(min_round_steps=1, steps_per_sequence=1, min_round_seconds=0.0)
    controller = ThroughputGammaController(config, active_sequences=lambda: 1, clock=clock)
    stale = {}

    def old_step():
        stale["gamma"] = controller.gamma_cap()  # this thread is tagged with round 1

    worker = threading.Thread(target=old_step)
    worker.start()
    worker.join()
    gamma = controller.gamma_cap()
    controller.record_step(gamma, 1, 0.5)  # settle
    clock.now += 1.0
    controller.record_step(gamma, 1, 0.5)  # measured: round 1 ends, round 2 begins
    assert len(controller.history) == 1

    def late_report():
        controller.record_step(stale["gamma"], 1000, 0.5)  # still tagged with round 1

    worker = threading.Thread(target=late_report)
    worker.start()
    worker.join()
    assert len(controller.history) == 1 and controller.snapshot()["rounds"] == 1


def test_an_idle_gap_drops_the_round_in_progress():
    clock = FakeClock()
    config = GammaControllerConfig(max_gap_seconds=2.0, min_round_seconds=0.0)
    controller = ThroughputGammaController(config, active_sequences=lambda: 1, clock=clock)
    gamma = controller.gamma_cap()
    controller.record_step(gamma, 5, 0.1)
    clock.now += 60.0  # nobody asked for a minute
    controller.gamma_cap()
    assert controller.dropped_rounds == 1 and not controller.history


# --- learning against a load model ------------------------------------------------------


def test_it_speculates_at_low_load_stops_at_high_load_and_comes_back():
    model = BatchedServerModel(GammaControllerConfig(), seed=1)
    assert model.best_gamma(1) == 4 and model.best_gamma(32) == 0  # the model's premise

    def near_best(n: int) -> set[int]:
        best = model.expected_throughput(model.best_gamma(n), n)
        return {g for g in range(5) if model.expected_throughput(g, n) >= 0.95 * best}

    for n, seconds in [(1, 40.0), (32, 120.0), (1, 40.0)]:
        model.run(n, seconds * 0.5)  # learning
        achieved, caps = model.run(n, seconds * 0.5)
        best = model.expected_throughput(model.best_gamma(n), n)
        assert achieved >= 0.9 * best, (n, achieved, best)
        share = sum(cap in near_best(n) for cap in caps) / len(caps)
        assert share >= 0.8, (n, share, near_best(n))
    contexts = model.controller.snapshot()["contexts"]
    assert contexts["1"]["best_gamma"] in near_best(1) and 0 not in near_best(1)
    assert contexts["32+"]["best_gamma"] in near_best(32) and 4 not in near_best(32)


def test_without_a_count_provider_active_sequences_are_the_recent_threads():
    controller = ThroughputGammaController(GammaControllerConfig(min_round_steps=1, steps_per_sequence=1))
    barrier = threading.Barrier(3)

    def ask():
        barrier.wait()
        controller.gamma_cap()

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert controller._active(controller._clock()) >= 3  # the three threads, plus this one


def test_many_threads_asking_and_reporting_at_once():
    controller = ThroughputGammaController(GammaControllerConfig(min_round_steps=4, min_round_seconds=0.0))
    reported, errors = [], []

    def sequence():
        try:
            for _ in range(300):
                gamma = controller.gamma_cap()
                assert 0 <= gamma <= 4
                controller.record_step(gamma, gamma + 1, 0.001)
                reported.append(gamma + 1)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sequence) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(controller.history) > 0
    assert sum(r.tokens for r in controller.history) <= sum(reported)
    assert all(0 <= r.gamma <= 4 and r.steps > 0 for r in controller.history)


# --- budgets and wiring ---------------------------------------------------------------


def test_budget_choices():
    assert isinstance(make_gamma_budget("off"), UnlimitedBudget)
    fixed = make_gamma_budget("fixed:0")
    assert isinstance(fixed, FixedGammaBudget) and fixed.gamma_cap() == 0
    ucb = make_gamma_budget("ucb", 3)
    assert isinstance(ucb, ThroughputGammaController) and ucb.config.max_gamma == 3 and ucb.gamma_cap() == 3


@pytest.mark.parametrize("spec, max_gamma, field", [("adaptive", 4, "gamma_controller"), ("fixed:x", 4, "gamma_controller"), ("fixed:-1", 4, "gamma_controller"), ("ucb", 0, "gamma_controller_max")])
def test_bad_budget_parameters_name_the_parameter(spec, max_gamma, field):
    with pytest.raises(BanditSpecValidationError, match=f"^{field}"):
        make_gamma_budget(spec, max_gamma)


def test_build_controller_wires_the_controller_to_the_servers_sequence_count(monkeypatch):
    import banditspec.serving.setup as setup

    from tests.fake_tokenizer import ByteTokenizer

    monkeypatch.setattr(setup, "load_serving_tokenizer", lambda params: ByteTokenizer())
    params = {"drafters": "pld", "gamma_controller": "ucb", "gamma_controller_max": "3"}
    controller = setup.build_controller(params, infer=lambda *a: {})
    budget = controller.decoder.budget
    assert isinstance(budget, ThroughputGammaController) and budget.config.max_gamma == 3
    controller._active = 7  # what Controller.handle counts
    assert budget._active(0.0) == 7
    off = setup.build_controller({"drafters": "pld"}, infer=lambda *a: {})
    assert isinstance(off.decoder.budget, UnlimitedBudget)


# --- batched verification under the controller ------------------------------------------


def _lockstep(engine, sessions) -> int:
    """Step every unfinished session together, one engine call per step; returns the calls."""
    calls = 0
    while any(not s.finished for s in sessions):
        live = [s for s in sessions if not s.finished]
        results = engine.verify([s.next_verify() for s in live])
        calls += 1
        for session, result in zip(live, results):
            session.apply(result)
    return calls


def _prompts(n: int, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(4)
    return [[int(t) for t in np.tile(rng.integers(1, vocab, size=5), 3)] for _ in range(n)]


def test_batched_steps_under_the_controller_are_lossless_with_mixed_draft_lengths():
    engine = MockEngine(vocab_size=50, eos_id=0)
    seen_lengths: list[set[int]] = []
    real_verify = engine.verify

    def verify(requests):
        seen_lengths.append({len(r.draft_ids) for r in requests})
        return real_verify(requests)

    engine.verify = verify
    config = GammaControllerConfig(min_round_steps=2, steps_per_sequence=1, min_round_seconds=0.0)
    decoder = SpeculativeDecoder.for_engine(engine, {"pld": PromptLookupDrafter()}, budget=ThroughputGammaController(config))
    prompts = _prompts(6, 50)
    policies = ["fixed:pld@1", "fixed:pld@2", "fixed:pld@4", "vanilla", "ucbspec", "exp3spec"]
    sessions = [decoder.start(GenerationRequest(p, 40, policy=pol, arms=["pld@1", "pld@4"], max_draft_len=4)) for p, pol in zip(prompts, policies)]
    _lockstep(engine, sessions)
    for prompt, session in zip(prompts, sessions):
        assert session.result().token_ids == engine.vanilla(prompt, 40)
    assert any(len(lengths) > 1 for lengths in seen_lengths), "no batch mixed draft lengths"
    assert decoder.budget.history, "the controller measured no round"


def test_batched_reference_engine_equals_solo_runs_in_fewer_forward_passes(tiny_engine):
    prompts = _prompts(3, 2000)
    decoder = SpeculativeDecoder.for_engine(
        tiny_engine, {"pld": PromptLookupDrafter()}, budget=ThroughputGammaController(GammaControllerConfig(min_round_seconds=0.0))
    )
    requests = [GenerationRequest(p, 12, policy=pol, max_draft_len=4) for p, pol in zip(prompts, ["fixed:pld@4", "fixed:pld@2", "vanilla"])]
    solo_decoder = SpeculativeDecoder.for_engine(tiny_engine, {"pld": PromptLookupDrafter()})
    tiny_engine.clear()
    solo = [run_to_completion(tiny_engine, solo_decoder.start(r)).token_ids for r in requests]
    tiny_engine.clear()
    passes_before = tiny_engine.forward_passes
    sessions = [decoder.start(r) for r in requests]
    calls = _lockstep(tiny_engine, sessions)
    assert [s.result().token_ids for s in sessions] == solo
    assert tiny_engine.forward_passes - passes_before == calls  # one pass per batched step
    assert calls < sum(s.stats.steps for s in sessions)


# --- target metrics -------------------------------------------------------------------


class FakeFamily:
    def __init__(self, name, description, kind):
        self.name, self.kind, self.metrics = name, kind, []

    def Metric(self, labels):  # noqa: N802 - the pb_utils name
        metric = FakeMetric(labels)
        self.metrics.append(metric)
        return metric


class FakeMetric:
    def __init__(self, labels):
        self.labels, self.value = labels, 0.0

    def increment(self, value):
        self.value += value

    def set(self, value):
        self.value = value


def test_target_batch_metrics_count_sequences_batches_and_mixed_drafts():
    families = {}

    def factory(name, description, kind):
        families[name] = FakeFamily(name, description, kind)
        return families[name]

    metrics = VerifyBatchMetrics(factory, model="target", version="1")
    req = lambda n_draft: VerifyRequest(np.array([1, 2], dtype=np.int32), np.arange(n_draft, dtype=np.int32))  # noqa: E731
    res = lambda n_out: VerifyResult(np.arange(n_out, dtype=np.int32), n_out - 1)  # noqa: E731
    metrics.record([req(2), req(0), req(2)], [res(3), res(1), res(1)])
    metrics.record([req(1)], [res(2)])
    value = lambda name: families[f"nv_banditspec_target_{name}"].metrics[0].value  # noqa: E731
    assert value("verify_batches") == 2 and value("verified_sequences") == 4
    assert value("mixed_draft_batches") == 1 and value("draft_tokens") == 5 and value("output_tokens") == 7
    assert value("largest_batch") == 3 and families["nv_banditspec_target_largest_batch"].kind == "GAUGE"
    assert families["nv_banditspec_target_verify_batches"].metrics[0].labels == {"model": "target", "version": "1"}
    assert metrics.totals["verified_sequences"] == 4


# --- prefills kept out of the decoding batch ---------------------------------------------


def test_the_splitter_recognises_continuations_and_keeps_new_sequences_apart():
    from banditspec.engine.prefill_split import ContinuationSplitter

    splitter = ContinuationSplitter(capacity=2)
    first = VerifyRequest(np.arange(1, 40, dtype=np.int32), np.array([7, 8], dtype=np.int32))
    assert splitter.split([first]) == [[0]] and not splitter.is_continuation(first)
    splitter.observe(first, VerifyResult(np.array([7, 9], dtype=np.int32), 1))
    following = VerifyRequest(np.concatenate([first.input_ids, [7, 9]]).astype(np.int32))
    stranger = VerifyRequest(np.arange(5, 50, dtype=np.int32))
    assert splitter.split([stranger, following, stranger]) == [[1], [0, 2]]
    for seed in range(3):  # capacity 2: the oldest expectation is forgotten
        other = VerifyRequest(np.arange(seed, seed + 30, dtype=np.int32))
        splitter.observe(other, VerifyResult(np.array([1], dtype=np.int32), 0))
    assert len(splitter) == 2 and not splitter.is_continuation(following)


@pytest.mark.parametrize("kernels", ["onednn", "fast"])
def test_splitting_a_prefill_out_saves_padded_positions_and_changes_no_result(kernels):
    """A padded target computes fewer padded positions with the prefill apart; a packed one
    (the panel kernels) pads nothing either way. The results never change."""
    from banditspec.engine.prefill_split import ContinuationSplitter
    from banditspec.engine.reference import ReferenceEngine

    tiny_engine = ReferenceEngine.from_name("tiny", max_context=512, kernels=kernels)
    rng = np.random.default_rng(9)
    splitter = ContinuationSplitter()
    seqs = [rng.integers(1, 2000, size=20).astype(np.int32) for _ in range(3)]
    first = [VerifyRequest(s) for s in seqs]
    for i, (request, result) in enumerate(zip(first, tiny_engine.verify(first))):
        splitter.observe(request, result)
        seqs[i] = np.concatenate([request.input_ids, result.output_ids]).astype(np.int32)
    # short enough (4 x 60 padded rows <= 2 x prefill_chunk) that the engine itself would run all
    # four in one padded pass (ReferenceEngine._passes)
    prompt = rng.integers(1, 2000, size=60).astype(np.int32)
    batch = [VerifyRequest(s, np.array([5, 6], dtype=np.int32)) for s in seqs] + [VerifyRequest(prompt)]
    groups = splitter.split(batch)
    assert groups == [[0, 1, 2], [3]]
    padded = tiny_engine.padded_positions
    split_results = {i: r for g in groups for i, r in zip(g, tiny_engine.verify([batch[i] for i in g]))}
    split_padding = tiny_engine.padded_positions - padded
    tiny_engine.clear()  # same state again, then all four in one pass
    tiny_engine.verify(first)
    padded = tiny_engine.padded_positions
    together = tiny_engine.verify(batch)
    if tiny_engine.packs_rows:
        assert split_padding == 0 and tiny_engine.padded_positions == padded == 0
    else:
        assert split_padding < tiny_engine.padded_positions - padded
    for i, result in enumerate(together):
        assert result.output_ids.tolist() == split_results[i].output_ids.tolist()


def test_every_verification_call_carries_draft_input_ids_so_that_triton_can_batch_them():
    from banditspec.engine.tensor_codec import TensorEngine, decode_request
    from banditspec.engine.uniform_inputs import with_empty_drafts

    sent = []

    def infer(model_name, tensors, output_names):
        sent.append(tensors)
        request = decode_request({k: np.asarray(v)[0] for k, v in tensors.items()})
        return {"output_ids": np.concatenate([request.draft_ids, [7]]).astype(np.int32)[None, None]}

    engine = TensorEngine(with_empty_drafts(infer), vocab_size=50, max_context=64, eos_id=0)
    plain, drafted = engine.verify([VerifyRequest(np.array([1, 2], dtype=np.int32)), VerifyRequest(np.array([1, 2], dtype=np.int32), np.array([3, 4], dtype=np.int32))])
    assert [set(t) for t in sent][0] == set(sent[1])  # the same inputs: one batch for Triton
    assert sent[0]["draft_input_ids"].shape == (1, 0) and sent[1]["draft_input_ids"].tolist() == [[3, 4]]
    assert plain.output_ids.tolist() == [7] and plain.num_accepted == 0
    assert drafted.output_ids.tolist() == [3, 4, 7] and drafted.num_accepted == 2
