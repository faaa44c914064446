"""The TGD regret simulator: arm model, exact oracle stopping time, regret shape, CLI."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from banditspec.errors import BanditSpecValidationError
from banditspec.evaluation import simulate
from banditspec.evaluation.simulate import (
    TruncatedGeometricArms,
    expected_stopping_time,
    simulate_regret,
    stopping_times,
)


def test_truncated_geometric_pmf_and_mean():
    arms = TruncatedGeometricArms((0.0, 0.5, 0.8), max_draft_len=4)
    pmf = arms.reward_pmf(1)
    np.testing.assert_allclose(pmf, [0, 0.5, 0.25, 0.125, 0.0625, 0.0625])
    expected_means = [(1 - a**5) / (1 - a) for a in arms.alphas]
    np.testing.assert_allclose(arms.mean_rewards(), expected_means)


def test_sampled_rewards_follow_the_pmf():
    arms = TruncatedGeometricArms((0.3, 0.8), max_draft_len=4)
    table = arms.sample_rewards(np.random.default_rng(0), 40000)
    assert table.shape == (2, 40000) and table.min() >= 1 and table.max() <= 5
    for arm in range(2):
        counts = np.bincount(table[arm], minlength=6) / table.shape[1]
        np.testing.assert_allclose(counts, arms.reward_pmf(arm), atol=0.01)


def test_expected_stopping_time_by_hand():
    always_two = np.array([0.0, 0.0, 1.0])
    np.testing.assert_allclose(expected_stopping_time(always_two, [1, 2, 3, 10]), [1, 1, 2, 5])
    coin = np.array([0.0, 0.5, 0.5])  # Y in {1, 2}: E1 = 1, E2 = 1 + E1/2, E3 = 1 + E2/2 + E1/2
    np.testing.assert_allclose(expected_stopping_time(coin, [1, 2, 3]), [1.0, 1.5, 2.25])


def test_stopping_times_read_off_one_trajectory():
    table = np.full((1, 50), 2, dtype=np.int64)
    steps = stopping_times("ucbspec", table, [1, 2, 3, 9, 40], 5.0, 4.0, np.random.default_rng(0))
    assert steps.tolist() == [math.ceil(n / 2) for n in [1, 2, 3, 9, 40]]


def test_ucbspec_regret_is_sublinear_and_beats_the_baselines():
    arms = TruncatedGeometricArms((0.3, 0.5, 0.7, 0.8), max_draft_len=4)
    table = simulate_regret(arms, ("ucbspec", "exp3spec", "uniform"), (1000, 8000), runs=10, seed=0)
    mean = dict(zip(table.policies, table.mean()))
    assert table.regrets.shape == (3, 10, 2)
    assert 0 < mean["ucbspec"][0] < mean["ucbspec"][1]
    assert mean["ucbspec"][1] / mean["ucbspec"][0] < 4  # linear growth would give 8
    assert mean["uniform"][1] / mean["uniform"][0] > 6  # uniform keeps paying a constant rate
    assert mean["ucbspec"][1] < mean["uniform"][1] / 5
    assert mean["ucbspec"][1] < mean["exp3spec"][1]


def test_simulation_is_reproducible_from_its_seed():
    arms = TruncatedGeometricArms((0.4, 0.7), max_draft_len=3)
    first = simulate_regret(arms, ("exp3spec",), (300,), runs=3, seed=4).regrets
    again = simulate_regret(arms, ("exp3spec",), (300,), runs=3, seed=4).regrets
    other = simulate_regret(arms, ("exp3spec",), (300,), runs=3, seed=5).regrets
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_invalid_settings_name_their_field():
    with pytest.raises(BanditSpecValidationError) as error:
        TruncatedGeometricArms((0.5, 1.0), max_draft_len=4)
    assert error.value.field == "alphas"
    with pytest.raises(BanditSpecValidationError) as error:
        TruncatedGeometricArms((0.5,), max_draft_len=0)
    assert error.value.field == "L"
    with pytest.raises(BanditSpecValidationError) as error:
        simulate_regret(TruncatedGeometricArms((0.5,), 2), ("ucbspec",), (100,), runs=0, seed=0)
    assert error.value.field == "runs"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_runs_end_to_end_and_writes_the_png(tmp_path, capsys):
    png = tmp_path / "regret.png"
    args = _parse(["--lengths", "50,200", "--runs", "2", "--L", "3", "--alphas", "0.4,0.8",
                   "--png", str(png), "--no-progress"])
    assert simulate.run(args) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "N=50" in out and "N=200" in out
    for name in ("ucbspec", "exp3spec", "uniform"):
        assert name in out


def test_command_rejects_unknown_policy(tmp_path, capsys):
    args = _parse(["--policies", "ucbspec,greedy", "--png", str(tmp_path / "x.png"), "--no-progress"])
    assert simulate.run(args) == 2
    assert "policy" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_ucbspec_regret_grows_like_log_length_on_the_default_arms():
    """Each 4x of the length adds about the same regret (log growth); sqrt growth would
    double the increment and linear growth would quadruple it."""
    arms = TruncatedGeometricArms((0.2, 0.4, 0.6, 0.9), max_draft_len=4)
    table = simulate_regret(arms, ("ucbspec", "uniform"), (1000, 4000, 16000), runs=20, seed=0)
    ucb, uniform = table.mean()
    first, second = ucb[1] - ucb[0], ucb[2] - ucb[1]
    assert first > 0 and 0 < second < 1.9 * first
    assert ucb[2] / ucb[0] < 2.6  # sqrt(16) = 4, linear = 16
    assert uniform[2] / uniform[0] > 12
