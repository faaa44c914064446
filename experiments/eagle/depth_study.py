"""Is the one-layer EAGLE-3 head limited by its depth? The same head with extra decoder layers,
trained side by side with the one-layer head on the same data, steps and seed.

The twelfth session found that 68 % more data and optimizer steps left the head's held-out
top-1 agreement where it was (0.42 at the first draft step), and guessed that the one-layer
head is limited by what it can compute. This study tests that guess cheaply: it trains the
served architecture (``Eagle3Head``) and a deeper one (``DeeperHead``: the same midlayer,
then ``--extra-layers`` standard Llama decoder layers over the head's hidden state, their
output projections zero-initialised so that training starts from the one-layer head's
function) with the shipped recipe's objective (training-time test over ``--unroll-steps``
draft steps, the extra layers attending under the same unrolled mask), on the cached
self-distilled data of the v2 build (2200 chat + 240 code prompts, the loss on answers as in that build; built first when
missing), for ``--epochs`` each, and reports the held-out loss and top-1 agreement with
the target per draft step (the trained weights go to the cache folder,
``eagle3-depth-study/``). Nothing here is served: a deeper head would need the drafter's
step (and its native kernel) to run the extra layers.

    .venv/bin/python experiments/eagle/depth_study.py [--epochs 1] [--extra-layers 1]
        [--study-out docs/eagle/depth-study.json]   # --mat: replay the saved heads instead
    .venv/bin/python experiments/eagle/depth_study.py --mat --heads A.safetensors B.safetensors \
        --mat-skip 24 --mat-prompts 48 --mat-code 0 --mat-gammas 4 --mat-out F.json
        # the same replay of any heads save_head3 wrote (the build's, variant_study.py's two-layers)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import cast

import numpy as np
import torch
from banditspec.eagle.head import RMSNorm, apply_rope, extend_cache, load_weights, rope_cos_sin
from banditspec.eagle.head3 import _MLP, Eagle3Config, Eagle3Head
from banditspec.paths import REPO_ROOT, cache_dir
from banditspec_train.eagle import objective3
from banditspec_train.eagle.objective import unrolled_mask
from banditspec_train.eagle.train import TrainConfig, _new_head, add_arguments, loss_function, train_head
from torch import nn
from tqdm import tqdm


class _Layer(nn.Module):
    """A Llama decoder layer on the head's hidden size (pre-norm attention and MLP, residuals)."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        kv = c.num_kv_heads * c.head_dim
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(self.o_proj.weight)  # the layer starts as the identity (residuals only)
        nn.init.zeros_(self.mlp.down_proj.weight)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor, c: Eagle3Config):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, c.head_dim, c.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = x + self.o_proj(attn)
        return h + self.mlp(self.post_attention_layernorm(h))

    def copy_from(self, layer) -> None:
        """Start as a target decoder layer (HF Llama's parameter names; variant_study.py's
        warm-started second layer)."""
        with torch.no_grad():
            for norm in ("input_layernorm", "post_attention_layernorm"):
                getattr(self, norm).weight.copy_(getattr(layer, norm).weight.float())
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(self, name).weight.copy_(getattr(layer.self_attn, name).weight.float())
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(self.mlp, name).weight.copy_(getattr(layer.mlp, name).weight.float())


class DeeperHead(Eagle3Head):
    """Eagle3Head plus ``extra`` decoder layers after its midlayer (training only)."""

    def __init__(self, config: Eagle3Config, extra: int):
        super().__init__(config)
        self.extra = nn.ModuleList([_Layer(config) for _ in range(extra)])


_served_states = objective3.unrolled_states


def unrolled_states(head: Eagle3Head, embeddings: torch.Tensor, aux: torch.Tensor, steps: int,
                    dropout: float = 0.0) -> list[torch.Tensor]:
    """objective3.unrolled_states, with a DeeperHead's extra layers after the midlayer: each
    keeps its own keys per step under the same unrolled mask; the state fed back is the last layer's."""
    if not isinstance(head, DeeperHead):
        return _served_states(head, embeddings, aux, steps, dropout)
    if dropout:
        raise ValueError("dropout: not in the deeper head's states")
    n = aux.shape[1]
    positions = torch.arange(n)
    fused = head.project(aux)
    keys: list[list[torch.Tensor]] = [[] for _ in range(1 + len(head.extra))]
    values: list[list[torch.Tensor]] = [[] for _ in range(1 + len(head.extra))]
    states: list[torch.Tensor] = []
    for step in range(1, steps + 1):
        mask = unrolled_mask(n, step)
        hidden = fused if step == 1 else torch.cat([fused[:, :1], states[-1][:, :-1]], dim=1)
        q, k, v = head.qkv(embeddings, hidden, positions)
        keys[0].append(k)
        values[0].append(v)
        x = head.finish(hidden, head.attend(q, torch.cat(keys[0], dim=2), torch.cat(values[0], dim=2), mask))
        for depth, layer in enumerate(cast(list[_Layer], list(head.extra)), start=1):
            q, k, v = layer.qkv(x, positions, head.config)
            keys[depth].append(k)
            values[depth].append(v)
            x = layer.finish(x, head.attend(q, torch.cat(keys[depth], dim=2), torch.cat(values[depth], dim=2), mask))
        states.append(x)
    return states


