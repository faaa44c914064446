"""Verification math without a model: greedy acceptance and speculative sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from banditspec.engine.sampling import (
    SamplingOutcome,
    acceptance_probability,
    count_greedy_accepted,
    coupled_sample,
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


# ---------------------------------------------------------------- pins from the mutation run


def test_every_seed_and_length_has_its_own_random_stream():
    """64 (seed, length) pairs, 64 different streams (a seed derivation that collapsed them to
    a few would make different requests draw the same numbers)."""
    firsts = {float(torch.rand(1, generator=make_generator(seed, length), dtype=torch.float64))
              for seed in (0, 1, 7, 2**40) for length in range(16)}
    assert len(firsts) == 64


def test_a_token_neither_side_gives_mass_is_never_accepted():
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    assert acceptance_probability(p, 2, q) == 0.0
    for seed in range(20):  # the draft token 2 is impossible: always replaced by 0 or 1
        outcome = speculative_sample(torch.stack([p, p]), np.array([2]), q.unsqueeze(0), make_generator(seed, 4))
        assert outcome.num_accepted == 0 and outcome.next_token in (0, 1)


@pytest.mark.parametrize("sample", ["speculative", "coupled"])
def test_p_must_have_a_row_per_draft_token_plus_one(sample):
    p = torch.full((2, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^p must have gamma \+ 1 = 3 rows, got 2$"):
        if sample == "speculative":
            speculative_sample(p, np.array([1, 2]), None, make_generator(0, 5))
        else:
            coupled_sample(p, np.array([1, 2]), 0, 5)


def _plain(p_row: torch.Tensor, seed: int, length: int) -> int:
    """What plain decoding samples at this sequence length: coupled_sample with no draft."""
    outcome = coupled_sample(p_row.unsqueeze(0), np.array([], dtype=np.int32), seed, length)
    assert outcome.num_accepted == 0
    return outcome.next_token


def test_coupled_sampling_emits_what_plain_decoding_would_whatever_the_draft():
    """Position i is drawn as plain decoding draws at length input_length + i: a draft equal to
    those draws is accepted whole plus plain's next draw; a draft that differs at position j
    keeps j tokens and replaces the j-th by plain's draw. So a seed gives one text, under
    every policy."""
    generator = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 6, generator=generator, dtype=torch.float64), dim=-1)  # gamma = 3
    for seed in range(12):
        plain = [_plain(p[i], seed, 10 + i) for i in range(4)]
        assert coupled_sample(p, np.array(plain[:3]), seed, 10) == SamplingOutcome(3, plain[3])
        for j in range(3):
            draft = list(plain[:3])
            draft[j] = (plain[j] + 1) % 6
            assert coupled_sample(p, np.array(draft), seed, 10) == SamplingOutcome(j, plain[j])


def test_coupled_sampling_draws_from_the_target_distribution():
    """Across seeds, the first token follows p (chi-square, as for speculative sampling)."""
    p = torch.tensor([[0.1, 0.4, 0.2, 0.25, 0.05], [0.2] * 5], dtype=torch.float64)
    counts = np.zeros(5, dtype=np.int64)
    for seed in range(3000):
        outcome = coupled_sample(p, np.array([0]), seed, 7)
        counts[0 if outcome.num_accepted else outcome.next_token] += 1
    assert chi_square(counts, p[0].numpy()) < CHI2_CRITICAL_0_001[4]
    assert chi_square(counts, np.array([0.15, 0.35, 0.2, 0.25, 0.05])) > CHI2_CRITICAL_0_001[4]
