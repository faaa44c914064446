"""The batch-aware cost (bandits/cost_model.py: BatchCost) and the controller under load.

A lone sequence must decide exactly as the single-sequence controller does (pinned against
the decisions it made before the batch model existed); under load a request pays for what
its rows add to everyone's step, so a compute-bound server drafts less and converges to
plain decoding, while a server whose calls cost the same whatever their rows keeps
drafting. The mock targets here cost ``base + per_row * rows`` a call."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from banditspec.bandits.cost_model import BatchLoad, CostModel
from banditspec.bandits.costaware import PLAIN, Candidate, CostAwarePolicy
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import generate, run_to_completion
from banditspec.engine.contract import VerifyPass, VerifyRequest, VerifyResult
from banditspec.engine.gather import VerifyGatherer, _Slot
from banditspec.evaluation.replay import VirtualClock

from tests.mock_engine import MockEngine
from tests.unit.test_costaware import TimedEngine
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle

# --- a lone sequence: the decisions of the single-sequence controller -------------------------

RELATIVE = [1.0, 1.12, 1.25, 1.4, 1.55, 1.7, 1.85, 2.0, 2.15]
PROMPTS = ([3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4], [11, 12, 13])
# What the controller chose, step by step, on the scenario below before it knew batches.
BEFORE = [
    ["two@1", "two@1", "two@1"] + ["two@2"] * 14,
    ["two@1"] + ["two@2"] * 15 + ["vanilla"],
    ["two@2"] * 9 + ["third@5", "third@6", "third@6", "two@2", "two@2", "vanilla"],
]


def two_right(engine):
    """Right for two tokens, then wrong."""
    right, wrong = oracle(engine), always_wrong(engine)

    def propose(context, max_len):
        head = right(context, min(2, max_len))
        return head + wrong(list(context) + head, max_len - len(head)) if max_len > 2 else head

    return propose


def every_third(engine):
    """Right (all of it) at every third position, else wrong."""
    right, wrong = oracle(engine), always_wrong(engine)
    return lambda context, max_len: right(context, max_len) if len(context) % 3 == 0 else wrong(context, max_len)


def scenario(through_gatherer: bool, loaded_before: bool = False) -> list[list[str]]:
    clock = VirtualClock()
    engine = TimedEngine(MockEngine(), clock, RELATIVE, per_context=1e-5)
    drafters = {"two": ScriptedDrafter("two", two_right(engine.engine)),
                "third": ScriptedDrafter("third", every_third(engine.engine)),
                "wrong": ScriptedDrafter("wrong", always_wrong(engine.engine))}
    model = CostModel(len(RELATIVE), prior_one_token_seconds=0.05)
    for k, r in enumerate(RELATIVE, start=1):
        for _ in range(3):
            model.observe(k, 0.05 * r, 32)
    model.calibrated = True
    decoder = SpeculativeDecoder(drafters=drafters, vocab_size=engine.vocab_size, max_context=engine.max_context,
                                 eos_id=engine.eos_id, drafter_deadline_s=None, clock=clock, cost_model=model)
    served = engine
    if through_gatherer:
        assert model.batch is not None
        active = [1]
        model.batch.bind_active_sequences(lambda: active[0])
        if loaded_before:  # the server was busy a moment ago: its load averages say 8 a call
            active[0] = 8
            for _ in range(20):
                model.batch.observe_call([3] * 8, [100] * 8, [2] * 8, 0.2, [True] * 8)
            assert model.batch.load() is not None
            active[0] = 1
        gatherer = VerifyGatherer(engine, window_s=0.01, max_rows=8, active=lambda: active[0], clock=clock)
        gatherer.report_to(model.batch)
        served = gatherer
    out = []
    for prompt in PROMPTS:
        session = decoder.start(GenerationRequest(prompt_ids=prompt, max_tokens=48, arms=["two", "third", "wrong"],
                                                  max_draft_len=8))
        out.append(run_to_completion(served, session).stats.arms)
    if through_gatherer:
        assert model.batch.as_dict()["calls"] > 0  # the lone calls were observed, and changed nothing
    return out


@pytest.mark.parametrize("through_gatherer, loaded_before", [(False, False), (True, False), (True, True)])
def test_a_lone_sequence_decides_as_the_single_sequence_controller_did(through_gatherer, loaded_before):
    assert scenario(through_gatherer, loaded_before) == BEFORE


# --- the batch model ----------------------------------------------------------------------------


def test_no_load_while_alone_unbound_or_before_any_gathered_call():
    model = CostModel(5)
    batch = model.batch
    assert batch is not None and batch.load() is None  # unbound: one sequence at a time
    batch.bind_active_sequences(lambda: 4)
    assert batch.load() is None  # nothing gathered yet: the single-sequence model decides
    batch.observe_call([2, 3, 1, 4], [50, 60, 70, 80], [2, 2, 1, 3], 0.1, [True] * 4)
    load = batch.load()
    assert load == BatchLoad(3.0, 3 * 2.5, 3 * 2.0, 65.0)
    batch.bind_active_sequences(lambda: 1)
    assert batch.load() is None


def test_others_are_the_sequences_a_call_carries_not_every_one_in_flight():
    batch = CostModel(5).batch
    assert batch is not None
    batch.bind_active_sequences(lambda: 16)
    for _ in range(50):
        batch.observe_call([1, 1, 1, 1], [10] * 4, [1] * 4, 0.05, [True] * 4)
    load = batch.load()
    assert load is not None and load.others == pytest.approx(3.0) and load.rows == pytest.approx(3.0)


def test_while_others_are_in_flight_the_lone_curve_learns_nothing_from_batched_times():
    model = CostModel(5, min_observations=1)
    assert model.batch is not None
    active = [3]
    model.batch.bind_active_sequences(lambda: active[0])
    model.observe(2, 9.0, 10)  # a batched call's time, seen by one of its members
    assert not model.observed()
    active[0] = 1
    model.observe(2, 0.06, 10)
    assert model.observed() and model.verify_seconds(2) == pytest.approx(0.06)


class RowsEngine(MockEngine):
    """A mock target whose call costs ``base + per_row * rows`` on a virtual clock (rows:
    tokens fed by all its sequences), or in real time (``sleep``)."""

    def __init__(self, base: float, per_row: float, clock: VirtualClock | None = None, prefill_per_token: float = 0.0):
        super().__init__(vocab_size=50, eos_id=0, max_context=4096)
        self.base, self.per_row, self.clock = base, per_row, clock
        self.prefill_per_token = prefill_per_token
        self.seen: set[int] = set()
        self.lock = threading.Lock()
        self.rows: list[int] = []

    def cost(self, requests) -> float:
        rows = sum(1 + len(r.draft_ids) for r in requests)
        prefill = 0
        with self.lock:
            for r in requests:
                key = int(r.input_ids[0]) * 1000 + int(r.input_ids[1])
                if key not in self.seen:
                    self.seen.add(key)
                    prefill += len(r.input_ids)
            self.rows.append(rows)
        return self.base + self.per_row * rows + self.prefill_per_token * prefill

    def verify(self, requests):
        seconds = self.cost(requests)
        if self.clock is not None:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)
        return super().verify(requests)


def test_gathered_calls_price_rows_and_a_first_steps_prefill_is_left_out():
    clock = VirtualClock()
    engine = RowsEngine(0.02, 0.004, clock, prefill_per_token=0.01)
    model = CostModel(5)
    assert model.batch is not None
    gatherer = VerifyGatherer(engine, window_s=0.0001, max_rows=8, active=lambda: 1, clock=clock)
    gatherer.report_to(model.batch)
    sequences = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    rng = np.random.default_rng(0)
    for _step in range(40):  # three sequences, one batched call a step, drafts of 0..4 tokens
        requests = [VerifyRequest(np.asarray(s, np.int32), rng.integers(1, 50, size=int(rng.integers(0, 5))).astype(np.int32))
                    for s in sequences]
        group = [_Slot(r) for r in requests]  # one group, as the gatherer forms it when all three wait
        gatherer._in_flight += 1
        gatherer._send(group)
        for s, slot in zip(sequences, group):
            assert slot.result is not None
            s.extend(int(t) for t in slot.result.output_ids)
    stats = model.batch.as_dict()
    assert stats["prefill_calls"] == 1 and stats["calls"] == 39  # the first call prefilled three prompts
    fitted = model.batch.rows
    for rows in (3, 6, 9, 12):
        if fitted.as_dict()["observations"][rows - 1]:
            assert fitted.verify_seconds(rows, 10) == pytest.approx(0.02 + 0.004 * rows, rel=0.05)
    assert fitted.verify_seconds(14, 10) - fitted.verify_seconds(4, 10) == pytest.approx(0.04, rel=0.15)


# --- the passes the target reports --------------------------------------------------------------


def _pass(serial: int, sequences: int, rows: int, seconds: float, prefill: bool = False) -> VerifyPass:
    return VerifyPass(serial=serial, prefill=prefill, sequences=sequences, rows=rows, produced=2 * sequences,
                      context=100.0, seconds=seconds)


def test_a_pass_the_target_reports_is_what_prices_rows_and_load():
    batch = CostModel(5).batch
    assert batch is not None
    batch.bind_active_sequences(lambda: 8)
    batch.observe_pass(_pass(1, 8, 8, 0.9, prefill=True))  # prompts: counted, priced nowhere
    assert batch.load() is None and not batch.rows.observed() and batch.as_dict()["prefill_calls"] == 1
    for serial in range(2, 40):
        rows = 8 * (1 + serial % 4)
        batch.observe_pass(_pass(serial, 8, rows, 0.02 + 0.003 * rows))
    load = batch.load()
    assert load is not None and load.others == pytest.approx(7.0)
    assert batch.rows.verify_seconds(32, 100) == pytest.approx(0.02 + 0.003 * 32, rel=0.02)


class MergingTarget:
    """What the reference target behind Triton's batcher does to a gatherer's groups: groups
    that queued while a pass ran are verified together in the next pass, which takes
    base + per_row * (its rows), and each answer names that pass. Here every call is one
    pass with the group of another caller already in it (``company`` rows)."""

    def __init__(self, base: float, per_row: float, company: int):
        self.base, self.per_row, self.company = base, per_row, company
        self.inner = MockEngine(vocab_size=50, eos_id=0, max_context=4096)
        self.vocab_size, self.max_context, self.eos_id = 50, 4096, 0
        self.provides_hidden_states = False
        self.serial = 0

    def verify(self, requests):
        self.serial += 1
        rows = self.company + sum(1 + len(r.draft_ids) for r in requests)
        verified = VerifyPass(serial=self.serial, prefill=False, sequences=self.company + len(requests), rows=rows,
                              produced=rows, context=100.0, seconds=self.base + self.per_row * rows)
        results: list[VerifyResult] = self.inner.verify(requests)
        for r in results:
            r.verified_in = verified
        return results


def test_the_gatherer_reports_each_pass_once_whatever_groups_shared_it():
    target = MergingTarget(0.02, 0.004, company=6)
    model = CostModel(5)
    assert model.batch is not None
    seen: list[VerifyPass] = []
    real = model.batch.observe_pass
    model.batch.observe_pass = lambda p: (seen.append(p), real(p))  # type: ignore[method-assign]
    gatherer = VerifyGatherer(target, window_s=0.0001, max_rows=8, active=lambda: 8)
    gatherer.report_to(model.batch)
    model.batch.bind_active_sequences(lambda: 8)
    requests = [VerifyRequest(np.asarray([1, 2, 3 + i], np.int32), np.asarray([5] * i, np.int32)) for i in range(2)]
    group = [_Slot(r) for r in requests]
    gatherer._in_flight += 1
    gatherer._send(group)
    assert [p.serial for p in seen] == [1]  # two members, one pass
    # a second group answered from the same pass (it queued behind the first) adds nothing
    again = [_Slot(VerifyRequest(np.asarray([9, 9], np.int32)))]
    again[0].result = target.inner.verify([again[0].request])[0]
    again[0].result.verified_in = group[0].result.verified_in if group[0].result is not None else None
    gatherer._report(again, 5.0)
    assert len(seen) == 1
    # the sequences the step really holds, not the group's two
    load = model.batch.load()
    assert load is not None and load.others == pytest.approx(7.0)


def test_without_passes_a_call_that_queued_behind_another_is_left_out_of_the_row_fit():
    batch = CostModel(5).batch
    assert batch is not None
    for _ in range(5):
        batch.observe_call([2, 2], [100, 100], [2, 2], 5.0, [True, True], queued=True)  # waited a whole call
    assert not batch.rows.observed() and batch.as_dict()["calls"] == 5
    for _ in range(5):
        batch.observe_call([2, 2], [100, 100], [2, 2], 0.05, [True, True])
    assert batch.rows.observed() and batch.rows.verify_seconds(4, 100) == pytest.approx(0.05)


# --- choices under load -------------------------------------------------------------------------


def rows_model(base: float, per_row: float, sequences=range(1, 33)) -> CostModel:
    """A server that calibrated its lone curve and has seen batched calls, all costing
    base + per_row * rows."""
    model = CostModel(9)
    for k in range(1, 10):
        for _ in range(3):
            model.observe(k, base + per_row * k, 100)
    model.calibrated = True
    assert model.batch is not None
    for n in sequences:
        for _ in range(3):
            for rows in (n, 2 * n, 3 * n):
                model.batch.observe_call(_split(rows, n), [100] * n, [1] * n, base + per_row * rows, [True] * n)
    return model


def _split(rows: int, n: int) -> list[int]:
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def policy_accepting(model: CostModel, rate: float, objective: str = "ratio") -> CostAwarePolicy:
    """A policy whose drafter ``d`` is accepted with probability ``rate`` at every position."""
    policy = CostAwarePolicy(["d"], 8, model, None, objective=objective)
    rng = np.random.default_rng(1)
    for _ in range(400):
        accepted = 0
        while accepted < 8 and rng.random() < rate:
            accepted += 1
        policy.record("d", 0, 8, accepted, 9)
    return policy


def plain_others(others: int) -> BatchLoad:
    return BatchLoad(float(others), float(others), float(others), 100.0)


@pytest.mark.parametrize("objective", ["ratio", "rate"])
def test_a_compute_bound_server_drafts_less_as_the_batch_grows_and_decodes_plainly_when_saturated(objective):
    model = rows_model(base=0.04, per_row=0.01)
    policy = policy_accepting(model, 0.7, objective)
    candidate = [Candidate("d", 8)]
    gammas = []
    for others in (0, 1, 3, 7, 15, 31):
        policy.price_load(plain_others(others) if others else None)
        gammas.append(policy.best(candidate, 8, 100).gamma)
    assert gammas[0] >= 2  # alone, a 70 % drafter pays
    assert all(a >= b for a, b in zip(gammas, gammas[1:]))  # each row costs everyone more
    assert gammas[-2:] == [0, 0]  # saturated: plain decoding


def test_the_charge_is_what_the_rows_add_to_everyones_step():
    model = rows_model(base=0.04, per_row=0.01)
    batch = model.batch
    assert batch is not None
    alone = model.curve_list(100)
    loaded = batch.step_seconds(100, plain_others(7))
    for k in range(1, 10):  # the step carries the others' 7 rows besides this request's k
        assert loaded[k] == pytest.approx(0.04 + 0.01 * (7 + k), rel=0.02)
        assert loaded[k] - loaded[1] == pytest.approx(alone[k] - alone[1], rel=0.05)
    policy = policy_accepting(model, 0.7)
    policy.price_load(plain_others(7))
    choice = policy.best([Candidate("d", 8)], 8, 100)
    # the value is the step's goodput: the others' 7 tokens and this request's, over the step
    assert choice.value == pytest.approx((7 + choice.expected_tokens) / loaded[1 + choice.gamma], rel=1e-9)


def test_calls_that_cost_the_same_whatever_their_rows_keep_drafting_under_load():
    model = rows_model(base=0.05, per_row=0.0)
    policy = policy_accepting(model, 0.7)
    policy.price_load(None)
    alone = policy.best([Candidate("d", 8)], 8, 100)
    policy.price_load(plain_others(31))
    assert policy.best([Candidate("d", 8)], 8, 100).gamma == alone.gamma == 8


def test_before_any_batched_call_is_measured_rows_cost_what_the_lone_curve_says():
    model = CostModel(9)
    for k in range(1, 10):
        for _ in range(3):
            model.observe(k, 0.04 + 0.01 * k, 100)
    batch = model.batch
    assert batch is not None and not batch.rows.observed()
    loaded = batch.step_seconds(100, plain_others(7))
    assert loaded[1] == pytest.approx(0.04 + 0.01 * 8, rel=0.02) and loaded[9] == pytest.approx(0.04 + 0.01 * 16, rel=0.02)


def test_under_saturation_a_drafter_is_not_even_asked_to_propose():
    model = rows_model(base=0.04, per_row=0.01)
    policy = policy_accepting(model, 0.7)
    for load, asked in ((None, True), (plain_others(15), False)):
        policy.price_load(load)
        plain = policy.best([], 8, 100)
        assert plain.drafter is PLAIN
        # the bound (a lazy drafter's or a preview's test) is priced under the same load
        assert (policy.utility_bound(Candidate("d", 8), 8, 100) > plain.value) is asked


# --- a server under load, end to end ------------------------------------------------------------


def noisy_right(engine, rate: float):
    """Right with probability ``rate`` at each position (a fixed function of the position)."""
    wrong = always_wrong(engine)

    def propose(context, max_len):
        seq, out = list(context), []
        for _ in range(max_len):
            right = (len(seq) * 2654435761) % 1000 < 1000 * rate
            token = engine.target(seq) if right else wrong(seq, 1)[0]
            out.append(token)
            seq.append(token)
        return out

    return propose


def serve(streams: int, engine: RowsEngine, max_tokens: int = 40) -> tuple[list, list[list[int]]]:
    model = CostModel(9)
    for k in range(1, 10):
        for _ in range(3):
            model.observe(k, engine.base + engine.per_row * k, 20)
    model.calibrated = True
    decoder = SpeculativeDecoder(drafters={"d": ScriptedDrafter("d", noisy_right(engine, 0.7))},
                                 vocab_size=engine.vocab_size, max_context=engine.max_context, eos_id=engine.eos_id,
                                 drafter_deadline_s=None, cost_model=model)
    active = [0]
    lock = threading.Lock()
    gatherer = VerifyGatherer(engine, window_s=0.05, max_rows=32, active=lambda: active[0])
    assert model.batch is not None
    gatherer.report_to(model.batch)
    model.batch.bind_active_sequences(lambda: active[0])
    results: list = [None] * streams
    prompts = [[3 + i, 4 + 2 * i, 5] for i in range(streams)]

    def work(i: int) -> None:
        session = decoder.start(GenerationRequest(prompt_ids=prompts[i], max_tokens=max_tokens, arms=["d"],
                                                  max_draft_len=8))
        try:
            for _ in generate(gatherer, session):
                pass
        finally:
            with lock:
                active[0] -= 1
        results[i] = session.result()

    active[0] = streams
    threads = [threading.Thread(target=work, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, prompts


def test_a_saturated_server_converges_to_plain_decoding_and_stays_lossless():
    engine = RowsEngine(base=0.004, per_row=0.002)
    alone, prompts = serve(1, engine)
    drafted_alone = np.mean([g > 0 for g in alone[0].stats.drafted])
    busy, prompts = serve(16, engine)
    for result, prompt in zip(busy, prompts):
        assert result.token_ids == MockEngine().vanilla(prompt, 40)
    late = [g > 0 for r in busy for g in r.stats.drafted[len(r.stats.drafted) // 2:]]
    assert drafted_alone > 0.8 and np.mean(late) < 0.2
