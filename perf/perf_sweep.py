"""Load test of the ``banditspec`` Triton model with perf_analyzer: a concurrency sweep.

perf_analyzer (from ``tritonclient[all]==2.51.0``) sends streaming gRPC requests
(``--streaming``: the model is decoupled) built from an input-data JSON of benchmark
prompts, one run per concurrency level (``--request-count`` cannot span several levels).
Its own CSV rows are merged into ``perf_analyzer.csv``. For a decoupled model
perf_analyzer's latency is the *first* response's, so the LLM metrics come from its
profile export (every response's timestamp, and the final response's
``speculation_stats`` with the exact generated token count):

* TTFT: first response time - request time;
* ITL (inter-token latency): (last response time - first response time) / (tokens - 1);
* output tokens/s: all generated tokens / (last response - first request) of the run;
* request latency: last response time - request time.

Usage (a server already running, e.g. ``banditspec serve``)::

    .venv/bin/python perf/perf_sweep.py --url localhost:8001 --concurrency 1,2,4 --out perf/results

or ``--start-server [--model tiny]`` to start one for the run (its target caches only as many
sequences as the highest concurrency, so that no run reuses the prompt prefills of an earlier
run: keep ``--requests`` <= prompts - that concurrency). Needs libb64 (Debian
``libb64-0d``) and libcudart (pip ``nvidia-cuda-runtime-cu12``); ``perf_analyzer_env``
puts the latter on ``LD_LIBRARY_PATH``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_INPUT_DATA = HERE / "input_data" / "banditspec_mixed.json"


# -- input data ------------------------------------------------------------------------
def make_input_data(texts: list[str], max_tokens: int, *, policy: str | None = None, stream: bool = True) -> dict:
    """perf_analyzer's ``--input-data`` JSON: one entry per prompt (batch dimension omitted)."""
    if not texts:
        raise ValueError("no prompts")
    entries = []
    for text in texts:
        entry: dict = {"text_input": [text], "max_tokens": [int(max_tokens)], "stream": [bool(stream)]}
        if policy is not None:
            entry["policy"] = [policy]
        entries.append(entry)
    return {"data": entries}


def with_policy(data: dict, policy: str | None) -> dict:
    """A copy of input data with every entry's ``policy`` set (None: the server default)."""
    entries = []
    for entry in data["data"]:
        entry = {k: v for k, v in entry.items() if k != "policy"}
        if policy is not None:
            entry["policy"] = [policy]
        entries.append(entry)
    return {"data": entries}


def workload_input_data(workload: str, prompts: int, max_tokens: int) -> dict:
    from banditspec_client.bench.workloads import load_workload

    return make_input_data([p.text for p in load_workload(workload, prompts)], max_tokens)


# -- running perf_analyzer -------------------------------------------------------------
def perf_analyzer_path() -> Path:
    path = Path(sys.executable).parent / "perf_analyzer"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pip install 'tritonclient[all]==2.51.0'")
    return path


