"""``banditspec build eagle``: train the Eagle head of a target, reproducibly (seeded).

Pipeline: the target answers training prompts greedily, keeping its features
(:mod:`.selfdistill`; optionally plus fixed text, :mod:`.corpus`), cached in the cache folder
(:mod:`.dataset`) -> draft vocabulary (:mod:`.vocab`) -> unrolled training with
training-time test (:mod:`.objective3` for the EAGLE-3 head, the default; :mod:`.objective`
for the older EAGLE-1 head) -> bf16 safetensors + JSON (config, data, metrics) + loss-curve PNG.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from banditspec.eagle import EAGLE1_WEIGHTS, EAGLE3_WEIGHTS
from banditspec.eagle.head import EagleConfig, EagleHead, save_head
from banditspec.eagle.head3 import Eagle3Config, Eagle3Head, default_aux_layers, save_head3
from banditspec.errors import BanditSpecValidationError
from banditspec.paths import REPO_ROOT

from banditspec_train.eagle.allocator import keep_freed_memory, use_huge_pages
from banditspec_train.eagle.corpus import CorpusSpec, token_frequencies
from banditspec_train.eagle.dataset import concat, training_parts
from banditspec_train.eagle.features import FeatureSet
from banditspec_train.eagle.objective import Batch, StepStats, unrolled_loss
from banditspec_train.eagle.objective3 import unrolled_loss3
from banditspec_train.eagle.selfdistill import PRECISIONS, DistillSpec
from banditspec_train.eagle.vocab import choose_draft_vocab, draft_vocab_scores

log = logging.getLogger(__name__)

DEFAULT_PLOT = REPO_ROOT / "docs" / "eagle" / "loss_curve_eagle3.png"
FORMATS = ("eagle3", "eagle1")


def native_bf16() -> bool:
    """True where CPU bf16 matmuls are fast (AVX-512); on AVX2 they are several times slower."""
    return "AVX512" in str(torch.backends.cpu.get_cpu_capability())


DISTILL_PARTS = 2  # self-distilled parts a build trains on (DistillSpec.part 0, 1, ...)


@dataclass(frozen=True)
class TrainConfig:
    # 3 -> 6 epochs: held-out top-1 0.473 -> 0.507 at draft step 1; then twice the data
    # (DISTILL_PARTS) at 3 epochs, about the same optimizer steps (docs/eagle.md)
    epochs: int = 3
    batch_tokens: int = 2048
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    unroll_steps: int = 4  # EAGLE-3's training-time test: draft steps trained (chains are drafted 4 deep)
    noise: float = 0.2
    cls_weight: float = 1.0
    step_decay: float = 0.8
    label_temperature: float = 0.5  # eagle3: teacher distribution's temperature (0: its argmax; 0.5 measured better than 1)
    reach_weighting: bool = False  # eagle3: step s counts only pairs whose chain reaches it (objective3)
    seed: int = 0
    bf16: bool = False  # CPU bf16 autocast for the matmuls (3-5x faster on AVX512-BF16, slower on AVX2)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_tokens", "unroll_steps"):
            if getattr(self, name) < 1:
                raise BanditSpecValidationError(name, "must be >= 1")
        if not self.lr > 0:
            raise BanditSpecValidationError("lr", "must be > 0")
        if not 0 < self.step_decay <= 1:
            raise BanditSpecValidationError("step_decay", "must be in (0, 1]")
        if not self.label_temperature >= 0:
            raise BanditSpecValidationError("label_temperature", "must be >= 0")
        if self.noise < 0 or self.cls_weight < 0:
            raise BanditSpecValidationError("noise", "noise and cls_weight must be >= 0")


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)  # one per optimizer step
    val_loss: list[float] = field(default_factory=list)  # per unroll step
    val_top1: list[float] = field(default_factory=list)  # per unroll step
    val_mat: float | None = None  # eagle3: mean accepted tokens a step, the loop replayed at gamma = unroll_steps
    seconds: float = 0.0
    steps: int = 0  # optimizer steps taken


def make_batches(fs: FeatureSet, batch_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """Shuffled batches of sequence indices; similar lengths grouped, <= batch_tokens padded."""
    order = rng.permutation(len(fs))
    lengths = np.diff(fs.offsets)
    batches: list[list[int]] = []
    group = 64
    for g in range(0, len(order), group):
        members = sorted(order[g:g + group], key=lambda s: lengths[s])
        current: list[int] = []
        for s in members:
            if current and max(lengths[current + [s]]) * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current = []
            current.append(int(s))
        if current:
            batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]


def collate(fs: FeatureSet, indices: list[int]) -> Batch:
    parts = [fs.sequence(s) for s in indices]
    width = max(len(t) for t, _ in parts)
    hidden = fs.features.shape[1]
    tokens = torch.zeros(len(parts), width, dtype=torch.int64)
    features = torch.zeros(len(parts), width, hidden, dtype=torch.float32)
    counted = torch.zeros(len(parts), width - 1, dtype=torch.bool)
    for row, (s, (ids, feats)) in enumerate(zip(indices, parts)):
        n = len(ids)
        tokens[row, :n] = torch.from_numpy(ids.astype(np.int64))
        features[row, :n] = torch.from_numpy(feats.astype(np.float32))
        counted[row, int(fs.loss_from[s]): n - 1] = True
    return Batch(tokens, features, counted)


def split_validation(distilled: FeatureSet | None, text: FeatureSet | None, fraction: float,
                     seed: int) -> tuple[FeatureSet, FeatureSet]:
    """(validation, training) sets. Validation sequences are drawn (seeded) from the
    self-distilled answers alone, the text drafting will meet in serving (from the fixed text
    only when there are no answers); the fixed text trains. Without fixed text this is the split
    every shipped head was measured on."""
    held = distilled if distilled is not None else text
    assert held is not None
    order = np.random.default_rng(seed).permutation(len(held))
    n_val = int(round(len(held) * fraction))
    val_set, train_part = held.subset(sorted(order[:n_val])), held.subset(sorted(order[n_val:]))
    if held is distilled and text is not None:
        return val_set, concat([train_part, text])
    return val_set, train_part


LossFn = Callable[[Batch, bool], StepStats]  # (batch, training: noise on) -> stats


def loss_function(head: EagleHead | Eagle3Head, embedding: torch.Tensor, lm_rows: torch.Tensor | None,
                  cfg: TrainConfig) -> LossFn:
    """The unrolled objective of the head's format (EAGLE-3 or EAGLE-1)."""
    embedding = embedding.detach()
    if isinstance(head, Eagle3Head):
        assert lm_rows is not None

        def loss3(batch: Batch, training: bool) -> StepStats:
            return unrolled_loss3(head, embedding, lm_rows, batch, cfg.unroll_steps, cfg.step_decay,
                                  cfg.label_temperature, top1=not training, reach=cfg.reach_weighting)

        return loss3

    def loss1(batch: Batch, training: bool) -> StepStats:
        return unrolled_loss(head, embedding, batch, cfg.unroll_steps, cfg.noise if training else 0.0,
                             cfg.cls_weight, cfg.step_decay)

    return loss1


