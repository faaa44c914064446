"""The math of verification: greedy acceptance and speculative sampling.

Pure functions over tensors, no model involved, so that they can be tested on
hand-made distributions.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): with target
distribution ``p`` and draft distribution ``q`` at one position, the draft token
``x`` is accepted with probability ``min(1, p(x) / q(x))``; on rejection a token is
drawn from the residual ``norm(max(p - q, 0))``. The token that results is
distributed exactly as ``p``. A deterministic draft is the point mass
``q = one_hot(x)``: accept with probability ``p(x)``, else draw from ``p`` with ``x``
removed and renormalised. After the last draft token is accepted, a bonus token is
drawn from ``p`` at the next position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Sampling runs in float64 so that ratios and residuals of small probabilities keep
# their precision (the chi-square test of the engine relies on exact marginals).
SAMPLING_DTYPE = torch.float64


def make_generator(seed: int, sequence_length: int) -> torch.Generator:
    """A CPU generator derived from (seed, sequence_length).

    The same request (same seed, same input length) always draws the same numbers,
    whatever the engine did before: the randomness of a call is stateless.
    """
    mixed = np.random.SeedSequence([int(seed) & (2**64 - 1), int(sequence_length)])
    state = int(mixed.generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(state)
    return generator


def target_distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """p = softmax(logits / temperature).

    logits: float32 [positions, vocab] -> float64 [positions, vocab], rows sum to 1.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    return torch.softmax(logits.to(SAMPLING_DTYPE) / temperature, dim=-1)


def count_greedy_accepted(target_tokens: np.ndarray, draft_ids: np.ndarray) -> int:
    """Length of the longest draft prefix that equals the target's argmax tokens.

    target_tokens: int [gamma + 1] the target's argmax after each prefix
    draft_ids:     int [gamma]
    """
    gamma = len(draft_ids)
    mismatches = np.flatnonzero(np.asarray(target_tokens[:gamma]) != np.asarray(draft_ids))
    return int(mismatches[0]) if mismatches.size else gamma


def residual_distribution(p: torch.Tensor, draft_token: int, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(p - q, 0)) for one position; q None means the point mass on draft_token.

    p: float64 [vocab]; q: float64 [vocab] or None -> float64 [vocab], sums to 1.
    When p <= q everywhere (a rejection of probability zero that rounding made
    happen), falls back to p itself.
    """
    if q is None:
        residual = p.clone()
        residual[draft_token] = 0.0
    else:
        residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    if not total > 0:
        return p
    return residual / total


def acceptance_probability(p: torch.Tensor, draft_token: int, q: torch.Tensor | None) -> float:
    """min(1, p(x) / q(x)) for one position; q None means the point mass (ratio p(x)).

    p, q: float64 [vocab].
    """
    p_x = float(p[draft_token])
    if q is None:
        return min(1.0, p_x)
    q_x = float(q[draft_token])
    if q_x <= 0.0:
        # The drafter proposed a token it gave no mass: ratio is +inf when p(x) > 0.
        return 1.0 if p_x > 0.0 else 0.0
    return min(1.0, p_x / q_x)


@dataclass(frozen=True)
class SamplingOutcome:
    """num_accepted draft tokens, then next_token drawn by the target."""

    num_accepted: int
    next_token: int


def coupled_sample(p: torch.Tensor, draft_ids: np.ndarray, seed: int, input_length: int) -> SamplingOutcome:
    """Verification of a deterministic draft that samples exactly what plain decoding samples.

    p: float64 [gamma + 1, vocab] target distributions after each draft prefix. Position i
    draws its token from p[i] with the generator of (seed, input_length + i), the very draw
    plain decoding makes at that sequence length; the draft is accepted while it equals
    those draws. Each emitted token is thus a draw from the target's distribution given its
    prefix (lossless in distribution), and the output for a seed does not depend on which
    drafts were verified: the same seed gives the same text under every policy.
    """
    gamma = len(draft_ids)
    if p.shape[0] != gamma + 1:
        raise ValueError(f"p must have gamma + 1 = {gamma + 1} rows, got {p.shape[0]}")
    for i in range(gamma + 1):
        token = int(torch.multinomial(p[i], 1, generator=make_generator(seed, input_length + i)))
        if i == gamma or token != int(draft_ids[i]):
            return SamplingOutcome(i, token)
    raise AssertionError("unreachable")


def speculative_sample(
    p: torch.Tensor,
    draft_ids: np.ndarray,
    q: torch.Tensor | None,
    generator: torch.Generator,
) -> SamplingOutcome:
    """One round of speculative sampling.

    p:         float64 [gamma + 1, vocab] target distribution after each draft prefix
    draft_ids: int [gamma] draft tokens
    q:         float64 [gamma, vocab] draft distributions, or None for deterministic drafts
    generator: the call's random source (see :func:`make_generator`)
    """
    gamma = len(draft_ids)
    if p.shape[0] != gamma + 1:
        raise ValueError(f"p must have gamma + 1 = {gamma + 1} rows, got {p.shape[0]}")
    uniforms = torch.rand(gamma, generator=generator, dtype=SAMPLING_DTYPE)
    for i in range(gamma):
        token = int(draft_ids[i])
        q_i = None if q is None else q[i]
        if float(uniforms[i]) < acceptance_probability(p[i], token, q_i):
            continue
        residual = residual_distribution(p[i], token, q_i)
        return SamplingOutcome(i, int(torch.multinomial(residual, 1, generator=generator)))
    return SamplingOutcome(gamma, int(torch.multinomial(p[gamma], 1, generator=generator)))
