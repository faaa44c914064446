"""Training objective of the EAGLE-3 head: training-time test over several draft steps.

Step 1: pair i = (E[x_{i+1}], g_i = fc(a_i)) gives the head's state s1_i, whose logits
predict x_{i+2}. Step s > 1 feeds the head its own state from step s - 1 at the previous
position instead of g (pair i = (E[x_{i+1}], s_{s-1, i-1})), exactly the context the s-th
chained draft token sees at inference: it attends to the real pairs 0 .. i-s+1 of step 1,
the step-r pair at position i-s+r for 2 <= r < s, and itself (:func:`unrolled_mask`).

Loss per step: cross-entropy between the target's next-token distribution over the draft
vocabulary (softmax of the target's logits at position i+1 restricted to the draft ids,
from the stored post-norm feature) and the head's, averaged over counted pairs; EAGLE-3
drops EAGLE-1's feature regression. Step s weighs ``step_decay ** (s - 1)``.

Reach weighting (``reach=True``): a chained draft's s-th token is verified only when its
s - 1 earlier tokens were accepted, so step s's loss counts only the pairs whose chain reaches
it (each earlier step's argmax equals the text's next token, which on the answers is the
target's greedy choice), still divided by all the step's pairs: the steps then weigh as often
as serving reaches them (GRIFFIN's loss masking, Hu et al. 2025, for a chain of top-1 drafts).

Feature rows (:mod:`.selfdistill` with ``aux_layers``): ``[a_i (k * H) ; f_i (H)]``, f_i the
post-norm last hidden state (LM-head input).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from banditspec.eagle.head3 import Eagle3Head

from banditspec_train.eagle.objective import Batch, StepStats, unrolled_mask, weighted_steps


def unrolled_states(head: Eagle3Head, embeddings: torch.Tensor, aux: torch.Tensor,
                    steps: int, dropout: float = 0.0) -> list[torch.Tensor]:
    """Own hidden states [B, N, H] of steps 1..steps.

    embeddings: E[x_{i+1}] [B, N, H]; aux: a_i [B, N, k * H]. Element i of step s predicts
    x_{i+2} when it is the s-th draft token made from position i - s + 1 (valid for i >= s - 1).
    ``dropout``: on g = fc(a) and both residual branches of the layer while the head trains
    (experiments/eagle/variant_study.py; the build trains without).
    """
    drop = dropout if head.training else 0.0
    n = aux.shape[1]
    positions = torch.arange(n)
    fused = F.dropout(head.project(aux), drop) if drop > 0 else head.project(aux)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    states: list[torch.Tensor] = []
    for step in range(1, steps + 1):
        hidden = fused if step == 1 else torch.cat([fused[:, :1], states[-1][:, :-1]], dim=1)
        q, k, v = head.qkv(embeddings, hidden, positions)
        keys.append(k)
        values.append(v)
        attn = head.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), unrolled_mask(n, step))
        if drop > 0:  # head.finish with the two residual branches dropped
            m = head.midlayer
            h = hidden + F.dropout(m.self_attn.o_proj(attn), drop)
            states.append(h + F.dropout(m.mlp(m.post_attention_layernorm(h)), drop))
        else:
            states.append(head.finish(hidden, attn))
    return states


def teacher_distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 [M, K] labels from the target's logits [M, K]: softmax(logits / temperature);
    temperature 0 is the one-hot of the target's argmax (what greedy verification accepts)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return (logits.float() / temperature).softmax(-1)


class _SoftCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy -sum_k p_k log softmax(z)_k with the gradient softmax(z) - p
    (rows of ``p`` sum to 1) written over the saved log-probabilities: the same values as
    ``-(p * z.log_softmax(-1)).sum(-1)`` under autograd with two fewer [m, K] buffers each way
    (on a CPU the [m, K] passes, not the matmuls, were most of a training step)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        log_probs = logits.log_softmax(-1)  # [m, K]
        ctx.save_for_backward(log_probs, probs)
        return -torch.linalg.vecdot(probs, log_probs)  # [m]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        log_probs, probs = ctx.saved_tensors
        return log_probs.exp_().sub_(probs).mul_(grad[:, None]), None  # in place: backward runs once


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """float32 [m] per-row cross-entropy of ``logits`` [m, K] against distributions ``probs`` [m, K]."""
    return _SoftCrossEntropy.apply(logits, probs)


def unrolled_loss3(head: Eagle3Head, embedding: torch.Tensor, lm_rows: torch.Tensor, batch: Batch,
                   steps: int, step_decay: float = 0.8, label_temperature: float = 1.0,
                   top1: bool = True, reach: bool = False) -> StepStats:
    """embedding: float32 [V, H] (the target's frozen embedding); lm_rows: float32 [K, H], the
    target's LM-head rows of the draft vocabulary (teacher logits). batch.features: [B, T, (k+1) H].
    ``label_temperature``: of the teacher's distribution (1: the target's own; < 1 sharper; 0 its
    argmax alone). ``top1=False`` skips the agreement (an argmax over [m, K] per step; training
    does not need it) and reports ``per_step_top1`` empty. ``reach``: reach weighting (above).
    With ``top1``, ``replay`` is the speculative loop replayed over each sequence's counted
    pairs: drafting ``steps`` tokens from the first, verifying them against the text (on the
    answers, the target's greedy tokens), moving past the accepted ones and the target's own
    token, drafting again (:func:`replay_chains`).

    Logits (the head's and the teacher's, [*, K]: most of a step's cost) are computed only for
    the pairs in the loss (batch.counted), not for padding or prompt positions (the same loss
    as scoring the full grid and masking it). Every step scores all counted pairs against the
    one teacher matrix and drops its first s - 1 pairs from the [m] losses afterwards (a few
    rows of wasted logits instead of copying the [M, K] teacher per step)."""
    hidden_size = head.config.hidden_size
    aux = batch.features[:, :-1, :-hidden_size]  # a_i, pairs i = 0 .. T-2
    counted = batch.counted  # [B, T-1]
    with torch.no_grad(), torch.autocast("cpu", enabled=False):  # fp32 labels even under bf16 autocast
        final = batch.features[:, 1:, -hidden_size:][counted]  # f_{i+1} of counted pairs [M, H]
        teacher_logits = final @ lm_rows.T  # [M, K]
        teacher_probs = teacher_distribution(teacher_logits, label_temperature)
        teacher_top1 = teacher_logits.argmax(-1) if top1 else None
    states = unrolled_states(head, embedding[batch.tokens[:, 1:]], aux, steps)
    next_ids = torch.full(counted.shape, -1, dtype=torch.int64)  # x_{i+2} of pair i [B, N]; -1 past the end
    next_ids[:, :-1] = batch.tokens[:, 2:]
    target_next = next_ids[counted]  # [M]
    reached = [counted]  # per step: pairs [B, N] whose chain reaches it (every earlier draft accepted)
    accepted: list[torch.Tensor] = []  # per step: pairs [B, N] whose draft is accepted after every earlier one

    def score(state: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        keep = mask[counted]  # [M]: which counted pairs this step scores (same row-major order)
        logits = head.logits(state[counted]).float()  # [M, K]
        losses = soft_cross_entropy(logits, teacher_probs)  # [M]
        here = reached[-1]  # this step's pairs the chain reaches
        if reach:
            losses = losses * here[counted].to(losses.dtype)
        agree = None
        # the argmax ([M, K] pass): for the agreement, and for the chain where a later step reads it
        if top1 or (reach and len(reached) < steps):
            choice = logits.detach().argmax(-1)  # [M] draft ids
            agree = choice[keep] == teacher_top1[keep] if teacher_top1 is not None else None
            hit = torch.zeros_like(counted)
            hit[counted] = head.draft_vocab[choice] == target_next
            ok = here & hit & mask  # [B, N]
            accepted.append(ok)
            following = torch.zeros_like(ok)  # step s + 1 at pair i continues the chain of step s at i - 1
            following[:, 1:] = ok[:, :-1]
            reached.append(following)
        return losses[keep], agree

    stats = weighted_steps(states, score, counted, step_decay)
    if top1:
        stats.replay = replay_chains(accepted, counted)
    return stats


def replay_chains(accepted: list[torch.Tensor], counted: torch.Tensor) -> tuple[int, int]:
    """(draft steps, accepted tokens) of the speculative loop over each row's counted pairs.

    accepted[s - 1]: bool [B, N], step s's draft at pair i accepted after every earlier one (its
    chain starts at pair i - s + 1). From origin o a chain gets sum_s accepted[s - 1][o + s - 1]
    tokens; the loop drafts at the row's first counted pair and then at o + accepted + 1, while
    a token is left to draft (o before the row's last counted pair, whose x_{i+2} is past the end).
    """
    n = counted.shape[1]
    per_origin = torch.zeros(counted.shape, dtype=torch.int64)  # [B, N]
    for step, ok in enumerate(accepted):
        per_origin[:, : n - step] += ok[:, step:].long()
    steps = tokens = 0
    for row, gains in zip(counted.tolist(), per_origin.tolist()):
        pairs = [i for i, c in enumerate(row) if c]
        if not pairs:
            continue
        origin, last = pairs[0], pairs[-1]
        while origin < last:
            steps += 1
            tokens += gains[origin]
            origin += gains[origin] + 1
    return steps, tokens