def train_head(head: EagleHead | Eagle3Head, loss_fn: LossFn, train_set: FeatureSet,
               val_set: FeatureSet | None, cfg: TrainConfig, progress: bool = True,
               max_seconds: float | None = None) -> TrainResult:
    """Train ``head`` in place (the target's matrices stay frozen); returns the loss history.
    ``max_seconds``: the learning-rate schedule is stretched over the planned steps, but
    training stops (and says so in the log) once this much time has passed."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    # decay matrices only: norms' gains stay free (an optimizer step is per tensor, so with no
    # decay the two groups train exactly as one)
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=cfg.lr)
    epochs = [make_batches(train_set, cfg.batch_tokens, rng) for _ in range(cfg.epochs)]
    total_steps = sum(len(e) for e in epochs)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        done = (step - cfg.warmup) / max(1, total_steps - cfg.warmup)
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * done)))

    result = TrainResult()
    start = time.time()
    head.train()
    bar = tqdm(total=total_steps, desc="eagle head", unit="step", disable=not progress)
    step = 0
    for batches in epochs:
        for indices in batches:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                stats = loss_fn(collate(train_set, indices), True)
            optimizer.zero_grad(set_to_none=True)
            stats.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            result.losses.append(float(stats.loss.detach()))
            bar.set_postfix(loss=f"{result.losses[-1]:.3f}",
                            **({"top1": f"{stats.per_step_top1[0]:.2f}"} if stats.per_step_top1 else {}))
            bar.update(1)
            step += 1
            if max_seconds is not None and time.time() - start > max_seconds:
                log.warning("training stopped after %d of %d steps: time limit of %.0f s", step,
                            total_steps, max_seconds)
                break
        else:
            continue
        break
    bar.close()
    result.steps = step
    head.eval()
    if val_set is not None and len(val_set):
        result.val_loss, result.val_top1, result.val_mat = evaluate_head(loss_fn, val_set, cfg)
    result.seconds = time.time() - start
    return result


@torch.no_grad()
def evaluate_head(loss_fn: LossFn, fs: FeatureSet,
                  cfg: TrainConfig) -> tuple[list[float], list[float], float | None]:
    """Mean per-step loss and top-1 agreement over ``fs`` (no noise), weighted by batch, and
    (EAGLE-3) the mean accepted tokens a step (accepted + 1) of the speculative loop replayed over
    ``fs``'s answers at gamma = ``unroll_steps``, the head drafting in fp32 (None for EAGLE-1)."""
    rng = np.random.default_rng(0)
    losses = np.zeros(cfg.unroll_steps)
    top1 = np.zeros(cfg.unroll_steps)
    steps = tokens = 0
    batches = make_batches(fs, cfg.batch_tokens, rng)
    for indices in batches:
        stats = loss_fn(collate(fs, indices), False)
        losses += np.asarray(stats.per_step_loss) / len(batches)
        top1 += np.asarray(stats.per_step_top1) / len(batches)
        if stats.replay is not None:
            steps, tokens = steps + stats.replay[0], tokens + stats.replay[1]
    mat = round(1 + tokens / steps, 4) if steps else None
    return losses.round(4).tolist(), top1.round(4).tolist(), mat


