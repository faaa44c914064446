"""Measure a drafter in a plain in-process greedy speculative loop over a HF target.

The loop keeps the target's own KV cache (``DynamicCache.crop`` on rejection) and hands the
drafter what the reference engine would: on the first step the hidden states of every
prompt position, then the rows that produced the accepted tokens and the target's token.
Its output is checked against plain greedy decoding by the caller when wanted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from banditspec.drafters.base import Drafter
    from transformers import DynamicCache


@dataclass
class LoopStats:
    output_ids: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per step
    proposed: list[int] = field(default_factory=list)  # draft tokens proposed per step
    draft_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens per target step (accepted draft tokens + the target's own), the paper's MAT."""
        return float(np.mean(self.accepted) + 1) if self.accepted else 0.0


def _crop_to(cache: DynamicCache, keep: int) -> None:
    """Keep the first ``keep`` positions (transformers 5.24's crop takes minus the count to drop)."""
    drop = cache.get_seq_length() - keep
    if drop > 0:
        cache.crop(-drop)


@torch.inference_mode()
def _drafter_features(output: Any, layers: tuple[int, ...]) -> torch.Tensor:
    """[T, F]: the last post-norm states (EAGLE-1), or decoder layers' outputs (EAGLE-3)."""
    if not layers:
        return output.last_hidden_state[0].detach()
    return torch.cat([output.hidden_states[a + 1][0] for a in layers], dim=-1).detach()


@torch.inference_mode()
def target_features(model: Any, ids: Sequence[int], drafter: Drafter) -> np.ndarray:
    """float32 [len(ids), F]: what the target returns to ``drafter`` for every position of
    ``ids`` (one forward; the drafter's ``feature_layers``, () = the last post-norm state)."""
    layers = drafter.traits.feature_layers
    output = model.model(input_ids=torch.tensor([list(ids)]), output_hidden_states=bool(layers))
    return _drafter_features(output, layers).numpy()


@torch.inference_mode()
def greedy_speculative(model: Any, drafter: Drafter, prompt_ids: Sequence[int], gamma: int,
                       max_new_tokens: int, eos_id: int | None) -> LoopStats:
    """Greedy decoding of ``max_new_tokens`` with ``drafter`` proposing up to ``gamma`` tokens."""
    from transformers import DynamicCache

    stats = LoopStats()
    cache = DynamicCache()
    ids = torch.tensor([list(prompt_ids)])
    t0 = time.perf_counter()
    layers = drafter.traits.feature_layers
    output = model.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=bool(layers))
    hidden = output.last_hidden_state[0]
    token = int(model.lm_head(hidden[-1]).argmax())
    stats.target_seconds += time.perf_counter() - t0
    session = drafter.start(list(prompt_ids))
    session.observe([token], _drafter_features(output, layers).numpy())
    stats.output_ids.append(token)
    context = len(prompt_ids) + 1  # the cache holds all but the last token
    while len(stats.output_ids) < max_new_tokens and token != eos_id:
        t0 = time.perf_counter()
        draft = [int(t) for t in session.propose(min(gamma, max_new_tokens - len(stats.output_ids))).token_ids]
        stats.draft_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        step_ids = torch.tensor([[token] + draft])
        output = model.model(input_ids=step_ids, cache=cache, use_cache=True, output_hidden_states=bool(layers))
        hidden = output.last_hidden_state[0]
        greedy = model.lm_head(hidden).argmax(-1).tolist()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == greedy[accepted]:
            accepted += 1
            if draft[accepted - 1] == eos_id:
                break
        new = draft[:accepted] + ([] if accepted and draft[accepted - 1] == eos_id else [greedy[accepted]])
        _crop_to(cache, context - 1 + len(new))
        stats.target_seconds += time.perf_counter() - t0
        session.observe(new, _drafter_features(output, layers)[: len(new)].numpy())
        stats.accepted.append(accepted)
        stats.proposed.append(len(draft))
        stats.output_ids.extend(new)
        context += len(new)
        token = new[-1]
    session.close(finished=True)
    del stats.output_ids[max_new_tokens:]
    if eos_id is not None and eos_id in stats.output_ids:
        del stats.output_ids[stats.output_ids.index(eos_id) + 1:]
    return stats


@torch.inference_mode()
def step_costs(model: Any, drafter: Drafter, prompt_ids: Sequence[int], repeats: int = 20) -> dict[str, float]:
    """Median seconds of one target decode step and of one draft step at the same context.

    target: one token through the target with a KV cache of the prompt (LM head included).
    draft: one chained head step + argmax over the draft vocabulary, measured as
    (``propose(4)`` - ``propose(1)``) / 3 on a session whose prompt pairs are committed
    (``propose(1)`` then only reads the argmax of the stored prediction).
    """
    from transformers import DynamicCache

    cache = DynamicCache()
    ids = torch.tensor([list(prompt_ids)])
    layers = drafter.traits.feature_layers
    output = model.model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=bool(layers))
    hidden = output.last_hidden_state[0]
    token = int(model.lm_head(hidden[-1]).argmax())
    target_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        model.lm_head(out.last_hidden_state[0, -1]).argmax()
        target_times.append(time.perf_counter() - t0)
        _crop_to(cache, len(prompt_ids))
    session = drafter.start(list(prompt_ids))
    session.observe([token], _drafter_features(output, layers).numpy())
    session.propose(1)  # commit the prompt's pairs once
    one, four = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.propose(1)
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        session.propose(4)
        four.append(time.perf_counter() - t0)
    target = float(np.median(target_times))
    draft = max(0.0, (float(np.median(four)) - float(np.median(one))) / 3)
    return {"target_step_s": target, "draft_step_s": draft, "ratio": draft / target}


@torch.inference_mode()
def simulate_acceptance(drafter: Drafter, prompt_ids: Sequence[int], continuation: Sequence[int],
                        hidden: np.ndarray, gamma: int) -> LoopStats:
    """Replay a known greedy continuation step by step without calling the target.

    Greedy output does not depend on the drafter, so the speculative loop's steps can be
    replayed from the plain greedy ``continuation`` and the target's features ``hidden``
    float32 [len(prompt) + len(continuation), F] (:func:`target_features`): each step
    proposes, counts the matching prefix, and observes what the engine would return.
    """
    stats = LoopStats(output_ids=list(continuation))
    total = list(prompt_ids) + list(continuation)
    session = drafter.start(list(prompt_ids))
    pos = len(prompt_ids)
    session.observe([total[pos]], hidden[:pos])
    pos += 1
    while pos < len(total):
        t0 = time.perf_counter()
        draft = session.propose(min(gamma, len(total) - pos)).token_ids.tolist()
        stats.draft_seconds += time.perf_counter() - t0
        accepted = 0
        while accepted < len(draft) and draft[accepted] == total[pos + accepted]:
            accepted += 1
        new = total[pos: pos + accepted + 1]
        session.observe(new, hidden[pos - 1: pos - 1 + len(new)])
        stats.accepted.append(accepted)
        stats.proposed.append(len(draft))
        pos += len(new)
    session.close(finished=True)
    return stats
