"""``banditspec bench``: every method side by side on named workloads (paper Table 1 / Figure 3).

For each prompt every method runs once, in an order rotated by the prompt's index, so that
machine drift (other load on a shared CPU) hits all methods alike. Writes to ``--out``:
``results.json`` (setup, per-run records, summaries), ``results.md`` (tables, targets,
per-prompt oracle) and PNG plots (see :mod:`banditspec_client.bench.compare.plots`).

In process (default): the torch reference engine in this process; through Triton
(``--through-triton``): a real tritonserver started for the run, requests over gRPC.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from banditspec.config import DEFAULT_MAX_DRAFT_LEN
from banditspec.engine import panel_kernel
from banditspec.errors import BanditSpecValidationError
from banditspec_client.bench.compare.summary import markdown_report, summarize, summary_dict
from banditspec_client.bench.methods import DEFAULT_METHODS, FIXED_DRAFTERS, Method, RunRecord, parse_methods
from banditspec_client.bench.runner import Runner, RunSettings, run_interleaved
from banditspec_client.bench.workloads import Prompt, load_workload, parse_workloads

QUICK = {"workload": "mixed", "prompts": 3, "max_tokens": 48}
FULL = {"workload": "all", "prompts": 4, "max_tokens": 96}
WARMUP_PROMPT = Prompt("warm-up", "chat", "warm-up", "Name three colours.")


def cpu_description() -> str:
    """The CPU's model name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC, family 26";
    results from different CPUs are not comparable, and a VM's model name can be vague."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family") and key not in fields:
                    fields[key] = value.strip()
                if len(fields) == 2:
                    break
    except OSError:
        return platform.processor() or "unknown"
    name = fields.get("model name") or platform.processor() or "unknown"
    return f"{name}, family {fields['cpu family']}" if "cpu family" in fields else name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default=None, help="code, code-edit, chat, mixed, comma-separated, or all "
                        f"(default {FULL['workload']}; --quick: {QUICK['workload']})")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated: vanilla, pld, suffix, rest, "
                        "eagle (optionally @GAMMA), ucbspec, exp3spec (optionally :accepted|:throughput)")
    parser.add_argument("--prompts", type=int, default=None, help=f"prompts per workload (default {FULL['prompts']})")
    parser.add_argument("--prompts-file", type=Path, default=None,
                        help='your own traffic: JSONL of {"kind", "prompt"} lines (each kind is a workload)')
    parser.add_argument("--max-tokens", type=int, default=None, help=f"tokens per request (default {FULL['max_tokens']})")
    parser.add_argument("--drafters", default=",".join(FIXED_DRAFTERS),
                        help="drafters the adaptive methods choose among (those the stack can serve)")
    parser.add_argument("--max-draft-len", type=int, default=DEFAULT_MAX_DRAFT_LEN, help="L: fixed arms draft L tokens; adaptive arms too")
    parser.add_argument("--reward", default="accepted", choices=["accepted", "throughput", "both"],
                        help="reward of the adaptive methods; both = run each adaptive method with each reward")
    parser.add_argument("--through-triton", action="store_true", help="start tritonserver, send requests over gRPC")
    parser.add_argument("--quick", action="store_true",
                        help=f"small preset: {QUICK['prompts']} {QUICK['workload']} prompts, {QUICK['max_tokens']} tokens")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"], help="target model")
    parser.add_argument("--seed", type=int, default=0, help="prompt order and policy seed")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (in process, or the Triton target's torch_threads); more than the idle "
                             "cores makes torch's thread pool spin against other load (10x slower seen on 2 busy cores)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default .cache/banditspec/bench/<time>)")
    parser.add_argument("--plot-prompts", type=int, default=3, help="prompts shown in the arm-per-step plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="measure nothing: rewrite results.md and the plots from an earlier results.json")


def resolve(args: argparse.Namespace) -> tuple[list[str], int, int]:
    """(workloads, prompts per workload, max tokens) from the options and the preset."""
    preset = QUICK if args.quick else FULL
    workloads = parse_workloads(args.workload or preset["workload"])
    prompts = args.prompts if args.prompts is not None else preset["prompts"]
    max_tokens = args.max_tokens if args.max_tokens is not None else preset["max_tokens"]
    return workloads, prompts, max_tokens


def _progress(total: int, disabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="bench", disable=disabled, file=sys.stderr, dynamic_ncols=True)


def needed_drafters(methods: list[Method], adaptive_drafters: list[str]) -> list[str]:
    """Drafters to build: each fixed arm's, plus the adaptive arm set when a method is adaptive."""
    names = [m.drafter for m in methods if m.fixed_arm]
    if any(m.adaptive for m in methods):
        names += adaptive_drafters
    return [d for d in FIXED_DRAFTERS if d in names]


def _make_runner(args: argparse.Namespace, methods: list[Method], out: Path) -> Runner:
    adaptive_drafters = tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    unknown = sorted(set(adaptive_drafters) - set(FIXED_DRAFTERS))
    if unknown:
        raise BanditSpecValidationError("drafters", f"unknown drafter(s) {unknown}; choose from {FIXED_DRAFTERS}")
    settings = RunSettings(model=args.model, max_draft_len=args.max_draft_len, seed=args.seed, threads=args.threads,
                           adaptive_drafters=adaptive_drafters)
    if args.through_triton:
        from banditspec_client.bench.through_triton import TritonRunner

        return TritonRunner(settings, methods, log_path=out / "tritonserver.log").__enter__()
    from banditspec_client.bench.in_process import InProcessRunner

    return InProcessRunner(settings, drafters=needed_drafters(methods, list(adaptive_drafters)))


def command_line(argv: list[str]) -> str:
    """How this run was started, as a shell command (``banditspec bench ...`` when via the CLI)."""
    program = "banditspec" if Path(argv[0]).name == "banditspec" else Path(argv[0]).name
    return " ".join([program, *(shlex.quote(a) for a in argv[1:])])


def measure(runner: Runner, methods: list[Method], prompt_lists: dict[str, list[Prompt]], max_tokens: int,
            quiet: bool) -> tuple[list[Method], dict[str, str], list[RunRecord]]:
    """(methods run, {skipped method: reason}, records): a warm-up per method, then every
    workload's prompts with all methods interleaved."""
    usable, skipped = runner.available(methods)
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}", file=sys.stderr)
    for method in usable:  # warm-up: first calls, caches, private drafters; not measured
        runner.run(WARMUP_PROMPT, method, 8)
    records: list[RunRecord] = []
    with _progress(sum(len(p) for p in prompt_lists.values()) * len(usable), quiet) as progress:
        for prompts in prompt_lists.values():
            records += run_interleaved(runner, prompts, usable, max_tokens, progress)
    return usable, skipped, records