# --- the command -----------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d, ds, c = TrainConfig(), DistillSpec(), CorpusSpec()
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--format", default="eagle3", choices=FORMATS,
                        help="eagle3: multi-layer features, own LM head (default); eagle1: the older head")
    parser.add_argument("--out", type=Path, default=None,
                        help="weights .safetensors (default: the shipped file of the format)")
    parser.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help="loss-curve PNG")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--chat-prompts", type=int, default=ds.chat_prompts,
                        help="ShareGPT train-split prompts the target answers (self-distillation)")
    parser.add_argument("--code-prompts", type=int, default=ds.code_prompts,
                        help="stdlib 'complete this function' prompts the target answers")
    parser.add_argument("--max-new-tokens", type=int, default=ds.max_new_tokens)
    parser.add_argument("--distill-batch", type=int, default=ds.batch_size,
                        help="sequences the target answers together (batched greedy decoding)")
    parser.add_argument("--distill-precision", default=ds.precision, choices=PRECISIONS,
                        help="fp32: the fp32 target answers and keeps its features, one pass (default); "
                             "bf16: a bf16 copy writes the answers, features from one bf16-autocast pass "
                             "(1.9x faster with AMX, but its heads draft worse: bf16 answers are not the fp32 target's)")
    parser.add_argument("--loss-on", default=ds.loss_on, choices=("answers", "text"),
                        help="pairs in the loss: the target's answers only (what a drafter is asked "
                             "for) or the user's prompt too")
    parser.add_argument("--distill-parts", type=int, default=DISTILL_PARTS,
                        help="self-distilled parts of --chat-prompts and --code-prompts prompts each, the "
                             "next ones of the same seeded lists; the validation split comes from the first "
                             "part alone, the later parts train only (2 parts at 3 epochs: held-out chat 2.015 "
                             "against 1.946 for 1 part at 6 epochs; docs/eagle.md)")
    parser.add_argument("--distill-workers", type=int, default=2,
                        help="self-distillation processes of one torch thread each (one per core)")
    parser.add_argument("--text-chat-tokens", type=int, default=c.chat_tokens,
                        help="extra fixed text: ShareGPT train conversations (tokens)")
    parser.add_argument("--text-code-tokens", type=int, default=c.code_tokens,
                        help="extra fixed text: stdlib code windows (tokens)")
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--vocab-sample", type=int, default=40000,
                        help="training positions whose target argmax counts towards the draft vocab")
    parser.add_argument("--warm-start-layer", type=int, default=None,
                        help="eagle3: start the head's layer as this target decoder layer and fc as the "
                             "identity on the highest captured layer; default: the layer that reads that "
                             "layer's output (27 of SmolLM2's 30); -1: random init")
    parser.add_argument("--warm-start-fc-noise", type=float, default=0.002,
                        help="eagle3, with --warm-start-layer: std of fc's init off the identity")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-tokens", type=int, default=d.batch_tokens)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW's (decoupled)")
    parser.add_argument("--unroll-steps", type=int, default=d.unroll_steps)
    parser.add_argument("--label-temperature", type=float, default=d.label_temperature,
                        help="eagle3: temperature of the target's distribution the head learns "
                             "(1: as it is; < 1 sharper; 0: its argmax only)")
    parser.add_argument("--reach-weighting", action=argparse.BooleanOptionalAction, default=d.reach_weighting,
                        help="eagle3: draft step s learns only where the chain reaches it (its earlier "
                             "drafts right), as serving verifies it")
    parser.add_argument("--step-decay", type=float, default=d.step_decay,
                        help="draft step s's loss weighs step_decay ** (s - 1)")
    parser.add_argument("--noise", type=float, default=d.noise, help="eagle1 only: feature noise")
    parser.add_argument("--cls-weight", type=float, default=d.cls_weight, help="eagle1 only")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--max-train-minutes", type=float, default=None,
                        help="stop training after this long (the schedule still spans every epoch)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (default: only where the CPU has AVX-512)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-progress", action="store_true")


