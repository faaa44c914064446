"""``banditspec bench-overhead``: the per-token cost of serving through Triton.

For the same prompts and policy, runs the in-process library and the real server
alternately (in-process first on even prompts, Triton first on odd ones), so that machine
drift hits both alike, and reports tokens/s of each and their ratio. Both paths must
generate the same number of tokens (checked; text identity is tested by the integration tests)."""

from __future__ import annotations

import argparse
import statistics
import sys

from banditspec_client.bench.methods import parse_methods
from banditspec_client.bench.report import text_header, text_row
from banditspec_client.bench.runner import RunSettings
from banditspec_client.bench.splits import SPLITS, describe
from banditspec_client.bench.workloads import load_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--methods", default="vanilla,ucbspec", help="compared methods (bench syntax)")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both paths")
    parser.add_argument("--split", default="heldout", choices=SPLITS,
                        help="content-disjoint split of the prompts (banditspec_client/bench/splits.json)")


def run(args: argparse.Namespace) -> int:
    import torch

    from banditspec_client.bench.in_process import InProcessRunner
    from banditspec_client.bench.through_triton import TritonRunner

    torch.set_num_threads(args.threads)
    methods = parse_methods(args.methods)
    prompts = load_workload(args.workload, args.prompts, split=args.split)
    print(f"{args.workload}, {len(prompts)} prompts, split {describe(args.split)}")
    settings = RunSettings(model=args.model, threads=args.threads)
    local = InProcessRunner(settings)
    rates: dict[str, dict[str, list[float]]] = {m.name: {"in-process": [], "triton": []} for m in methods}
    same = True
    with TritonRunner(settings, methods) as remote:
        for i, prompt in enumerate(prompts):
            for method in methods:
                runners = (local, remote) if i % 2 == 0 else (remote, local)
                records = {r.label: r.run(prompt, method, args.max_tokens) for r in runners}
                for label, record in records.items():
                    rates[method.name][label].append(record.tokens_per_second)
                same &= records["in-process"].generated_tokens == records["triton"].generated_tokens
    local.close()
    widths = ("<12", ">17.2f", ">13.2f", ">20.3f")
    print(text_header(("method", "in-process tok/s", "Triton tok/s", "Triton / in-process"), widths))
    for name, by in rates.items():
        a, b = statistics.mean(by["in-process"]), statistics.mean(by["triton"])
        print(text_row((name, a, b, b / a), widths))
    print("same token counts on both paths" if same else "TOKEN COUNTS DIFFER between the paths", file=sys.stderr)
    return 0 if same else 1