def _step(head: Eagle3Head, embeddings: torch.Tensor, hidden: torch.Tensor,
          caches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """T pairs appended to every layer's cache (positions = cache length onwards): states [1, T, H]."""
    past, t = caches[0][0].shape[2], hidden.shape[1]
    positions = torch.arange(past, past + t)
    x, k, v = head.step(embeddings, hidden, *caches[0])  # the served layer's own incremental step
    grown = [(k, v)]
    for depth, layer in enumerate(cast(list[_Layer], list(getattr(head, "extra", []))), start=1):
        q, k, v = layer.qkv(x, positions, head.config)
        k, v, mask = extend_cache(*caches[depth], k, v)
        grown.append((k, v))
        x = layer.finish(x, head.attend(q, k, v, mask))
    return x, grown


def load_study_head(path: Path) -> Eagle3Head:
    """A head from ``save_head3``'s files, with the extra layers its weights hold (``extra.N.*``,
    variant_study.py's two-layers), in eval mode."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        keys = f.keys()  # safe_open is not iterable
        extra = len({key.split(".")[1] for key in keys if key.startswith("extra.")})
    return load_weights(path, lambda config: DeeperHead(Eagle3Config(**config), extra) if extra
                        else Eagle3Head(Eagle3Config(**config)), torch.float32)


@torch.inference_mode()
def replay_chain(head: Eagle3Head, embedding: torch.Tensor, total: list[int], prompt_len: int, aux: torch.Tensor,
                 gamma: int, window: int = 64) -> list[int]:
    """Accepted lengths of chain drafting (gamma tokens, no cut-off, fp32) replayed over a known
    greedy continuation, as bench_eagle.py replays the served drafter (its prompt window too)."""
    layers = 1 + len(getattr(head, "extra", []))
    caches = [head.empty_cache() for _ in range(layers)]
    fused = head.project(aux)  # [T, H]
    committed = max(0, prompt_len - window)  # next real pair to feed
    position = prompt_len + 1  # the first generated token is the prefill's
    state = torch.zeros(0)
    accepted: list[int] = []
    while position < len(total):
        if position - 1 > committed:  # real pairs committed .. position - 2
            ids = torch.tensor(total[committed + 1: position])
            states, caches = _step(head, embedding[ids].unsqueeze(0), fused[committed: position - 1].unsqueeze(0), caches)
            state, committed = states[:, -1:], position - 1
        real, drafted, current = caches, [], state
        limit = min(gamma, len(total) - position)
        for j in range(limit):
            token = int(head.draft_vocab[int(head.logits(current).reshape(-1).argmax())])
            drafted.append(token)
            if j + 1 < limit:
                current, real = _step(head, embedding[token].view(1, 1, -1), current, real)
        length = 0
        while length < len(drafted) and drafted[length] == total[position + length]:
            length += 1
        accepted.append(length)
        position += length + 1
    return accepted


def mat_study(args: argparse.Namespace) -> int:
    """Mean accepted tokens (chain, gamma 1..8) of the heads the training run saved, on the
    held-out prompts bench_eagle.py uses."""
    from banditspec.drafters.eagle import EAGLE3_WEIGHTS, load_default_eagle_drafter
    from banditspec.engine.models import load_model
    from banditspec.text import prompt_ids
    from banditspec_train.eagle.evaluate import greedy_speculative, target_features

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_eagle import chat_prompts, code_prompts

    torch.set_num_threads(max(1, args.threads))
    model, tokenizer = load_model(args.model)
    served = load_default_eagle_drafter(model, EAGLE3_WEIGHTS)  # its feature layers; plain decoding
    embedding = model.get_input_embeddings().weight.detach().float()
    heads: dict[str, Eagle3Head] = {Path(path).stem: load_study_head(Path(path)) for path in args.heads or []}
    for path in [] if args.heads else sorted((cache_dir() / "eagle3-depth-study").glob("*-layers.pt")):
        saved = torch.load(path)  # this study's own training runs
        config = Eagle3Config(**saved["config"])
        head = DeeperHead(config, saved["extra_layers"]) if saved["extra_layers"] else Eagle3Head(config)
        head.load_state_dict(saved["state"])
        heads[path.stem] = head.eval()
    gammas = tuple(args.mat_gammas)
    report: dict = {"gammas": list(gammas), "max_new_tokens": 96, "skip": args.mat_skip,
                    "heads": {name: str(path) for name, path in zip(heads, args.heads or [])}, "workloads": {}}
    n = args.mat_prompts
    for workload, prompts in (("chat", chat_prompts(n, args.mat_skip)), ("code", code_prompts(args.mat_code, args.mat_skip))):
        if not prompts:
            continue
        accepted: dict[str, dict[int, list[int]]] = {name: {g: [] for g in gammas} for name in heads}
        for text in tqdm(prompts, desc=workload, unit="prompt"):
            ids = prompt_ids(tokenizer, text, chat=True)
            plain = greedy_speculative(model, served, ids, 0, 96, tokenizer.eos_token_id).output_ids
            aux = torch.from_numpy(target_features(model, ids + plain, served))
            for name, head in heads.items():
                for g in gammas:
                    accepted[name][g] += replay_chain(head, embedding, list(ids) + list(plain), len(ids), aux, g)
        report["workloads"][workload] = {name: {g: round(float(np.mean(a[g])) + 1, 3) for g in gammas}
                                         for name, a in accepted.items()}
        print(workload, json.dumps(report["workloads"][workload]), flush=True)
    out = args.mat_out or args.study_out.with_name(args.study_out.stem + "-mat.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--extra-layers", type=int, default=1)
    parser.add_argument("--study-out", type=Path, default=REPO_ROOT / "docs" / "eagle" / "depth-study.json")
    parser.add_argument("--mat", action="store_true",
                        help="instead of training: mean accepted tokens of the heads a training run saved")
    parser.add_argument("--heads", type=Path, nargs="+",
                        help="--mat: these heads (save_head3 files: the build's, variant_study.py's) instead")
    parser.add_argument("--mat-prompts", type=int, default=12, help="--mat: chat prompts")
    parser.add_argument("--mat-code", type=int, default=12, help="--mat: HumanEval prompts")
    parser.add_argument("--mat-skip", type=int, default=0, help="--mat: after this many of each workload")
    parser.add_argument("--mat-gammas", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--mat-out", type=Path, help="--mat: the report (default: beside --study-out)")
    parser.set_defaults(chat_prompts=2200, code_prompts=240, epochs=1, loss_on="answers")  # the v2 build's cached data
    args = parser.parse_args()
    if args.mat:
        return mat_study(args)

    from banditspec.eagle.head3 import default_aux_layers
    from banditspec.engine.models import load_model
    from banditspec_train.eagle.corpus import CorpusSpec
    from banditspec_train.eagle.dataset import training_data
    from banditspec_train.eagle.selfdistill import DistillSpec

    objective3.unrolled_states = unrolled_states  # unrolled_loss3 looks it up at call time
    torch.set_num_threads(max(1, args.threads))
    model, tokenizer = load_model(args.model)
    aux = default_aux_layers(model.config.num_hidden_layers)
    distill = DistillSpec(chat_prompts=args.chat_prompts, code_prompts=args.code_prompts,
                          max_new_tokens=args.max_new_tokens, batch_size=args.distill_batch, seed=args.seed,
                          aux_layers=aux, loss_on=args.loss_on)
    text = CorpusSpec(chat_tokens=0, code_tokens=0, seed=args.seed)
    cfg = TrainConfig(epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr, unroll_steps=args.unroll_steps,
                      seed=args.seed)
    fs = training_data(model, tokenizer, args.model, distill, text, not args.no_progress, workers=args.distill_workers,
                       parts=args.distill_parts)  # its own split below draws validation from every part
    embedding = model.get_input_embeddings().weight.detach().float()
    order = np.random.default_rng(args.seed).permutation(len(fs))
    n_val = int(round(len(fs) * args.val_fraction))
    val_set, train_set = fs.subset(sorted(order[:n_val])), fs.subset(sorted(order[n_val:]))
    args.format = "eagle3"
    report: dict = {"data": {"chat_prompts": args.chat_prompts, "code_prompts": args.code_prompts,
                             "train_sequences": len(train_set), "val_sequences": len(val_set)},
                    "train": cfg.__dict__, "threads": args.threads, "heads": {}}
    for extra in (0, args.extra_layers):
        base = _new_head(args, model, tokenizer, train_set, embedding)  # seeded: the same start for both
        assert isinstance(base, Eagle3Head)
        head: Eagle3Head = base
        if extra:
            torch.manual_seed(args.seed + 1)
            head = DeeperHead(base.config, extra)
            missing, unexpected = head.load_state_dict(base.state_dict(), strict=False)
            assert not unexpected and all(name.startswith("extra.") for name in missing)
        lm_rows = model.lm_head.weight.detach().float()[head.draft_vocab].contiguous()
        began = time.time()
        result = train_head(head, loss_function(head, embedding, lm_rows, cfg), train_set, val_set, cfg,
                            not args.no_progress)
        name = f"{1 + extra} layer" + ("s" if extra else "")
        report["heads"][name] = {"parameters": sum(p.numel() for p in head.parameters()),
                                 "optimizer_steps": result.steps, "train_seconds": round(time.time() - began, 1),
                                 "final_train_loss": round(float(np.mean(result.losses[-20:])), 4),
                                 "val_loss_per_step": result.val_loss, "val_top1_per_step": result.val_top1}
        print(name, json.dumps(report["heads"][name]), flush=True)
        saved = cache_dir() / "eagle3-depth-study" / f"{1 + extra}-layers.pt"  # for a later drafting study
        saved.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"extra_layers": extra, "config": base.config.__dict__, "state": head.state_dict()}, saved)
    args.study_out.parent.mkdir(parents=True, exist_ok=True)
    args.study_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