def _new_head(args: argparse.Namespace, model: Any, tokenizer: Any, train_set: FeatureSet,
              embedding: torch.Tensor) -> EagleHead | Eagle3Head:
    """A fresh head of the requested format with its draft vocabulary chosen."""
    text_counts = token_frequencies(tokenizer, args.seed)
    scores = draft_vocab_scores(embedding, train_set, np.asarray(text_counts), args.vocab_sample, args.seed)
    always = [i for i in (model.config.eos_token_id, tokenizer.eos_token_id) if i is not None]
    torch.manual_seed(args.seed)
    if args.format == "eagle1":
        head1 = EagleHead(EagleConfig.for_target(model.config, args.draft_vocab))
        head1.draft_vocab = choose_draft_vocab(scores, head1.config.draft_vocab_size, always)
        return head1
    head = Eagle3Head(Eagle3Config.for_target(model.config, args.draft_vocab))
    head.draft_vocab = choose_draft_vocab(scores, head.config.draft_vocab_size, always)
    with torch.no_grad():  # start from the target's own output layer, restricted to the draft ids
        head.lm_head.weight.copy_(model.lm_head.weight.detach().float()[head.draft_vocab])
        head.norm.weight.copy_(model.model.norm.weight.detach().float())
    layer = warm_start_layer(args.warm_start_layer, head.config)
    if layer is not None:
        warm_start(head, model, layer, args.warm_start_fc_noise)
    return head


