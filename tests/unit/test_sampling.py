"""Verification math without a model: greedy acceptance and speculative sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from banditspec.engine.sampling import (
    acceptance_probability,
    count_greedy_accepted,
    make_generator,
    residual_distribution,
    speculative_sample,
    target_distribution,
)

# Chi-square critical values at alpha = 0.001 (standard tables), by degrees of freedom.
CHI2_CRITICAL_0_001 = {4: 18.467}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_count_greedy_accepted():
    assert count_greedy_accepted(np.array([5, 6, 7, 8]), np.array([5, 6, 7])) == 3
    assert count_greedy_accepted(np.array([5, 6, 7, 8]), np.array([5, 9, 7])) == 1
    assert count_greedy_accepted(np.array([5, 6]), np.array([4])) == 0
    assert count_greedy_accepted(np.array([5]), np.array([], dtype=np.int32)) == 0


def test_target_distribution_is_tempered_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]])
    p = target_distribution(logits, 0.5)
    assert p.dtype == torch.float64
    torch.testing.assert_close(p.sum(dim=-1), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(p, torch.softmax(logits.double() * 2.0, dim=-1))
    with pytest.raises(ValueError):
        target_distribution(logits, 0.0)


def test_residual_of_point_mass_removes_the_draft_token():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    residual = residual_distribution(p, 2, None)
    torch.testing.assert_close(residual, torch.tensor([1 / 7, 2 / 7, 0.0, 4 / 7], dtype=torch.float64))


def test_residual_with_draft_distribution():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    torch.testing.assert_close(residual_distribution(p, 1, q), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    # p == q: rejection has probability 0; if rounding makes it happen, fall back to p.
    torch.testing.assert_close(residual_distribution(p, 0, p.clone()), p)


def test_acceptance_probability():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.25, 0.6, 0.15], dtype=torch.float64)
    assert acceptance_probability(p, 1, None) == pytest.approx(0.3)
    assert acceptance_probability(p, 0, q) == 1.0
    assert acceptance_probability(p, 1, q) == pytest.approx(0.5)
    zero_q = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert acceptance_probability(p, 2, zero_q) == 1.0


def test_generator_depends_on_seed_and_length_only():
    a = torch.rand(4, generator=make_generator(7, 100))
    b = torch.rand(4, generator=make_generator(7, 100))
    c = torch.rand(4, generator=make_generator(7, 101))
    d = torch.rand(4, generator=make_generator(8, 100))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, d)


def test_certain_draft_is_accepted_and_bonus_drawn_from_last_row():
    p = torch.zeros(3, 5, dtype=torch.float64)
    p[0, 1] = p[1, 4] = p[2, 3] = 1.0
    for seed in range(20):
        outcome = speculative_sample(p, np.array([1, 4]), None, make_generator(seed, 10))
        assert (outcome.num_accepted, outcome.next_token) == (2, 3)


def test_impossible_draft_is_rejected_and_replaced():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    for seed in range(20):
        outcome = speculative_sample(p, np.array([0]), None, make_generator(seed, 3))
        assert outcome.num_accepted == 0
        assert outcome.next_token in (1, 2)


def _first_token_counts(p, q, trials: int) -> np.ndarray:
    """How often each token comes first; the draft token is 0 (point mass) or drawn from q."""
    counts = np.zeros(p.shape[1], dtype=np.int64)
    draft_rng = np.random.default_rng(0)
    for trial in range(trials):
        draft = 0 if q is None else int(draft_rng.choice(p.shape[1], p=q[0].numpy()))
        outcome = speculative_sample(p, np.array([draft]), q, make_generator(trial, 5))
        counts[draft if outcome.num_accepted > 0 else outcome.next_token] += 1
    return counts


@pytest.mark.parametrize("deterministic_draft", [True, False])
def test_first_token_follows_target_distribution(deterministic_draft):
    """Speculative sampling draws from p whatever the drafter (draft ~ q when q is given)."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.25, 0.05], [0.2] * 5], dtype=torch.float64)
    q = None if deterministic_draft else torch.tensor([[0.5, 0.1, 0.1, 0.2, 0.1]], dtype=torch.float64)
    counts = _first_token_counts(p, q, trials=6000)
    statistic = chi_square(counts, p[0].numpy())
    assert statistic < CHI2_CRITICAL_0_001[4], (counts, statistic)
    # The test has power: the same counts are far from a different distribution.
    wrong = np.array([0.15, 0.35, 0.2, 0.25, 0.05])
    assert chi_square(counts, wrong) > CHI2_CRITICAL_0_001[4]
