"""LLM load test with NVIDIA aiperf against the OpenAI-compatible API of ``banditspec serve``.

For each policy (the server's default controller, and ``vanilla`` = plain decoding) and each
concurrency, runs ``aiperf profile`` (chat endpoint, streaming, the same prompts from the project's
``mixed`` workload, greedy, a fixed output budget) and collects time to first token, inter-token
latency, output tokens/s and request latency percentiles into one table.

aiperf lives in its own virtual environment (its pinned dependencies are not the server's):
``scripts/bench_aiperf.sh`` creates ``.venv-aiperf`` and runs this module.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from banditspec_client.bench.report import markdown_table
from banditspec_client.bench.splits import SPLITS, describe

METRICS = {  # aiperf metric tag -> (column, unit)
    "time_to_first_token": ("TTFT", "ms"),
    "inter_token_latency": ("ITL", "ms"),
    "request_latency": ("latency", "ms"),
    "output_token_throughput": ("output tok/s", "tokens/sec"),
    "request_throughput": ("req/s", "requests/sec"),
    "output_sequence_length": ("OSL", "tokens"),
}


TOOL_NOTES = """## Which tool, and why

- **aiperf 0.13.0** (used here) installs from PyPI into its own venv on this Python 3.11 / glibc 2.36 machine
  and talks HTTP to the OpenAI endpoint itself (no binary), so nothing beyond the OpenAI API is needed.
  It is given the local SmolLM2 tokenizer folder (`--tokenizer`): the machine has no access to a model hub.
  Its raw exports go to `.cache/banditspec/aiperf/<policy>-c<N>/`; the table above is read from
  `profile_export_aiperf.json`; `results.json` keeps every figure and the exact aiperf command of each run.
- **genai-perf 0.0.16** also installs here, but it drives the `perf_analyzer` binary, which it does not bring:
  without one it stops with `FileNotFoundError: [Errno 2] No such file or directory: 'perf_analyzer'`.
  The `perf-analyzer` wheels need glibc 2.38; the one that works is tritonclient 2.51's (already in `.venv`).
  With it on `PATH` (and libcudart on `LD_LIBRARY_PATH`, see perf/README.md) a one-request genai-perf run against
  the OpenAI API completed: `PATH=.venv/bin:$PATH LD_LIBRARY_PATH=.venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib
  genai-perf profile -m banditspec --endpoint-type chat --url 127.0.0.1:9000 --streaming --tokenizer <folder> ...`.
  aiperf is NVIDIA's successor to genai-perf and needs neither, so the scripted run uses aiperf.