def warm_start_layer(asked: int | None, config: Eagle3Config) -> int | None:
    """The target layer the head starts from: ``asked``, or by default (None) the layer after
    the highest captured one (its output is that layer's input: 27 for SmolLM2's {1, 14, 26}),
    which held-out chat preferred to a random init by 1.946 to 1.818 accepted tokens a step
    at gamma 4; -1: no warm start."""
    if asked is None:
        return config.aux_layers[-1] + 1  # a captured layer is at most the last but one
    return None if asked < 0 else asked


def check_warm_start(asked: int | None, head_format: str, num_layers: int, off_allowed: bool = True) -> None:
    """``--warm-start-layer`` checked against the format and the target (the error names it);
    None (the default layer) and -1 (no warm start) pass where ``off_allowed``."""
    if off_allowed and (asked is None or asked == -1):
        return
    if head_format != "eagle3":  # EAGLE-1's layer reads one post-norm feature, no layer's input
        raise BanditSpecValidationError("warm_start_layer", "only the eagle3 head starts from a target layer")
    if asked is None or not 0 <= asked < num_layers:
        allowed = f"{'-1 or ' if off_allowed else ''}in [0, {num_layers - 1}]"
        raise BanditSpecValidationError("warm_start_layer", f"must be {allowed}, got {asked}")


def init_metadata(args: argparse.Namespace, head: EagleHead | Eagle3Head) -> dict[str, Any]:
    if not isinstance(head, Eagle3Head):
        return {}
    layer = warm_start_layer(args.warm_start_layer, head.config)
    return {"warm_start_layer": layer, **({"fc_noise": args.warm_start_fc_noise} if layer is not None else {})}


def warm_start(head: Eagle3Head, model: Any, layer_index: int, fc_noise: float) -> None:
    """Start ``head``'s midlayer as the target's decoder layer ``layer_index``: hidden_norm, the
    hidden half of q/k/v, o_proj, post_attention_layernorm and the MLP are copied; the embedding
    half of q/k/v keeps its init; input_layernorm copies layer 0's (the target's norm on its
    embeddings). fc starts as the identity on the highest captured layer's block, N(0, fc_noise)
    elsewhere, so that g starts as that layer's output (the residual stream layer
    ``layer_index`` reads when it is the next one)."""
    layers = model.model.layers
    check_warm_start(layer_index, "eagle3", len(layers), off_allowed=False)
    layer, m, h = layers[layer_index], head.midlayer, head.config.hidden_size
    with torch.no_grad():
        m.hidden_norm.weight.copy_(layer.input_layernorm.weight.float())
        m.input_layernorm.weight.copy_(layers[0].input_layernorm.weight.float())
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(m.self_attn, name).weight[:, h:].copy_(getattr(layer.self_attn, name).weight.float())
        m.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight.float())
        m.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight.float())
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(m.mlp, name).weight.copy_(getattr(layer.mlp, name).weight.float())
        blocks = head.config.feature_size // h
        fc = torch.randn(h, blocks * h) * fc_noise
        fc[:, (blocks - 1) * h:] += torch.eye(h)
        head.fc.weight.copy_(fc)