def write_results(out: Path, *, command: str, setup: dict, usable: list[Method], skipped: dict[str, str],
                  records: list[RunRecord], plot_prompts: int) -> list[Path]:
    """results.md, results.json and the PNG plots into ``out``; returns their paths."""
    from banditspec_client.bench.compare.plots import write_plots

    names = [m.name for m in usable]
    summaries = summarize(records, names)
    cpu_summaries = summarize(records, names, clock="cpu") if all(r.cpu_seconds for r in records) else None
    decode_summaries = summarize(records, names, clock="decode") if all(r.step_ms for r in records) else None
    title = f"BanditSpec benchmark ({setup['mode']}, {setup['model']})"
    report = markdown_report(summaries, title=title, command=command, setup=setup, skipped=skipped,
                             records=records, cpu_summaries=cpu_summaries, decode_summaries=decode_summaries)
    (out / "results.md").write_text(report)
    payload = {"command": command, "setup": setup, "methods": [asdict(m) for m in usable], "skipped": skipped,
               "summaries": [summary_dict(s) for s in summaries],
               "cpu_summaries": [summary_dict(s) for s in cpu_summaries or ()],
               "decode_summaries": [summary_dict(s) for s in decode_summaries or ()],
               "records": [asdict(r) for r in records]}
    (out / "results.json").write_text(json.dumps(payload, separators=(",", ":")))
    plots = write_plots(summaries, records, out, prompts_shown=plot_prompts, cpu_summaries=cpu_summaries)
    return [out / "results.md", out / "results.json", *plots]


def rewrite_from_json(path: Path, out: Path | None, plot_prompts: int) -> list[Path]:
    """Report and plots again from a results.json (same measurements, current report code)."""
    payload = json.loads(path.read_text())
    out = out or path.parent
    out.mkdir(parents=True, exist_ok=True)
    return write_results(out, command=payload["command"], setup=payload["setup"],
                         usable=[Method(**m) for m in payload["methods"]], skipped=payload["skipped"],
                         records=[RunRecord(**r) for r in payload["records"]], plot_prompts=plot_prompts)


def run(args: argparse.Namespace) -> int:
    if args.from_json is not None:
        paths = rewrite_from_json(args.from_json, args.out, args.plot_prompts)
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
        return 0
    import torch

    torch.set_num_threads(max(1, args.threads))
    workloads, n_prompts, max_tokens = resolve(args)
    methods = parse_methods(args.methods, args.reward)
    out = args.out or _default_out()
    out.mkdir(parents=True, exist_ok=True)
    if args.prompts_file is not None:
        from banditspec_client.bench.workloads import load_prompts_file

        prompt_lists: dict = {}
        for prompt in load_prompts_file(args.prompts_file):
            prompt_lists.setdefault(prompt.workload, []).append(prompt)
    else:
        prompt_lists = {w: load_workload(w, n_prompts, seed=args.seed) for w in workloads}
    started = time.time()
    runner = _make_runner(args, methods, out)
    try:
        usable, skipped, records = measure(runner, methods, prompt_lists, max_tokens, args.no_progress)
    finally:
        runner.close()
    setup = {
        "mode": runner.label,
        "model": args.model,
        "workloads": ", ".join(f"{w} ({len(p)} prompts)" for w, p in prompt_lists.items()),
        "max_tokens": max_tokens,
        "max_draft_len (L)": args.max_draft_len,
        "reward": args.reward,
        "adaptive arm set": ", ".join(f"{d}@{args.max_draft_len}" for d in runner.adaptive_arms),
        "seed": args.seed,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"torch {torch.__version__}",
        "cpu": cpu_description(),
        # this process's choice; Triton's model processes on the machine choose alike
        # (unless BANDITSPEC_PANEL_ISA differs there)
        "panel kernel": panel_kernel.describe(),
        "wall time": f"{(time.time() - started) / 60:.1f} min",
    }
    paths = write_results(out, command=command_line(sys.argv), setup=setup, usable=usable, skipped=skipped,
                          records=records, plot_prompts=args.plot_prompts)
    print(paths[0].read_text())
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def _default_out() -> Path:
    from banditspec.paths import cache_dir

    return cache_dir() / "bench" / time.strftime("%Y%m%d-%H%M%S")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
