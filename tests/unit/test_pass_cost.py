"""The fit of padded passes (bandits/pass_cost.py) and how BatchCost prices a draft with it.

The reference target pads every sequence of a pass to the longest run of tokens fed and to
the deepest context; a sequence's state is gathered per pass whatever it feeds. The mock
passes here cost a + s * B + r * B * N + x * B * C / 1000 seconds."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.bandits.cost_model import BatchLoad, CostModel
from banditspec.bandits.costaware import Candidate, CostAwarePolicy
from banditspec.bandits.pass_cost import PassCost, PassShape
from banditspec.engine.contract import VerifyPass
from banditspec.errors import BanditSpecValidationError


def padded_seconds(shape: PassShape, a=0.04, s=0.012, r=0.0008, x=0.004) -> float:
    return a + s * shape.sequences + r * shape.sequences * shape.longest + x * shape.sequences * shape.deepest / 1000


def test_the_fit_recovers_what_a_sequence_a_padded_row_and_a_padded_context_cost():
    rng = np.random.default_rng(3)
    fit = PassCost()
    for _ in range(200):
        shape = PassShape(float(rng.integers(1, 9)), float(rng.integers(1, 10)), float(rng.integers(50, 1500)))
        fit.observe(shape, padded_seconds(shape) * (1 + 0.02 * rng.standard_normal()))
    assert fit.ready()
    ms = fit.as_dict()["ms"]
    assert ms["per_sequence"] == pytest.approx(12.0, rel=0.1)
    assert ms["per_padded_row"] == pytest.approx(0.8, rel=0.2)
    assert ms["per_padded_kilo_context"] == pytest.approx(4.0, rel=0.25)
    assert fit.seconds(PassShape(8, 5, 700)) == pytest.approx(padded_seconds(PassShape(8, 5, 700)), rel=0.03)


def test_a_pause_of_the_process_does_not_move_the_fit():
    rng = np.random.default_rng(4)
    fit = PassCost()
    for i in range(300):
        shape = PassShape(float(rng.integers(1, 9)), float(rng.integers(1, 10)), 300.0)
        fit.observe(shape, padded_seconds(shape) + (2.0 if i % 50 == 7 else 0.0))  # a 2 s pause now and then
    for shape in (PassShape(1, 1, 300), PassShape(8, 5, 300), PassShape(4, 9, 300)):
        assert fit.seconds(shape) == pytest.approx(padded_seconds(shape), rel=0.02)


def test_the_fit_waits_until_sequences_and_rows_can_be_told_apart_and_never_goes_negative():
    fit = PassCost(min_passes=8)
    for n in range(40):  # always 4 sequences: a sequence and a row cannot be told apart
        fit.observe(PassShape(4.0, float(1 + n % 5), 100.0), padded_seconds(PassShape(4.0, float(1 + n % 5), 100.0)))
    assert not fit.ready()
    falling = PassCost(min_passes=8)
    for n in range(40):  # more rows, less time: no coefficient may say a row saves time
        shape = PassShape(float(1 + n % 4), float(1 + n % 7), 100.0)
        falling.observe(shape, 0.2 - 0.01 * shape.sequences * shape.longest + 0.03 * shape.sequences)
    assert falling.ready() and all(v >= 0 for k, v in falling.as_dict()["ms"].items() if k != "base")
    with pytest.raises(BanditSpecValidationError, match="window"):
        PassCost(window=2)


def padded_model(**costs) -> CostModel:
    """A server that calibrated its lone curve and has seen padded passes of 1-8 sequences."""
    model = CostModel(9)
    for k in range(1, 10):
        for _ in range(3):
            model.observe(k, padded_seconds(PassShape(1, k, 100), **costs), 100)
    model.calibrated = True
    batch = model.batch
    assert batch is not None
    batch.pricing = "padded"
    batch.bind_active_sequences(lambda: 8)
    serial = 0
    for n in range(1, 9):
        for longest in (1, 2, 3, 5):
            serial += 1
            fed = [longest] + [1] * (n - 1)
            batch.observe_pass(VerifyPass(serial=serial, prefill=False, sequences=n, rows=sum(fed), produced=n,
                                          context=100.0, seconds=padded_seconds(PassShape(n, longest, 100), **costs),
                                          longest=longest, runner_up=fed[1] if n > 1 else 0, deepest=100))
    assert batch.passes.ready()
    return model


def others(n: int, longest: float) -> BatchLoad:
    return BatchLoad(float(n), float(n) * longest, float(n), 100.0, longest=longest, deepest=100.0)


def test_rows_up_to_the_others_longest_are_free_and_each_one_beyond_costs_a_row_for_everyone():
    model = padded_model()
    batch = model.batch
    assert batch is not None
    loaded = batch.step_seconds(100, others(7, 4.0))
    own = model.curve_list(100)
    for k in range(1, 5):  # padding the pass computes anyway
        assert loaded[k] == pytest.approx(loaded[1], abs=1e-4)
    for k in range(5, 10):  # each token past the others' 4: a padded row for each of the 8
        assert loaded[k] - loaded[k - 1] == pytest.approx(8 * 0.0008, rel=0.1)
    assert loaded[1] > own[1] + 7 * 0.012 * 0.9  # the others' sequences are in the step


def test_a_sequence_that_pays_little_for_rows_drafts_to_the_others_longest_under_load():
    model = padded_model()
    policy = CostAwarePolicy(["d"], 8, model, None)
    rng = np.random.default_rng(1)
    for _ in range(400):
        accepted = 0
        while accepted < 8 and rng.random() < 0.5:
            accepted += 1
        policy.record("d", 0, 8, accepted, 9)
    policy.price_load(others(7, 5.0))
    padded = policy.best([Candidate("d", 8)], 8, 100).gamma
    assert padded >= 4  # a 50 % drafter: free up to the others' 5 rows
    policy.price_load(others(7, 1.0))  # the others decode plainly: every drafted token is a row for 8
    assert policy.best([Candidate("d", 8)], 8, 100).gamma < padded


def test_where_a_padded_row_is_dear_the_server_still_drafts_less_as_the_batch_grows():
    model = padded_model(s=0.002, r=0.01)
    policy = CostAwarePolicy(["d"], 8, model, None)
    rng = np.random.default_rng(1)
    for _ in range(400):
        accepted = 0
        while accepted < 8 and rng.random() < 0.7:
            accepted += 1
        policy.record("d", 0, 8, accepted, 9)
    gammas = []
    for n in (0, 1, 3, 7):
        policy.price_load(others(n, 1.0) if n else None)
        gammas.append(policy.best([Candidate("d", 8)], 8, 100).gamma)
    assert gammas[0] >= 2 and all(a >= b for a, b in zip(gammas, gammas[1:])) and gammas[-1] <= 1


def test_where_sequences_cost_more_than_rows_the_pass_drafts_together_even_when_the_others_draft_nothing():
    # each sequence is charged as if all drafted its length: E / T, not (E_o + E) / T, under
    # which no sequence alone would lengthen a pass of 8 whose extra rows are cheap
    model = padded_model()
    policy = CostAwarePolicy(["d"], 8, model, None)
    rng = np.random.default_rng(2)
    for _ in range(400):
        accepted = 0
        while accepted < 8 and rng.random() < 0.7:
            accepted += 1
        policy.record("d", 0, 8, accepted, 9)
    policy.price_load(others(7, 1.0))
    choice = policy.best([Candidate("d", 8)], 8, 100)
    assert choice.gamma >= 3
    assert choice.value == pytest.approx(choice.expected_tokens / choice.seconds)


def test_the_default_prices_by_rows_while_the_fit_of_passes_still_learns():
    model = padded_model()
    batch = model.batch
    assert batch is not None
    load = others(7, 4.0)
    assert batch.padded(load)
    batch.pricing = "rows"
    assert not batch.padded(load) and batch.passes.ready()  # learned, shown in the batch view, not priced
    assert batch.as_dict()["pass_fit"]["ms"] is not None
    assert CostModel(9).batch.pricing == "rows"  # type: ignore[union-attr]


def test_the_server_parameter_names_itself_when_wrong():
    from banditspec.serving.config import ServingConfig

    assert ServingConfig.from_parameters({}).batch_pricing == "rows"
    assert ServingConfig.from_parameters({"batch_pricing": " Padded "}).batch_pricing == "padded"
    with pytest.raises(BanditSpecValidationError, match="batch_pricing"):
        ServingConfig.from_parameters({"batch_pricing": "sums"})
