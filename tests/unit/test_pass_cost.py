"""The fit of padded passes (bandits/pass_cost.py) and how BatchCost prices a draft with it.

The reference target pads every sequence of a pass to the longest run of tokens fed and to
the deepest context; a sequence's state is gathered per pass whatever it feeds. The mock
passes here cost a + s * B + r * B * N + x * B * C / 1000 seconds."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.bandits.cost_model import BatchLoad, CostModel
from banditspec.bandits.costaware import Candidate
from banditspec.bandits.pass_cost import PackedShape, PassCost, PassShape
from banditspec.engine.contract import VerifyPass
from banditspec.errors import BanditSpecValidationError

from tests.unit.test_batch_cost import policy_accepting


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


def packed_seconds(shape: PackedShape, a=0.017, s=0.006, r=0.0028, x=0.003, h=0.001) -> float:
    """A packed pass: a sequence's cost apart from its rows', and rows dearer beyond 8."""
    return (a + s * shape.sequences + r * shape.rows + x * shape.rows * shape.context / 1000
            + h * max(0.0, shape.rows - 8))


def test_the_packed_fit_tells_a_sequence_from_its_rows_where_rows_and_sequences_grow_together():
    # under load the sequences draft 1-4 tokens each: rows follow sequences, as in a server
    rng = np.random.default_rng(5)
    fit = PassCost(shape=PackedShape)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        shape = PackedShape(float(n), float(sum(rng.integers(1, 5, size=n))), float(rng.integers(50, 900)))
        fit.observe(shape, packed_seconds(shape) * (1 + 0.02 * rng.standard_normal()))
    assert fit.ready()
    ms = fit.as_dict()["ms"]
    assert ms["per_sequence"] == pytest.approx(6.0, rel=0.15)
    for shape in (PackedShape(1, 1, 100), PackedShape(8, 12, 400), PackedShape(4, 30, 700)):
        assert fit.seconds(shape) == pytest.approx(packed_seconds(shape), rel=0.05)


def packed_model(pricing: str) -> CostModel:
    """A server that calibrated its lone curve and has seen packed passes of 1-8 sequences
    feeding about 2 rows each (a draft of 1 on average): rows grow with sequences."""
    model = CostModel(9)
    for k in range(1, 10):
        for _ in range(3):
            model.observe(k, packed_seconds(PackedShape(1, k, 100)), 100)
    model.calibrated = True
    batch = model.batch
    assert batch is not None
    batch.pricing = pricing
    batch.bind_active_sequences(lambda: 8)
    serial = 0
    for n in [1] * 4 + list(range(1, 9)) * 3:
        for rows in (2 * n - 1, 2 * n, 2 * n, 2 * n + 1):
            serial += 1
            rows = max(n, rows)
            shape = PackedShape(n, rows, 100)
            batch.observe_pass(VerifyPass(serial=serial, prefill=False, sequences=n, rows=rows, produced=n,
                                          context=100.0, seconds=packed_seconds(shape)))
    return model


def test_a_packed_pass_charges_a_draft_its_rows_not_a_share_of_the_sequences():
    model = packed_model("packed")
    batch = model.batch
    assert batch is not None and batch.packed.ready()
    load = BatchLoad(7.0, 14.0, 7.0, 100.0)  # 7 others feeding 2 rows each
    loaded = batch.step_seconds(100, load)
    truth = [packed_seconds(PackedShape(8, 14 + k, 100)) for k in range(1, 10)]
    for k in range(2, 10):  # what a drafted token adds to the pass, within the fit's error
        assert loaded[k] - loaded[k - 1] == pytest.approx(truth[k - 1] - truth[k - 2], abs=3e-4)
    assert loaded[1] == pytest.approx(truth[0], rel=0.05)  # the others' sequences are in the step


def test_where_every_sequence_feeds_one_row_the_calibrations_lone_passes_tell_a_row_from_a_sequence():
    model = CostModel(9)
    batch = model.batch
    assert batch is not None
    for serial, k in enumerate([k for k in range(1, 10) for _ in range(3)]):  # the calibration: alone
        seconds = packed_seconds(PackedShape(1, k, 100))
        model.observe(k, seconds, 100)
        batch.anchor_pass(VerifyPass(serial=serial, prefill=False, sequences=1, rows=k, produced=1,
                                     context=100.0, seconds=seconds))
    model.calibrated = True
    batch.bind_active_sequences(lambda: 8)
    one_row_passes(batch)  # under load nobody drafts: rows = sequences in every pass
    assert batch.packed.ready()
    assert batch.packed.as_dict()["ms"]["per_sequence"] == pytest.approx(6.0, rel=0.1)
    loaded = batch.step_seconds(100, BatchLoad(7.0, 7.0, 7.0, 100.0))
    truth = [packed_seconds(PackedShape(8, 7 + k, 100)) for k in range(1, 10)]
    for k in range(2, 10):
        assert loaded[k] - loaded[k - 1] == pytest.approx(truth[k - 1] - truth[k - 2], abs=3e-4)
    without = CostModel(9).batch  # the same passes, no lone pass kept: not told apart, not priced
    assert without is not None
    one_row_passes(without)
    assert not without.packed.ready()


def test_priced_by_packed_passes_a_sequence_drafts_longer_than_priced_by_rows_alone():
    gammas = {}
    for pricing in ("packed", "rows"):
        policy = policy_accepting(packed_model(pricing), 0.6)
        policy.price_load(BatchLoad(7.0, 14.0, 7.0 * 1.6, 100.0))
        gammas[pricing] = policy.best([Candidate("d", 8)], 8, 100).gamma
    assert gammas["packed"] > gammas["rows"]


def one_row_passes(batch) -> None:
    """200 passes of 1-8 sequences, each feeding one row (nobody drafts)."""
    for serial in range(100, 300):
        n = 1 + serial % 8
        batch.observe_pass(VerifyPass(serial=serial, prefill=False, sequences=n, rows=n, produced=n,
                                      context=100.0, seconds=packed_seconds(PackedShape(n, n, 100))))


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
    policy = policy_accepting(model, 0.5)
    policy.price_load(others(7, 5.0))
    padded = policy.best([Candidate("d", 8)], 8, 100).gamma
    assert padded >= 4  # a 50 % drafter: free up to the others' 5 rows
    policy.price_load(others(7, 1.0))  # the others decode plainly: every drafted token is a row for 8
    assert policy.best([Candidate("d", 8)], 8, 100).gamma < padded


def test_where_a_padded_row_is_dear_the_server_still_drafts_less_as_the_batch_grows():
    model = padded_model(s=0.002, r=0.01)
    policy = policy_accepting(model, 0.7)
    gammas = []
    for n in (0, 1, 3, 7):
        policy.price_load(others(n, 1.0) if n else None)
        gammas.append(policy.best([Candidate("d", 8)], 8, 100).gamma)
    assert gammas[0] >= 2 and all(a >= b for a, b in zip(gammas, gammas[1:])) and gammas[-1] <= 1


def test_where_sequences_cost_more_than_rows_the_pass_drafts_together_even_when_the_others_draft_nothing():
    # each sequence is charged as if all drafted its length: E / T, not (E_o + E) / T, under
    # which no sequence alone would lengthen a pass of 8 whose extra rows are cheap
    model = padded_model()
    policy = policy_accepting(model, 0.7)
    policy.price_load(others(7, 1.0))
    choice = policy.best([Candidate("d", 8)], 8, 100)
    assert choice.gamma >= 3
    assert choice.value == pytest.approx(choice.expected_tokens / choice.seconds)


def test_the_default_prices_packed_passes_while_the_fit_of_padded_passes_still_learns():
    model = padded_model()
    batch = model.batch
    assert batch is not None
    load = others(7, 4.0)
    assert batch.padded(load)
    batch.pricing = "packed"
    assert not batch.padded(load) and batch.passes.ready()  # learned, shown in the batch view, not priced
    assert batch.as_dict()["pass_fit"]["ms"] is not None
    assert CostModel(9).batch.pricing == "packed"  # type: ignore[union-attr]


def test_the_server_parameter_names_itself_when_wrong():
    from banditspec.serving.config import ServingConfig

    assert ServingConfig.from_parameters({}).batch_pricing == "packed"
    assert ServingConfig.from_parameters({"batch_pricing": "ROWS"}).batch_pricing == "rows"
    assert ServingConfig.from_parameters({"batch_pricing": " Padded "}).batch_pricing == "padded"
    with pytest.raises(BanditSpecValidationError, match="batch_pricing"):
        ServingConfig.from_parameters({"batch_pricing": "sums"})
