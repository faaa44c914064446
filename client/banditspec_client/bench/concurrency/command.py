"""``banditspec bench-concurrency``: throughput and latency against the number of
concurrent streams, fixed speculation lengths against the server-wide controller
(the paper's Figure 3 setting, on a real tritonserver).

One server holds the ``target`` and two copies of the controller model: ``banditspec``
(``gamma_controller=off``) serves the fixed settings, gamma = k meaning every request uses
one drafter arm ``fixed:<drafter>@k`` (k = 0: ``vanilla``); ``banditspec_ucb``
(``gamma_controller=ucb``) serves the adaptive setting, every request asking for
``<drafter>@L`` under the cap the controller learns. Every prompt is first run once, so
that the target's prefix cache holds it (prefill costs the same under every setting; left
in, it only adds noise). At each concurrency every setting then runs the same closed loop
(warm-up, then a measured window), one after the other.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from banditspec_client.triton_client import GenerationOptions

ADAPTIVE_MODEL = "banditspec_ucb"
DEFAULT_OUT = Path("docs/benchmarks/concurrency.json")


@dataclass(frozen=True)
class Setting:
    label: str  # "gamma=2", "adaptive"
    model_name: str
    policy: str
    gamma: int | None  # None: adaptive


def settings_for(gammas: list[int], drafter: str, max_gamma: int, adaptive: bool) -> list[Setting]:
    out = [
        Setting(f"gamma={g}", "banditspec", "vanilla" if g == 0 else f"fixed:{drafter}@{g}", g) for g in gammas
    ]
    if adaptive:
        out.append(Setting("adaptive", ADAPTIVE_MODEL, f"fixed:{drafter}@{max_gamma}", None))
    return out


def prepare_repository(out: Path, queue_delay_us: int | None = None) -> Path:
    """A copy of the model repository plus ``banditspec_ucb``, a second controller model;
    ``queue_delay_us`` replaces the target's dynamic-batching queue delay."""
    from banditspec_client.serve import SOURCE_REPOSITORY

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for model_dir in sorted(p for p in SOURCE_REPOSITORY.iterdir() if (p / "config.pbtxt").exists()):
        shutil.copytree(model_dir, out / model_dir.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(out / "banditspec", out / ADAPTIVE_MODEL)
    config = out / ADAPTIVE_MODEL / "config.pbtxt"
    text, count = re.subn(r'^name:\s*"banditspec"', f'name: "{ADAPTIVE_MODEL}"', config.read_text(), count=1, flags=re.M)
    if count != 1:
        raise RuntimeError(f"{config}: no name line to rename")
    config.write_text(text)
    if queue_delay_us is not None:
        target = out / "target" / "config.pbtxt"
        text, count = re.subn(r"max_queue_delay_microseconds:\s*\d+", f"max_queue_delay_microseconds: {int(queue_delay_us)}", target.read_text())
        if count != 1:
            raise RuntimeError(f"{target}: no max_queue_delay_microseconds to replace")
        target.write_text(text)
    return out


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", help="concurrent streams per level")
    parser.add_argument("--gammas", default="0,1,2,3,4", help="fixed speculation lengths to compare")
    parser.add_argument("--no-adaptive", action="store_true", help="fixed settings only")
    parser.add_argument("--drafter", default="pld", help="the one drafter every setting uses")
    parser.add_argument("--max-draft-len", type=int, default=4, help="L: the adaptive controller's largest gamma")
    parser.add_argument("--workload", default="code-edit", help="prompt set (banditspec_client.bench.workloads)")
    parser.add_argument("--prompts", type=int, default=64, help="distinct prompts, cycled by the streams")
    parser.add_argument("--max-prompt-chars", type=int, default=650,
                        help="keep prompts up to this long (short prompts keep prefill from dominating)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup-s", type=float, default=8.0, help="closed loop before the measured window")
    parser.add_argument("--warmup-per-stream-s", type=float, default=0.25,
                        help="extra warm-up per stream (the first prompts of all streams are prefilled at once)")
    parser.add_argument("--measure-s", type=float, default=20.0, help="measured window per setting and level")
    parser.add_argument("--cache-entries", type=int, default=None,
                        help="the target's prefix-cache entries (default: 2 x the largest concurrency + the prompts; "
                             "fewer than the sequences in flight thrash)")
    parser.add_argument("--queue-delay-us", type=int, default=None,
                        help="override the target's dynamic-batching max_queue_delay_microseconds in the bench's copy")
    parser.add_argument("--bls-threads", type=int, default=None,
                        help="the Python backend's thread-pool-size, which serves BLS calls "
                             "(default: 2 x the largest concurrency + 8; Triton's own default is 32)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="the target's torch threads (on a shared 2-core machine more threads oversubscribe)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON (plot and table next to it)")
    parser.add_argument("--log-file", type=Path, default=None, help="server log (default: in the cache folder)")


def run(args) -> int:
    from banditspec.paths import cache_dir
    from banditspec_client.bench.concurrency.load import run_closed_loop
    from banditspec_client.bench.concurrency.summary import write_report
    from banditspec_client.serve import TritonServer
    from banditspec_client.bench.workloads import load_workload

    levels, gammas = _ints(args.concurrency), _ints(args.gammas)
    if not levels or min(levels) < 1 or any(g < 0 or g > args.max_draft_len for g in gammas) or 0 not in gammas:
        raise SystemExit("--concurrency must be >= 1 and --gammas must include 0 and lie in 0..--max-draft-len")
    prompts = [p.text for p in load_workload(args.workload) if len(p.text) <= args.max_prompt_chars][: args.prompts]
    if not prompts:
        raise SystemExit(f"no {args.workload} prompt is at most {args.max_prompt_chars} characters long")
    settings = settings_for(gammas, args.drafter, args.max_draft_len, not args.no_adaptive)
    common = {
        "target_model": args.model,
        "drafters": args.drafter,
        # headroom: a closed-loop stream may send its next request a moment before the server
        # releases the slot of the one it just finished
        "max_concurrent_sequences": str(max(levels) + 4),
        "default_max_draft_len": str(args.max_draft_len),
    }
    overrides = {
        "target": {"torch_threads": str(args.torch_threads), "cache_entries": str(args.cache_entries or 2 * max(levels) + len(prompts))},
        "banditspec": {**common, "gamma_controller": "off"},
        ADAPTIVE_MODEL: {**common, "gamma_controller": "ucb", "gamma_controller_max": str(args.max_draft_len)},
    }
    source = prepare_repository(cache_dir() / "triton" / "bench-concurrency-repository", args.queue_delay_us)
    log = args.log_file or cache_dir() / "bench-concurrency-tritonserver.log"
    server = TritonServer(
        model=args.model, http_port=0, grpc_port=0, metrics_port=0,
        overrides=overrides, log_path=log, source=source,
        extra_args=(f"--backend-config=python,thread-pool-size={args.bls_threads or 2 * max(levels) + 8}",),
    )
    report = {
        "command": "banditspec bench-concurrency " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": _cpus()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": [],
    }
    print(f"starting tritonserver ({args.model}) ...", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # leave through `with server`: no orphaned server
    with server:
        for setting in settings:  # load the models' code paths once before measuring
            opts = GenerationOptions(max_tokens=8, policy=setting.policy, max_draft_len=args.max_draft_len)
            run_closed_loop(grpc_url=server.grpc_url, metrics_port=server.metrics_port, model_name=setting.model_name,
                            prompts=prompts[:1], concurrency=1, opts=opts, warmup_s=0.0, measure_s=2.0)
        prefill_prompts(server.grpc_url, prompts)
        for level in levels:
            for setting in settings:
                opts = GenerationOptions(max_tokens=args.max_tokens, policy=setting.policy, max_draft_len=args.max_draft_len)
                result = run_closed_loop(
                    grpc_url=server.grpc_url, metrics_port=server.metrics_port, model_name=setting.model_name, prompts=prompts,
                    concurrency=level, opts=opts, warmup_s=args.warmup_s + args.warmup_per_stream_s * level,
                    measure_s=args.measure_s,
                )
                row = {
                    "concurrency": level,
                    "setting": setting.label,
                    "gamma": setting.gamma,
                    "tokens_per_second": round(result.tokens_per_second, 3),
                    "window_s": round(result.window_seconds, 2),
                    "window_tokens": result.window_tokens,
                    "mean_batch": round(result.mean_batch, 3),
                    "cache_evictions": result.evictions,
                    "mean_drafted_per_step": round(result.mean_drafted(), 3),
                    "latency": result.latency(),
                    "errors": result.errors[:5],
                }
                report["rows"].append(row)
                print(
                    f"c={level:>2} {setting.label:>9}: {row['tokens_per_second']:7.2f} tok/s  "
                    f"batch {row['mean_batch']:5.2f}  evictions {result.evictions:.0f}  drafted/step {row['mean_drafted_per_step']:.2f}  "
                    f"latency {row['latency'].get('mean_s', float('nan'))} s ({row['latency'].get('requests', 0)} req)"
                    + (f"  errors {len(result.errors)}" if result.errors else ""),
                    flush=True,
                )
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1))
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.write_text(json.dumps(report, indent=1))
    for path in write_report(report, args.out):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def prefill_prompts(grpc_url: str, prompts: list[str]) -> None:
    """Run every prompt once (one token each), so that the target's prefix cache holds them:
    every setting then starts from the same cache, and the sweep measures decoding, where
    the settings differ (a prompt's prefill costs the same under every gamma)."""
    from banditspec_client.triton_client import generate_grpc

    print(f"prefilling {len(prompts)} prompts ...", file=sys.stderr, flush=True)
    for prompt in prompts:
        generate_grpc(grpc_url, prompt, GenerationOptions(max_tokens=1, policy="vanilla"))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _cpus() -> int:
    import os

    return os.cpu_count() or 0
