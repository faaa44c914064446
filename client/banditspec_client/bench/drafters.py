"""Proposal-cost micro-benchmark of the non-parametric drafters (no model, no server).

For each drafter, workload and context length C: a session starts on the first C tokens of
a real tokenized text, then for ``--steps`` steps proposes ``--max-len`` tokens, compares
them with the true continuation (accepted = longest matching prefix) and observes the
accepted tokens + one, like a greedy verifier would. Reported per step: mean and p99 of
propose + observe time, mean draft length and mean accepted tokens (+1 = tokens per step).

Workloads: ``code`` = HumanEval problems (prompt + canonical solution) one after another
(cycled); ``chat`` = ShareGPT eval conversations (all turns) one after another. The suffix
drafter's global tree first learns a different stretch of the same workload (the tokens
after the measured range), as past outputs. REST uses the configured datastore
(``--rest-datastore``), default: the default datastore (built once).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from banditspec_client.bench.report import text_header, text_row

if TYPE_CHECKING:
    from banditspec.drafters.base import Drafter

WORKLOADS = ("code", "chat")
COLUMNS = ("drafter", "workload", "context", "start ms", "mean us", "p99 us", "draft", "accepted")
WIDTHS = ("<8", "<8", ">7", ">9.1f", ">9.1f", ">9.1f", ">6.2f", ">8.2f")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafters", default="pld,suffix,rest,copy", help="comma-separated drafter names")
    parser.add_argument("--contexts", default="512,2048,4096", help="comma-separated context lengths")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="code and/or chat")
    parser.add_argument("--steps", type=int, default=200, help="measured steps per configuration")
    parser.add_argument("--max-len", type=int, default=8, help="tokens asked per proposal")
    parser.add_argument("--rest-datastore", type=Path, default=None, help="REST datastore folder (default: built once)")


def _workload_text(name: str) -> str:
    from banditspec.datasets import humaneval_problems, sharegpt_split

    if name == "code":
        return "\n\n".join(p["prompt"] + p["canonical_solution"] for p in humaneval_problems())
    if name == "chat":
        return "\n\n".join(text for conv in sharegpt_split("eval")[:200] for _, text in conv)
    raise ValueError(f"unknown workload {name!r}; expected one of {WORKLOADS}")


def _tokens(tokenizer: Any, name: str, needed: int) -> list[int]:
    ids = tokenizer(_workload_text(name), add_special_tokens=False)["input_ids"]
    while len(ids) < needed:
        ids = ids + ids
    return ids[:needed]


def _measure(drafter: Drafter, tokens: list[int], context: int, steps: int, max_len: int) -> dict[str, float]:
    t0 = time.perf_counter()
    session = drafter.start(tokens[:context])
    start_s = time.perf_counter() - t0
    pos = context
    step_s, drafted, accepted = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        draft = session.propose(max_len).token_ids.tolist()
        truth = tokens[pos : pos + len(draft) + 1]
        n_ok = 0
        while n_ok < len(draft) and draft[n_ok] == truth[n_ok]:
            n_ok += 1
        session.observe(truth[: n_ok + 1])
        step_s.append(time.perf_counter() - t0)
        pos += n_ok + 1
        drafted.append(len(draft))
        accepted.append(n_ok)
    session.close(finished=False)
    us = np.asarray(step_s) * 1e6
    return {
        "start_ms": start_s * 1e3,
        "mean_us": float(us.mean()),
        "p99_us": float(np.percentile(us, 99)),
        "draft_len": float(np.mean(drafted)),
        "accepted": float(np.mean(accepted)),
    }


def run(args: argparse.Namespace) -> int:
    from banditspec.drafters.registry import make_drafter
    from banditspec.engine.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    drafter_names = [n for n in args.drafters.split(",") if n]
    contexts = [int(c) for c in args.contexts.split(",") if c]
    workloads = [w for w in args.workloads.split(",") if w]
    span = max(contexts) + args.steps * (args.max_len + 1)
    past = 4096  # tokens the suffix drafter's global tree learns first
    print(text_header(COLUMNS, WIDTHS))
    for workload in workloads:
        tokens = _tokens(tokenizer, workload, span + past)
        for name in drafter_names:
            drafter = make_drafter(name, tokenizer=tokenizer, rest_datastore=args.rest_datastore)
            if name == "suffix":
                from banditspec.drafters.suffix_tree import SuffixTreeDrafter

                assert isinstance(drafter, SuffixTreeDrafter)
                drafter.add_output(tokens[span:])
            for context in contexts:
                r = _measure(drafter, tokens, context, args.steps, args.max_len)
                cells = [name, workload, context, r["start_ms"], r["mean_us"], r["p99_us"], r["draft_len"], r["accepted"]]
                print(text_row(cells, WIDTHS), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