def perf_analyzer_env() -> dict[str, str]:
    """The environment with libcudart's folder (pip nvidia-cuda-runtime-cu12) on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is not None and spec.submodule_search_locations:
        lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def perf_analyzer_command(url: str, input_data: Path, concurrency: int, requests: int, csv_path: Path,
                          profile_path: Path, model: str = "banditspec") -> list[str]:
    return [
        str(perf_analyzer_path()), "-m", model, "-i", "grpc", "--streaming", "-u", url,
        "--input-data", str(input_data), "--concurrency-range", str(concurrency),
        "--request-count", str(requests), "-f", str(csv_path), "--profile-export-file", str(profile_path),
    ]


def run_perf_analyzer(command: list[str], log_path: Path, timeout: float) -> None:
    with open(log_path, "w") as log:
        proc = subprocess.run(command, env=perf_analyzer_env(), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        text = log_path.read_text()
        # A usage error prints "Error: ..." and then ~15 KB of help: name the error, not the help's tail.
        errors = [line for line in text.splitlines() if line.lstrip().lower().startswith("error")]
        detail = "\n".join(errors) if errors else text[-2000:]
        raise RuntimeError(f"perf_analyzer exited with {proc.returncode} (log: {log_path}):\n{detail}")


# -- metrics from the profile export --------------------------------------------------
def _generated_tokens(request: dict) -> int | None:
    for output in reversed(request.get("response_outputs", [])):
        raw = output.get("speculation_stats")
        if raw:
            return int(json.loads(raw)["generated_tokens"])
    return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def streaming_metrics(profile: dict) -> list[dict]:
    """One row per experiment (concurrency level) of a perf_analyzer profile export (times in ms)."""
    rows = []
    for experiment in profile.get("experiments", []):
        ttft, itl, latency, tokens, starts, ends = [], [], [], 0, [], []
        for request in experiment.get("requests", []):
            stamps = request.get("response_timestamps", [])
            n = _generated_tokens(request)
            if not stamps or n is None:
                continue
            sent = request["timestamp"]
            ttft.append((stamps[0] - sent) / 1e6)
            latency.append((stamps[-1] - sent) / 1e6)
            if n > 1:
                itl.append((stamps[-1] - stamps[0]) / 1e6 / (n - 1))
            tokens += n
            starts.append(sent)
            ends.append(stamps[-1])
        if not ttft:
            continue
        span_s = (max(ends) - min(starts)) / 1e9
        rows.append({
            "concurrency": experiment["experiment"]["value"],
            "requests": len(ttft),
            "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / span_s, 2) if span_s > 0 else 0.0,
            "ttft_ms_p50": round(statistics.median(ttft), 1),
            "ttft_ms_p90": round(_percentile(ttft, 90), 1),
            "itl_ms_p50": round(statistics.median(itl), 1) if itl else None,
            "itl_ms_p90": round(_percentile(itl, 90), 1) if itl else None,
            "latency_ms_p50": round(statistics.median(latency), 1),
            "latency_ms_p90": round(_percentile(latency, 90), 1),
        })
    return rows


def merge_csv(parts: list[tuple[str, Path]], out: Path) -> None:
    """perf_analyzer CSVs (one per run) -> one CSV with a leading ``policy`` column."""
    header, rows = None, []
    for policy, path in parts:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            head = next(reader)
            header = header or head
            rows += [[policy, *row] for row in reader if row and row[0].strip().isdigit()]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", *(header or [])])
        writer.writerows(rows)


def write_metrics(rows: list[dict], csv_path: Path, md_path: Path, command: str) -> None:
    keys = list(rows[0]) if rows else ["policy", "concurrency"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# perf_analyzer concurrency sweep (banditspec, streaming gRPC)", "", f"Command: `{command}`", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("–" if r[k] is None else str(r[k]) for k in keys) + " |" for r in rows]
    md_path.write_text("\n".join(lines) + "\n")


# -- the sweep -------------------------------------------------------------------------
WARM_UP_PROMPT = "Say hello."  # not among the measured prompts: it leaves none of their prefills cached


def warm_up(url: str, policies: list[str | None]) -> None:
    """One short request per policy before measuring (first calls load and compile lazily)."""
    from banditspec_client.triton_client import GenerationOptions, generate_grpc

    for policy in policies:
        generate_grpc(url, WARM_UP_PROMPT, GenerationOptions(max_tokens=4, policy=policy))


def sweep(url: str, data: dict, policies: list[str | None], concurrencies: list[int], requests_per_level: int,
          out: Path, *, timeout: float = 600) -> list[dict]:
    """Run perf_analyzer for each (policy, concurrency); write CSVs and the Markdown summary into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    parts, metrics = [], []
    warm_up(url, policies)
    for policy in policies:
        label = policy or "default"
        input_path = runs / f"input_{label}.json"
        input_path.write_text(json.dumps(with_policy(data, policy)))
        for c in concurrencies:
            stem = runs / f"{label}_c{c}"
            command = perf_analyzer_command(url, input_path, c, max(requests_per_level, 2 * c),
                                            stem.with_suffix(".csv"), stem.with_suffix(".profile.json"))
            print(f"perf_analyzer: policy {label}, concurrency {c} ...", file=sys.stderr, flush=True)
            profile = stem.with_suffix(".profile.json")
            for attempt in (1, 2):
                # perf_analyzer refuses a --profile-export-file that already exists (usage error, exit 99).
                profile.unlink(missing_ok=True)
                stem.with_suffix(".csv").unlink(missing_ok=True)
                run_perf_analyzer(command, stem.with_suffix(".log"), timeout)
                # perf_analyzer (2.51) now and then exits 0 with an empty profile export (seen once in
                # a full test run, not reproduced alone): that point is measured once more.
                if profile.exists() and profile.read_text().strip():
                    break
                if attempt == 2:
                    raise RuntimeError(f"perf_analyzer wrote an empty profile export twice: {profile}")
                stem.with_suffix(".log").replace(stem.with_suffix(".empty-profile.log"))  # kept for diagnosis
                print(f"perf_analyzer wrote an empty {profile.name}; measuring this point again", file=sys.stderr, flush=True)
            parts.append((label, stem.with_suffix(".csv")))
            for row in streaming_metrics(json.loads(profile.read_text())):
                metrics.append({"policy": label, **row})
    merge_csv(parts, out / "perf_analyzer.csv")
    write_metrics(metrics, out / "llm_metrics.csv", out / "llm_metrics.md", "python " + " ".join(map(shlex.quote, sys.argv)))
    return metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="gRPC address of a running server, e.g. localhost:8001")
    where.add_argument("--start-server", action="store_true", help="start tritonserver for the run")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"], help="with --start-server")
    parser.add_argument("--threads", type=int, default=1, help="with --start-server: the target's torch_threads")
    parser.add_argument("--input-data", type=Path, default=None, help=f"input JSON (default: {DEFAULT_INPUT_DATA.name}, "
                        "or built from --workload when given)")
    parser.add_argument("--workload", default=None, help="build the input data from this benchmark workload")
    parser.add_argument("--prompts", type=int, default=12, help="prompts in built input data")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens in built input data")
    parser.add_argument("--policies", default="ucbspec,vanilla", help="comma-separated; 'default' = the server's")
    parser.add_argument("--concurrency", default="1,2,4", help="comma-separated concurrency levels")
    parser.add_argument("--requests", type=int, default=8, help="requests per concurrency level (at least 2x concurrency)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--write-input-data", type=Path, default=None, help="only write the built input JSON there")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.workload:
        data = workload_input_data(args.workload, args.prompts, args.max_tokens)
    else:
        data = json.loads((args.input_data or DEFAULT_INPUT_DATA).read_text())
    if args.write_input_data:
        args.write_input_data.write_text(json.dumps(data, indent=1) + "\n")
        return 0
    if not (args.url or args.start_server):
        parser.error("give --url or --start-server")
    policies = [None if p == "default" else p for p in args.policies.split(",") if p]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    server = None
    if args.start_server:
        from banditspec_server.serve import TritonServer, free_port

        args.out.mkdir(parents=True, exist_ok=True)
        # The target's prefix cache keeps only as many sequences as run at once: perf_analyzer
        # sends the same prompts at every level and for every policy, and a prompt whose KV an
        # earlier run left cached would skip its prefill (a lower TTFT that the policy did not earn).
        target = {"torch_threads": str(args.threads), "cache_entries": str(max(levels))}
        server = TritonServer(model=args.model, http_port=free_port(), grpc_port=free_port(),
                              metrics_port=free_port(), log_path=args.out / "tritonserver.log",
                              overrides={"target": target})
    with server if server is not None else nullcontext():
        url = server.grpc_url if server is not None else args.url
        metrics = sweep(url, data, policies, levels, args.requests, args.out)
    print((args.out / "llm_metrics.md").read_text())
    return 0 if metrics else 1


if __name__ == "__main__":
    raise SystemExit(main())
