"""Training variants of the EAGLE-3 head that the build does not offer as options, each trained
with the shipped recipe otherwise (every ``banditspec build eagle`` option applies), so that the
comparisons in docs/benchmarks/history.md can be rerun:

- ``dropout``: dropout ``--dropout`` (0.1) on the fused features g = fc(a) and on both residual
  branches of the midlayer while training; evaluation and serving see the unchanged head.
- ``mlp-width``: the midlayer's MLP ``--intermediate-size`` wide (3072 against the target's
  1536); the native drafting step takes the width as a parameter.
- ``last-state``: the target's post-norm last hidden state (already in every cached feature
  row, the teacher's input) as a 4th fused feature, fc 2304 -> 576. A study only: serving would
  need the target to return that state with the layers.
- ``frozen-output``: the head's LM head and final norm stay at their initial values, the
  target's rows of the draft vocabulary and its final norm (4.7 M fewer trained parameters).
- ``two-layers``: ``depth_study.py``'s second decoder layer (the target's own form: q/k/v
  read the state alone, keys per unrolled step) after the head's layer; the head's state s is
  its output. With the warm start it starts as the target layer after the head's (28 for
  SmolLM2), without it as the identity. A study only: the served drafter, its native step and
  upstream's EAGLE-3 layout have one layer; ``depth_study.py --mat --heads`` replays it.

A warm start from a target layer is a build option instead, and the default:
``--warm-start-layer``. The dropout, MLP-width and last-state runs started from a random init,
so add ``--warm-start-layer -1`` to rerun them as they ran.

Each run writes the head and its JSON where ``--out`` says (by default
``.cache/banditspec/variants/VARIANT.safetensors``, never the shipped file) and prints the metrics; compare with ``bench_eagle.py --weights``.

    .venv/bin/python experiments/eagle/variant_study.py --variant dropout --warm-start-layer -1 \\
        --out .cache/banditspec/variants/dropout.safetensors --plot .cache/banditspec/variants/dropout.png
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import sys
from pathlib import Path

import torch
from banditspec.eagle import head3
from banditspec.eagle.head3 import Eagle3Head
from banditspec.paths import cache_dir
from banditspec_train.eagle import objective3, train

served_states = objective3.unrolled_states  # before any variant patches it
VARIANTS = ("dropout", "mlp-width", "last-state", "frozen-output", "two-layers")


def dropout_states(p: float):
    """objective3.unrolled_states with dropout ``p`` where the head is training."""
    return functools.partial(served_states, dropout=p)


def last_state_loss():
    """unrolled_loss3 reading the whole feature row [a_i ; f_i] as the head's input (4 blocks)."""
    served = objective3.unrolled_loss3

    def unrolled_loss3(head: Eagle3Head, embedding: torch.Tensor, lm_rows: torch.Tensor, batch, steps: int,
                       *args, **kwargs):
        # the served objective slices a_i = features[..., :-H]; hand it rows with a dummy last block
        # so that its slice is the whole row and its teacher (the last H columns) is f_i still
        hidden = head.config.hidden_size
        widened = torch.cat([batch.features, batch.features[..., -hidden:]], dim=-1)
        return served(head, embedding, lm_rows, dataclasses.replace(batch, features=widened), steps, *args, **kwargs)

    return unrolled_loss3


def deeper_head(head: Eagle3Head, target_model, warm_start_layer: int | None):
    """``head`` with depth_study's second decoder layer after its midlayer: started as the target
    layer after ``warm_start_layer`` (when there is one), else as the identity (depth_study's
    zero output projections)."""
    depth_study = _depth_study()
    deeper = depth_study.DeeperHead(head.config, 1)
    missing, unexpected = deeper.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("extra.") for name in missing)
    layers = target_model.model.layers
    if warm_start_layer is not None and warm_start_layer + 1 < len(layers):
        deeper.extra[0].copy_from(layers[warm_start_layer + 1])
    return deeper


def _depth_study():
    """experiments/eagle/depth_study.py, imported from this folder."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import depth_study

    return depth_study


def install_two_layers(served_new_head) -> None:
    objective3.unrolled_states = _depth_study().unrolled_states  # unrolled_loss3 looks it up at call time

    def new_head(run_args, model, tokenizer, train_set, embedding):
        head = served_new_head(run_args, model, tokenizer, train_set, embedding)
        return deeper_head(head, model, train.warm_start_layer(run_args.warm_start_layer, head.config))

    train._new_head = new_head  # type: ignore[assignment]


def install(args: argparse.Namespace) -> None:
    """Patch the trainer for ``args.variant`` (before train.run builds the head)."""
    variant = args.variant
    if variant == "two-layers":
        install_two_layers(train._new_head)
        return
    if variant == "dropout":
        objective3.unrolled_states = dropout_states(args.dropout)  # unrolled_loss3 looks it up at call time
        return
    if variant in ("mlp-width", "last-state"):
        served_for_target = head3.Eagle3Config.for_target.__func__  # type: ignore[attr-defined]

        def for_target(cls, target_config, draft_vocab_size, aux_layers=None):
            config = served_for_target(cls, target_config, draft_vocab_size, aux_layers)
            if variant == "mlp-width":
                return dataclasses.replace(config, intermediate_size=args.intermediate_size)
            # a 4th block: the index only sizes fc (the block is the post-norm last state, not a layer)
            return dataclasses.replace(config, aux_layers=(*config.aux_layers, config.target_num_layers - 2))

        train.Eagle3Config.for_target = classmethod(for_target)  # type: ignore[method-assign, assignment]
        if variant == "last-state":
            train.unrolled_loss3 = last_state_loss()  # type: ignore[assignment]
        return
    served_new_head = train._new_head

    def new_head(run_args, model, tokenizer, train_set, embedding):
        head = served_new_head(run_args, model, tokenizer, train_set, embedding)
        head.lm_head.weight.requires_grad_(False)  # frozen-output
        head.norm.weight.requires_grad_(False)
        return head

    train._new_head = new_head  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_arguments(parser)
    parser.add_argument("--variant", required=True, choices=VARIANTS)
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout: its probability")
    parser.add_argument("--intermediate-size", type=int, default=3072, help="mlp-width: the MLP's width")
    args = parser.parse_args(argv)
    if args.format != "eagle3":
        parser.error("--format: the variants are of the EAGLE-3 head")
    if args.variant == "mlp-width" and args.warm_start_layer != -1:
        parser.error("--warm-start-layer: a wider MLP cannot start as the target's; add --warm-start-layer -1")
    folder = cache_dir() / "variants"
    if args.out is None:  # never the shipped file
        args.out = folder / f"{args.variant}.safetensors"
    if args.plot == train.DEFAULT_PLOT:  # nor the shipped loss curve
        args.plot = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO)
    print(f"variant {args.variant}", flush=True)
    install(args)  # without this every variant would run the build's own recipe
    return train.run(args)


if __name__ == "__main__":
    sys.exit(main())