def run(args: argparse.Namespace) -> int:
    """Build the head; returns a process exit code."""
    from banditspec.engine.models import load_model

    from banditspec_train.eagle.plots import plot_losses

    keep_freed_memory()
    use_huge_pages()  # before the first large tensor (the model's weights)
    torch.set_num_threads(max(1, args.threads))
    began = time.time()
    progress = not args.no_progress
    out = args.out or (EAGLE3_WEIGHTS if args.format == "eagle3" else EAGLE1_WEIGHTS)
    model, tokenizer = load_model(args.model)
    check_warm_start(args.warm_start_layer, args.format, model.config.num_hidden_layers)  # before any data is made
    aux = default_aux_layers(model.config.num_hidden_layers) if args.format == "eagle3" else ()
    distill_spec = DistillSpec(chat_prompts=args.chat_prompts, code_prompts=args.code_prompts,
                               max_new_tokens=args.max_new_tokens, batch_size=args.distill_batch,
                               seed=args.seed, aux_layers=aux, loss_on=args.loss_on,
                               precision=args.distill_precision)
    text_spec = CorpusSpec(chat_tokens=args.text_chat_tokens, code_tokens=args.text_code_tokens,
                           seed=args.seed, aux_layers=aux)
    bf16 = native_bf16() if args.bf16 is None else bool(args.bf16)
    cfg = TrainConfig(epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr,
                      weight_decay=args.weight_decay, unroll_steps=args.unroll_steps, noise=args.noise,
                      cls_weight=args.cls_weight, label_temperature=args.label_temperature,
                      reach_weighting=args.reach_weighting, step_decay=args.step_decay,
                      seed=args.seed, bf16=bf16)
    distilled, more, text = training_parts(model, tokenizer, args.model, distill_spec, text_spec, progress,
                                           workers=args.distill_workers, parts=args.distill_parts)
    data_seconds = time.time() - began

    embedding = model.get_input_embeddings().weight.detach().float()
    train_only = [p for p in (more, text) if p is not None]  # later parts and fixed text: never validated on
    val_set, train_set = split_validation(distilled, concat(train_only) if train_only else None,
                                          args.val_fraction, args.seed)
    text_sequences = len(text) if text is not None else 0
    more_sequences = len(more) if more is not None else 0
    del distilled, more, text, train_only  # the split holds copies: ~2.7 GB a part less through training
    names, counts = np.unique(np.concatenate([train_set.kinds, val_set.kinds]), return_counts=True)
    kinds = {str(k): int(n) for k, n in zip(names, counts)}  # sorted by kind, as before

    head = _new_head(args, model, tokenizer, train_set, embedding)
    lm_rows = model.lm_head.weight.detach().float()[head.draft_vocab].contiguous()
    loss_fn = loss_function(head, embedding, lm_rows, cfg)
    limit = None if args.max_train_minutes is None else 60.0 * args.max_train_minutes
    result = train_head(head, loss_fn, train_set, val_set, cfg, progress, max_seconds=limit)

    def counted(s: FeatureSet) -> int:
        return int(np.sum(np.maximum(0, np.diff(s.offsets) - 1 - s.loss_from)))

    feature = (f"outputs of decoder layers {list(aux)} (before the final norm), concatenated" if aux
               else "post-norm last hidden state (LM-head input), as the reference engine returns")
    metadata = {
        "target": args.model,
        "feature": feature,
        "distill": asdict(distill_spec),
        "text": asdict(text_spec),
        "train": asdict(cfg),
        "init": init_metadata(args, head),
        "data": {"train_sequences": len(train_set), "train_pairs": counted(train_set),
                 "val_sequences": len(val_set), "val_pairs": counted(val_set),
                 "kinds": kinds,
                 "distill_parts": args.distill_parts,
                 "later_parts_sequences": more_sequences,
                 "fixed_text_sequences": text_sequences,
                 "draft_vocab_sample": args.vocab_sample},
        "metrics": {"val_loss_per_step": result.val_loss, "val_top1_per_step": result.val_top1,
                    "val_mean_accepted_tokens": result.val_mat,
                    "final_train_loss": round(float(np.mean(result.losses[-20:])), 4),
                    "optimizer_steps": result.steps,
                    "data_seconds": round(data_seconds, 1),
                    "train_seconds": round(result.seconds, 1),
                    "threads": args.threads},
    }
    if isinstance(head, Eagle3Head):
        save_head3(head, out, metadata)
    else:
        save_head(head, out, metadata)
    plot_losses(result.losses, args.plot, title=f"{args.format} head on {args.model}: training loss",
                **({"ylabel": "loss (soft CE, draft steps weighted)"} if isinstance(head, Eagle3Head) else {}))
    print(json.dumps(metadata["metrics"], indent=2))
    print(f"saved {out} and {args.plot}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