"""


def server_default_policy(triton_url: str) -> str:
    """The ``default_policy`` parameter of the served ``banditspec`` model (what "default" ran)."""
    try:
        import tritonclient.grpc as grpcclient

        config = grpcclient.InferenceServerClient(triton_url).get_model_config("banditspec", as_json=True)["config"]
        return config["parameters"]["default_policy"]["string_value"]
    except Exception as exc:  # the table still says "default"
        return f"unknown ({type(exc).__name__})"


def write_prompts(path: Path, workload: str, n: int, split: str = "heldout") -> None:
    from banditspec_client.bench.workloads import load_workload

    with path.open("w") as f:
        for prompt in load_workload(workload, n, split=split):
            f.write(json.dumps({"text": prompt.text}) + "\n")


def aiperf_command(args: argparse.Namespace, policy: str, concurrency: int, prompts: Path, artifacts: Path) -> list[str]:
    extra: dict[str, int | str] = {"temperature": 0}
    if policy != "default":
        extra["policy"] = policy
    return [
        args.aiperf, "profile",
        "--model", "banditspec",
        "--url", args.url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", args.tokenizer,
        "--input-file", str(prompts),
        "--custom-dataset-type", "single_turn",
        "--dataset-sampling-strategy", "sequential",
        "--output-tokens-mean", str(args.output_tokens),
        "--extra-inputs", json.dumps(extra),
        "--concurrency", str(concurrency),
        "--request-count", str(max(args.min_requests, args.requests_per_stream * concurrency)),
        "--warmup-request-count", str(concurrency),
        "--random-seed", "0",
        "--ui-type", "none",
        "--artifact-dir", str(artifacts),
    ]


def read_metrics(artifacts: Path) -> dict[str, Any]:
    found = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if not found:
        raise FileNotFoundError(f"no profile_export_aiperf.json under {artifacts}")
    data = json.loads(found[-1].read_text())
    out: dict[str, Any] = {}
    for tag in METRICS:
        entry = data.get(tag)
        if isinstance(entry, dict):
            out[tag] = {k: entry.get(k) for k in ("avg", "p50", "p90", "p99", "min", "max", "unit")}
    errors = data.get("error_summary") or []
    out["error_request_count"] = sum(int(e.get("count", 1)) if isinstance(e, dict) else 1 for e in errors)
    out["complete"] = bool(data.get("is_complete")) and not data.get("was_cancelled")
    out["request_count"] = (data.get("request_count") or {}).get("avg")
    return out


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# aiperf against the OpenAI API: default controller vs plain decoding",
        "",
        f"Measured {meta['date']} on {meta['machine']}. Command: `{meta['command']}`.",
        "",
        f"aiperf {meta['aiperf_version']}, chat endpoint, streaming, greedy (temperature 0), "
        f"{meta['output_tokens']} output tokens asked per request (fewer when the model ends the answer), "
        f"prompts: the first {meta['prompts']} of the `{meta['workload']}` workload in order, split {meta.get('split', 'not recorded')}. "
        f"`default` is the server's default policy, `{meta.get('default_policy', 'unknown')}`; `vanilla` is plain decoding. "
        "Times in ms (mean / p50 / p90 / p99); output tok/s is the whole run's output tokens per second.",
        "",
        "Load average (1 min) of the machine before/after each run is in the last column: other work shared "
        "the 2 cores, so compare rows of the same concurrency (run back to back), not across machines.",
        "",
    ]
    rows = []
    for r in results:
        m = r["metrics"]
        def g(tag: str, k: str, m: dict[str, Any] = m) -> float | None:
            return (m.get(tag) or {}).get(k)

        rows.append([
            r["policy"], r["concurrency"], _fmt(m.get("request_count")), _fmt(m.get("error_request_count")),
            *(_fmt(g("time_to_first_token", k)) for k in ("avg", "p50", "p99")),
            *(_fmt(g("inter_token_latency", k)) for k in ("avg", "p50", "p99")),
            *(_fmt(g("request_latency", k)) for k in ("avg", "p50", "p90", "p99")),
            _fmt(g("output_token_throughput", "avg")), _fmt(g("request_throughput", "avg")),
            "/".join(str(x) for x in r.get("load_average_1min", [])),
        ])
    header = ["policy", "concurrency", "requests", "errors", "TTFT mean", "TTFT p50", "TTFT p99", "ITL mean", "ITL p50",
              "ITL p99", "latency mean", "latency p50", "latency p90", "latency p99", "output tok/s", "req/s", "load avg"]
    lines.append(markdown_table(header, rows, "l" + "r" * 15 + "l"))
    by = {(r["policy"], r["concurrency"]): r["metrics"] for r in results}
    ratios = []
    for c in sorted({r["concurrency"] for r in results}):
        a, b = by.get(("default", c)), by.get(("vanilla", c))
        if a and b and (b.get("output_token_throughput") or {}).get("avg"):
            ratios.append(f"concurrency {c}: {a['output_token_throughput']['avg'] / b['output_token_throughput']['avg']:.2f}x")
    if ratios:
        lines += ["", "Output tokens/s, default controller / plain decoding: " + ", ".join(ratios) + "."]
    if meta.get("notes"):
        lines += ["", "## Reading", "", meta["notes"]]
    lines += ["", TOOL_NOTES]
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:9000", help="the OpenAI API of banditspec serve")
    parser.add_argument("--aiperf", default=".venv-aiperf/bin/aiperf")
    parser.add_argument("--tokenizer", default="", help="local tokenizer folder (default: the SmolLM2 cache folder)")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--policies", default="default,vanilla", help="'default' = the server's default policy")
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--split", default="heldout", choices=SPLITS,
                        help="which content-disjoint split the prompts come from (banditspec_client/bench/splits.json)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=4, help="requests = this x concurrency")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(".cache/banditspec/aiperf/report"),
                        help="table (README.md), results.json, prompts")
    parser.add_argument("--artifacts", type=Path, default=Path(".cache/banditspec/aiperf"), help="aiperf's raw exports")
    parser.add_argument("--triton-url", default="localhost:8001", help="to read the server's default_policy")
    parser.add_argument("--report-only", action="store_true", help="only re-render README.md from results.json")
    parser.add_argument("--machine", default="the project's 2-core CPU machine (shared), SmolLM2-135M reference engine")


def run(args: argparse.Namespace) -> int:
    if args.report_only:  # re-render README.md from results.json
        data = json.loads((args.out / "results.json").read_text())
        for r in data["results"]:  # re-read aiperf's exports where they are still there
            artifacts = args.artifacts / f"{r['policy']}-c{r['concurrency']}"
            if artifacts.exists():
                r["metrics"] = read_metrics(artifacts)
        (args.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
        (args.out / "README.md").write_text(report(data["results"], data["meta"]))
        return 0
    if not args.tokenizer:
        from banditspec.engine.models import model_dir

        args.tokenizer = str(model_dir("smollm2"))
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = args.out / "prompts.jsonl"
    write_prompts(prompts, args.workload, args.prompts, args.split)
    version = subprocess.run([args.aiperf, "--version"], capture_output=True, text=True).stdout.strip()
    results = []
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for c in [int(x) for x in args.concurrency.split(",")]:
        for policy in policies:  # interleaved: both policies see the same machine state
            artifacts = args.artifacts / f"{policy}-c{c}"
            command = aiperf_command(args, policy, c, prompts, artifacts)
            print("+", shlex.join(command), file=sys.stderr, flush=True)
            started, load_before = time.time(), os.getloadavg()[0]
            proc = subprocess.run(command, capture_output=True, text=True)
            (artifacts).mkdir(parents=True, exist_ok=True)
            (artifacts / "aiperf.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"aiperf failed ({proc.returncode}) for {policy} at concurrency {c}")
            metrics = read_metrics(artifacts)
            results.append({"policy": policy, "concurrency": c, "seconds": round(time.time() - started, 1),
                            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                            "command": shlex.join(command), "metrics": metrics})
            print(f"{policy} c={c}: {json.dumps(metrics.get('output_token_throughput'))}", file=sys.stderr, flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": args.machine,
        "command": "bash scripts/bench_aiperf.sh " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench-aiperf"] else sys.argv[1:]),
        "aiperf_version": version,
        "output_tokens": args.output_tokens,
        "prompts": args.prompts,
        "workload": args.workload,
        "split": describe(args.split),
        "default_policy": server_default_policy(args.triton_url),
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (args.out / "README.md").write_text(report(results, meta))
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
