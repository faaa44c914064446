"""Training objective of the head, unrolled over several draft steps.

Step 1 is EAGLE-1's teacher-forced pass: pair i = (f_i + noise, x_{i+1}) predicts f_{i+1}.
Step s > 1 feeds the head its own prediction instead of the real feature, as chain drafting
does (the "training-time test" of EAGLE-3): pair i uses f^_i from step s-1 and attends to the
real pairs 0 .. i-s+1 of step 1, the step-r pair at position i-s+r for 2 <= r < s, and itself.
That is exactly the context the s-th draft token sees at inference.

Loss per step (mean over counted pairs): smooth-L1(f^_{i+1}, f_{i+1}) (mean over the hidden
size) + cls_weight * cross-entropy between the target's distribution softmax(E_d f_{i+1})
and the head's softmax(E_d f^_{i+1}), both over the draft vocabulary rows E_d. Step s weighs
step_decay ** (s - 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from banditspec.eagle.head import EagleHead


@dataclass
class Batch:
    """tokens int64 [B, T]; features float32 [B, T, H]; counted bool [B, T-1] (pairs in the loss)."""

    tokens: torch.Tensor
    features: torch.Tensor
    counted: torch.Tensor


@dataclass
class StepStats:
    loss: torch.Tensor  # scalar, weighted over steps, with grad
    per_step_loss: list[float]
    per_step_top1: list[float]  # head argmax == target argmax (within the draft vocab); [] if not measured
    replay: tuple[int, int] | None = None  # EAGLE-3: (draft steps, accepted tokens) of the loop replayed (objective3)


def unrolled_mask(n: int, step: int) -> torch.Tensor:
    """bool [n, step * n]: which keys (blocks of steps 1..step) query i of ``step`` may see."""
    i = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    blocks = [k <= i - step + 1]
    blocks += [k == i - step + r for r in range(2, step + 1)]
    return torch.cat(blocks, dim=1)


def unrolled_predictions(head: EagleHead, embeddings: torch.Tensor, real: torch.Tensor,
                         steps: int, noise: float = 0.0) -> list[torch.Tensor]:
    """Predicted features [B, N, H] of steps 1..steps for pairs (real[:, i], embeddings[:, i]).

    embeddings: E[x_{i+1}] [B, N, H]; real: f_i [B, N, H]. Element i of step s predicts
    f_{i+1} when the s-th draft token is made from position i (valid for i >= s - 1).
    """
    n = real.shape[1]
    positions = torch.arange(n)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for step in range(1, steps + 1):
        if step == 1:
            inputs = real + (torch.rand_like(real) * 2 - 1) * noise if noise > 0 else real
        else:
            inputs = torch.cat([real[:, :1], outputs[-1][:, :-1]], dim=1)
        u = head.fuse(embeddings, inputs)
        q, k, v = head.qkv(u, positions)
        keys.append(k)
        values.append(v)
        attn = head.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), unrolled_mask(n, step))
        outputs.append(head.finish(u, attn))
    return outputs


def unrolled_loss(head: EagleHead, embedding: torch.Tensor, batch: Batch, steps: int,
                  noise: float = 0.0, cls_weight: float = 0.1, step_decay: float = 0.8) -> StepStats:
    """embedding: float32 [V, H], the target's frozen embedding / LM head."""
    lm_rows = embedding[head.draft_vocab]  # [K, H]
    target = batch.features[:, 1:]  # f_{i+1}
    with torch.no_grad():
        teacher_logits = head.draft_logits(target, lm_rows)
        teacher_probs = teacher_logits.softmax(-1)
        teacher_top1 = teacher_logits.argmax(-1)
    predictions = unrolled_predictions(head, embedding[batch.tokens[:, 1:]], batch.features[:, :-1],
                                       steps, noise)

    def score(predicted: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head.draft_logits(predicted, lm_rows)
        reg = F.smooth_l1_loss(predicted.float(), target, reduction="none").mean(-1)
        cls = -(teacher_probs * logits.float().log_softmax(-1)).sum(-1)
        return (reg + cls_weight * cls)[mask], (logits.detach().argmax(-1) == teacher_top1)[mask]

    return weighted_steps(predictions, score, batch.counted, step_decay)


Score = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, "torch.Tensor | None"]]


def weighted_steps(outputs: list[torch.Tensor], score: Score, counted: torch.Tensor, step_decay: float) -> StepStats:
    """Per-step mean loss over counted pairs (step s counts pairs i >= s - 1), weighted
    ``step_decay ** (s - 1)``, and top-1 agreement. ``score(output, mask)`` -> (loss of each
    pair in ``mask`` [m], whether the head's argmax is the target's there [m], or None where
    not measured: ``per_step_top1`` is then empty), in ``mask``'s row-major order (it may
    compute only those pairs)."""
    total = torch.zeros(())
    weight_sum = 0.0
    per_loss, per_top1 = [], []
    for step, output in enumerate(outputs, start=1):
        mask = counted.clone()
        mask[:, : step - 1] = False
        denom = max(1, int(mask.sum()))
        pair_loss, agree = score(output, mask)
        loss = pair_loss.sum() / denom
        w = step_decay ** (step - 1)
        total = total + w * loss
        weight_sum += w
        per_loss.append(float(loss.detach()))
        if agree is not None:
            per_top1.append(float(agree.sum()) / denom)
    return StepStats(total / weight_sum, per_loss, per_top1)
