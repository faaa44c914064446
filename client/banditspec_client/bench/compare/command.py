"""``banditspec bench``: every method side by side on named workloads (paper Table 1 / Figure 3).

For each prompt every method runs once, in an order rotated by the prompt's index, so that
machine drift (other load on a shared CPU) hits all methods alike. Writes to ``--out``:
``results.json`` (setup, per-run records, summaries), ``results.md`` (tables, targets,
per-prompt oracle) and PNG plots (see :mod:`banditspec_client.bench.compare.plots`).

In process (default): the torch reference engine in this process; through Triton
(``--through-triton``): a real tritonserver started for the run, requests over gRPC.
``--workload multiturn``: conversations through the OpenAI chat API of a real tritonserver
(:mod:`~banditspec_client.bench.multiturn`), per turn index.

Prompts come from one split (``--split tune|heldout``, content-disjoint, recorded in
``banditspec_client/bench/splits.json``); ``--temperature`` > 0 samples. Every adaptive method's
drafters also run as fixed arms, so "best fixed arm" covers every arm the adaptive methods may use.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypedDict

from banditspec.config import DEFAULT_MAX_DRAFT_LEN
from banditspec.engine import panel_kernel
from banditspec.errors import BanditSpecValidationError

from banditspec_client.bench.compare.summary import markdown_report, summarize, summary_dict
from banditspec_client.bench.methods import DEFAULT_METHODS, FIXED_DRAFTERS, VANILLA, Method, RunRecord, parse_methods
from banditspec_client.bench.runner import Runner, RunSettings, run_interleaved
from banditspec_client.bench.splits import SPLITS, describe
from banditspec_client.bench.workloads import MULTITURN, MULTITURN_TURNS, Prompt, load_workload, parse_workloads


class Preset(TypedDict):
    workload: str
    prompts: int
    max_tokens: int


QUICK: Preset = {"workload": "mixed", "prompts": 3, "max_tokens": 48}
MULTITURN_METHODS = f"{VANILLA},costaware"  # plain decoding vs the default
FULL: Preset = {"workload": "all", "prompts": 4, "max_tokens": 96}
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
                        f"(default {FULL['workload']}; --quick: {QUICK['workload']}); or {MULTITURN} alone: "
                        "conversations through the OpenAI chat API")
    parser.add_argument("--methods", default=None, help="comma-separated: vanilla, pld, suffix, rest, "
                        "eagle (optionally @GAMMA), ucbspec, exp3spec (optionally :accepted|:throughput) "
                        f"(default {DEFAULT_METHODS}; {MULTITURN}: {MULTITURN_METHODS})")
    parser.add_argument("--prompts", type=int, default=None,
                        help=f"prompts per workload, or conversations for {MULTITURN} (default {FULL['prompts']})")
    parser.add_argument("--split", default="heldout", choices=SPLITS,
                        help="which content-disjoint split the prompts come from (banditspec_client/bench/splits.json): "
                             "heldout for figures you report, tune for anything you tune on")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of every request (0: greedy, outputs checked against vanilla's)")
    parser.add_argument("--turns", type=int, default=MULTITURN_TURNS, help=f"{MULTITURN}: user turns per conversation")
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


def _progress(total: int, disabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="run", desc="bench", disable=disabled, file=sys.stderr, dynamic_ncols=True)


def with_fixed_arms(methods: list[Method], adaptive_drafters: Sequence[str]) -> tuple[list[Method], list[str]]:
    """(methods, names added): when a method is adaptive, the fixed arm of every drafter it may
    choose is run too (unless listed already), so the best fixed arm is chosen among all of them."""
    if not any(m.adaptive for m in methods):
        return list(methods), []
    have = {m.drafter for m in methods if m.fixed_arm}
    added = [Method(d, f"fixed:{d}", d) for d in adaptive_drafters if d not in have]
    first_adaptive = next(i for i, m in enumerate(methods) if m.adaptive)
    return [*methods[:first_adaptive], *added, *methods[first_adaptive:]], [m.name for m in added]


def check_temperature(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
        raise BanditSpecValidationError("temperature", f"must be a number in [0, 2], got {value!r}")
    return float(value)


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
    settings = RunSettings(model=args.model, max_draft_len=args.max_draft_len, seed=args.seed,
                           temperature=args.temperature, threads=args.threads, adaptive_drafters=adaptive_drafters)
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


def is_greedy(setup: dict) -> bool:
    return not float(setup.get("temperature", 0.0) or 0.0) > 0.0


def write_results(out: Path, *, command: str, setup: dict, usable: list[Method], skipped: dict[str, str],
                  records: list[RunRecord], plot_prompts: int) -> list[Path]:
    """results.md, results.json and the PNG plots into ``out``; returns their paths."""
    from banditspec_client.bench.compare.plots import write_plots

    names = [m.name for m in usable]
    greedy = is_greedy(setup)
    summaries = summarize(records, names, greedy=greedy)
    cpu_summaries = summarize(records, names, clock="cpu", greedy=greedy) if all(r.cpu_seconds for r in records) else None
    decode_summaries = (summarize(records, names, clock="decode", greedy=greedy) if all(r.step_ms for r in records)
                        else None)
    title = f"BanditSpec benchmark ({setup['mode']}, {setup['model']}, {sampling_label(setup)})"
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


def sampling_label(setup: dict) -> str:
    temperature = float(setup.get("temperature", 0.0) or 0.0)
    return f"sampled, temperature {temperature:g}" if temperature > 0 else "greedy"


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
    check_temperature(args.temperature)
    if args.workload is not None and MULTITURN in [w.strip() for w in args.workload.split(",")]:
        return run_multiturn(args)
    workloads, n_prompts, max_tokens = resolve(args)
    methods = parse_methods(args.methods or DEFAULT_METHODS, args.reward)
    methods, added = with_fixed_arms(methods, _adaptive_drafters(args))
    if added:
        print(f"also running fixed arm(s) {', '.join(added)}: the adaptive methods may choose them", file=sys.stderr)
    out = args.out or _default_out()
    out.mkdir(parents=True, exist_ok=True)
    if args.prompts_file is not None:
        from banditspec_client.bench.workloads import load_prompts_file

        prompt_lists: dict = {}
        for prompt in load_prompts_file(args.prompts_file):
            prompt_lists.setdefault(prompt.workload, []).append(prompt)
    else:
        prompt_lists = {w: load_workload(w, n_prompts, seed=args.seed, split=args.split) for w in workloads}
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
        "split": "your prompts file" if args.prompts_file is not None else describe(args.split),
        "temperature": args.temperature,
        "decoding": "greedy" if args.temperature == 0 else f"sampled (temperature {args.temperature:g}, seed {args.seed})",
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


def _adaptive_drafters(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(d.strip() for d in args.drafters.split(",") if d.strip())


def run_multiturn(args: argparse.Namespace) -> int:
    """``--workload multiturn``: conversations through the OpenAI chat API of a real tritonserver."""
    import torch

    from banditspec_client.bench import multiturn
    from banditspec_client.bench.workloads import load_conversations

    if [w.strip() for w in args.workload.split(",") if w.strip()] != [MULTITURN]:
        raise BanditSpecValidationError("workload", f"{MULTITURN} runs alone (conversations, not single prompts)")
    if args.prompts_file is not None:
        raise BanditSpecValidationError("prompts_file", f"not with --workload {MULTITURN}")
    if args.reward != "accepted":
        raise BanditSpecValidationError("reward", f"{MULTITURN} goes through the OpenAI API, which has no reward field")
    methods = parse_methods(args.methods or MULTITURN_METHODS)
    n = args.prompts if args.prompts is not None else FULL["prompts"]
    max_tokens = args.max_tokens if args.max_tokens is not None else FULL["max_tokens"]
    conversations = load_conversations(n, turns=args.turns, seed=args.seed, split=args.split)
    out = args.out or _default_out()
    out.mkdir(parents=True, exist_ok=True)
    settings = RunSettings(model=args.model, max_draft_len=args.max_draft_len, seed=args.seed,
                           temperature=args.temperature, threads=args.threads,
                           adaptive_drafters=_adaptive_drafters(args))
    started = time.time()
    runner = multiturn.ConversationRunner(settings, methods, log_path=out / "tritonserver.log").__enter__()
    try:
        usable, skipped = runner.available(methods)
        for name, reason in skipped.items():
            print(f"skipping {name}: {reason}", file=sys.stderr)
        with _progress(len(conversations) * len(usable), args.no_progress) as progress:
            records = multiturn.run_conversations(runner, conversations, usable, max_tokens, progress)
        arms = ", ".join(f"{d}@{args.max_draft_len}" for d in runner.adaptive_arms)
    finally:
        runner.close()
    setup = {
        "mode": "OpenAI chat API over triton",
        "model": args.model,
        "workload": f"{MULTITURN} ({len(conversations)} conversations, {args.turns} user turns each)",
        "split": describe(args.split),
        "temperature": args.temperature,
        "decoding": "greedy" if args.temperature == 0 else f"sampled (temperature {args.temperature:g}, seed {args.seed})",
        "max_tokens": max_tokens,
        "max_draft_len (L)": args.max_draft_len,
        "adaptive arm set": arms,
        "target prefix cache": f"{multiturn.CACHE_ENTRIES} entries, emptied before each conversation",
        "seed": args.seed,
        "threads": args.threads,
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "wall time": f"{(time.time() - started) / 60:.1f} min",
    }
    paths = multiturn.write_results(out, command=command_line(sys.argv), setup=setup, methods=usable, skipped=skipped,
                                    records=records, greedy=args.temperature == 0)
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
