"""The draft vocabulary: which target ids the head may propose.

A draft step scores only these rows of the target's LM head (8192 of 49152 by default); a
draft index d maps back to target id ``draft_vocab[d]``. Ids are ranked by the sum of two
normalised frequencies: in training text, and as the target's own greedy choice at sampled
training positions (what the drafter has to predict).
"""

from __future__ import annotations

import numpy as np
import torch

from banditspec_train.eagle.features import FeatureSet


def choose_draft_vocab(scores: np.ndarray, size: int, always: list[int]) -> torch.Tensor:
    """int64 [size]: ``always`` ids first, then the highest scores (stable order)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    chosen = list(dict.fromkeys(int(t) for t in always if 0 <= t < len(scores)))
    seen = set(chosen)
    for token in order:
        if len(chosen) >= size:
            break
        if int(token) not in seen:
            chosen.append(int(token))
            seen.add(int(token))
    return torch.tensor(chosen[:size], dtype=torch.int64)


@torch.no_grad()
def target_argmax_counts(embedding: torch.Tensor, fs: FeatureSet, sample: int, seed: int) -> np.ndarray:
    """int64 [V]: how often each id is the target's greedy choice, over ``sample`` random
    positions of ``fs`` (the LAST H columns of a feature row are the LM-head input)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(fs.features), size=min(sample, len(fs.features)), replace=False))
    hidden = embedding.shape[1]
    weights = embedding.float()
    counts = np.zeros(embedding.shape[0], dtype=np.int64)
    for start in range(0, len(rows), 2048):
        chunk = torch.from_numpy(fs.features[rows[start:start + 2048], -hidden:].astype(np.float32))
        top = (chunk @ weights.T).argmax(-1).numpy()
        counts += np.bincount(top, minlength=len(counts))
    return counts


def draft_vocab_scores(embedding: torch.Tensor, fs: FeatureSet, text_counts: np.ndarray,
                       sample: int, seed: int) -> np.ndarray:
    """float64 [V]: text frequency + greedy-choice frequency, each normalised to sum 1."""
    greedy = target_argmax_counts(embedding, fs, sample, seed).astype(np.float64)
    text = np.asarray(text_counts, dtype=np.float64)[: len(greedy)]
    return text / max(1.0, text.sum()) + greedy / max(1.0, greedy.sum())
