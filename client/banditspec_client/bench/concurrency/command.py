"""``banditspec bench-load``: the server under closed-loop load, as users would load it.

It starts a tritonserver (the model repository's defaults unless ``--server-param``
says otherwise) and the OpenAI API in front of it (its own process), then sweeps the
number of concurrent closed-loop streams (default 1, 2, 4, 8, 16, 32) through Triton's
streaming gRPC and through the OpenAI API. At each level every method runs the same
prompts, ``--requests-per-stream`` requests a stream; the methods take turns, the order
rotated level by level, so that drift on the machine hits them alike. The generator is
this process's one asyncio loop (:mod:`~banditspec_client.bench.concurrency.load`); its
CPU share is reported.

Methods (``--methods``): ``vanilla`` (plain decoding), ``default`` (whatever the server
does for a request that names no policy), ``<drafter>@<gamma>`` (one fixed arm, e.g.
``pld@4``), or a policy name (``costaware``, ``ucbspec``, ...).

Before the sweep every prompt is sent once (one token, plain decoding) so that the
target's prefix cache (sized to hold them all) holds every prompt for every method alike,
and every method sends one short request through each transport (its code paths loaded).

Outputs in ``--out``: results.json (every block's summary and settings), results.md and
load-<transport>.png. Failed requests (e.g. refused by a full server) are counted per
block, never fatal; greedy outputs that differ from plain decoding's on the same prompt
are counted too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from banditspec.bandits.registry import ADAPTIVE_POLICIES
from banditspec.config import arm_drafter, split_arm

from banditspec_client.bench.concurrency.load import (
    TRANSPORTS,
    BlockResult,
    Client,
    OpenAIStreamClient,
    TritonStreamClient,
    run_block,
)
from banditspec_client.bench.methods import FIXED_DRAFTERS
from banditspec_client.bench.splits import SPLITS, describe
from banditspec_client.triton_client import GenerationOptions

DEFAULT_OUT = Path("docs/benchmarks/concurrency")
DEFAULT_METHODS = "vanilla,pld@4,suffix@4,copy@4,eagle@4,default"
ADAPTIVE = ADAPTIVE_POLICIES
FIXED = FIXED_DRAFTERS


@dataclass(frozen=True)
class LoadMethod:
    name: str
    policy: str | None  # None: the server's default

    @property
    def learns_from_outputs(self) -> bool:
        """Whether its requests draw on the suffix drafter's trie of past outputs (the default and
        the adaptive policies, whose arms include it, and the suffix arm): through Triton it gets
        a private copy of the controller model, so what other methods generated on the same
        prompts never drafts for it."""
        return self.policy is None or self.policy in ADAPTIVE or arm_drafter(self.name) == "suffix"

    @property
    def model_name(self) -> str:
        """The controller model its Triton requests go to."""
        from banditspec_client.bench.through_triton import CONTROLLER, private_model_name

        return private_model_name(self) if self.learns_from_outputs else CONTROLLER


def parse_methods(text: str) -> list[LoadMethod]:
    out: list[LoadMethod] = []
    for name in (t.strip() for t in text.split(",")):
        if not name:
            continue
        drafter, gamma = split_arm(name)
        if name == "vanilla":
            out.append(LoadMethod(name, "vanilla"))
        elif name == "default":
            out.append(LoadMethod(name, None))
        elif name in ADAPTIVE:
            out.append(LoadMethod(name, name))
        elif drafter in FIXED and (name == drafter or gamma.isdigit()):
            out.append(LoadMethod(name, f"fixed:{name}"))
        else:
            raise SystemExit(f"--methods: unknown method {name!r} (vanilla, default, <drafter>@<gamma> with drafter "
                             f"in {', '.join(FIXED)}, or one of {', '.join(ADAPTIVE)})")
    if not out or len({m.name for m in out}) != len(out):
        raise SystemExit("--methods: give at least one method, each once")
    return out


def read_prompts_file(path: Path) -> list[str]:
    """Prompts from a file: JSON lines (each an object with "text", "prompt" or "content",
    or a string), or plain text, one prompt a line."""
    prompts: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix in (".jsonl", ".json"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"--prompts-file {path}:{number}: not JSON ({exc.msg})") from None
            text = item if isinstance(item, str) else next(
                (item[k] for k in ("text", "prompt", "content") if isinstance(item, dict) and isinstance(item.get(k), str)),
                None)
            if text is None:
                raise SystemExit(f"--prompts-file {path}:{number}: expected a string or an object with \"text\"")
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise SystemExit(f"--prompts-file {path}: no prompt in it")
    return prompts


def rotated(methods: list[LoadMethod], index: int) -> list[LoadMethod]:
    k = index % len(methods)
    return methods[k:] + methods[:k]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"expected integers >= 1, got {text!r}")
    return values


def _params(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--server-param: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def load_prompts(args: argparse.Namespace) -> tuple[list[str], str]:
    """The run's prompts and what the report says of them: ``--prompts-file``, or the first
    ``--prompts`` of ``--workload`` in ``--split``."""
    from banditspec_client.bench.workloads import load_workload  # the datasets: loaded only when used

    if args.prompts_file is not None:
        return read_prompts_file(args.prompts_file)[: args.prompts], str(args.prompts_file)
    prompts = [p.text for p in load_workload(args.workload, args.prompts, split=args.split)]
    return prompts, f"workload {args.workload}, split {describe(args.split)}, its first {len(prompts)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32", help="concurrent closed-loop streams per level")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help="vanilla, default, <drafter>@<gamma> (a fixed arm) or a policy name; interleaved")
    parser.add_argument("--transports", default="triton,openai", help="triton (streaming gRPC) and/or openai")
    parser.add_argument("--workload", default="mixed", help="prompt set (banditspec_client.bench.workloads)")
    parser.add_argument("--split", default="heldout", choices=SPLITS,
                        help="which content-disjoint split --workload's prompts come from "
                             "(banditspec_client/bench/splits.json): heldout for figures you report, tune for tuning")
    parser.add_argument("--prompts-file", type=Path, default=None,
                        help="prompts from a file (JSON lines with \"text\", or one prompt a line) instead of --workload")
    parser.add_argument("--prompts", type=int, default=24, help="distinct prompts, cycled by the streams")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--requests-per-stream", type=int, default=2, help="requests each stream sends per level (>= 2)")
    parser.add_argument("--min-requests", type=int, default=24,
                        help="at least this many requests a row: a level's streams send more when "
                             "streams x --requests-per-stream falls short")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (outputs are checked against plain)")
    parser.add_argument("--seed", type=int, default=None, help="the requests' seed when sampling")
    parser.add_argument("--server-param", action="append", default=[], metavar="KEY=VALUE",
                        help="a banditspec model parameter for this run (e.g. gamma_controller=ucb); repeatable")
    parser.add_argument("--target-param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of the target model (model_repository/target/config.pbtxt), e.g. answer_early=true")
    parser.add_argument("--torch-threads", type=int, default=None, help="the target's torch threads (default: the server's)")
    parser.add_argument("--bls-threads", type=int, default=None,
                        help="the Python backend's thread-pool-size (default: 2 x the largest concurrency + 8)")
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for results.json, results.md, PNGs")
    parser.add_argument("--log-file", type=Path, default=None, help="server log (default: in the cache folder)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_openai(grpc_url: str, model: str, log: Path, triton_model: str = "banditspec") -> tuple[subprocess.Popen, str]:
    """The OpenAI API in its own process (its CPU is the server's, not the generator's), in
    front of one Triton model (a method with a private controller copy gets its own)."""
    port = _free_port()
    with open(log, "ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "banditspec_client.cli", "openai", "--triton-url", grpc_url, "--port", str(port),
             "--model", model, "--triton-model", triton_model], stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the OpenAI API exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as answer:
                if answer.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit(f"the OpenAI API did not answer within 120 s; see {log}")


def mark_mismatches(blocks: list[BlockResult], temperature: float) -> dict[int, int]:
    """Per block (by index): greedy outputs that differ from plain decoding's on the same
    prompt, at the same level through the same transport (None when sampling or no plain
    output to compare with)."""
    if temperature > 0:
        return {}
    plain: dict[tuple[str, int, int], str] = {}
    for block in blocks:
        if block.method == "vanilla":
            for o in block.outcomes:
                if o.ok:
                    plain.setdefault((block.transport, block.concurrency, o.prompt_index), o.text)
    out = {}
    for i, block in enumerate(blocks):
        keys = [((block.transport, block.concurrency, o.prompt_index), o.text) for o in block.outcomes if o.ok]
        compared = [(k, t) for k, t in keys if k in plain]
        if compared:
            out[i] = sum(plain[k] != t for k, t in compared)
    return out


def run(args: argparse.Namespace) -> int:
    from banditspec.paths import cache_dir
    from banditspec_server.serve import SOURCE_REPOSITORY, TritonServer

    from banditspec_client.bench.concurrency.summary import write_report
    from banditspec_client.bench.through_triton import bench_repository
    levels = _ints(args.concurrency)
    methods = parse_methods(args.methods)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    if not transports or any(t not in TRANSPORTS for t in transports):
        raise SystemExit(f"--transports: choose from {', '.join(TRANSPORTS)}")
    if args.requests_per_stream < 2:
        raise SystemExit("--requests-per-stream must be >= 2 (a stream's first request starts with the others)")
    if args.prompts < 1 or args.max_tokens < 1:
        raise SystemExit("--prompts and --max-tokens must be >= 1")
    prompts, source = load_prompts(args)
    server_params = _params(args.server_param)
    overrides: dict[str, dict[str, str]] = {
        "target": {"cache_entries": str(2 * max(levels) + len(prompts)), **_params(args.target_param)},
        "banditspec": dict(server_params),
    }
    needed = sum(level * _per_stream(args, level) for level in levels)
    if needed > len(prompts):
        print(f"note: {needed} requests a method and {len(prompts)} prompts: prompts repeat across levels, "
              f"which flatters methods that learn from past outputs (--prompts {needed} avoids it)",
              file=sys.stderr, flush=True)
    private = sorted({m.model_name for m in methods if m.learns_from_outputs})  # through either transport
    for name in private:
        overrides[name] = {"target_model": args.model, **server_params}
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-repo-", dir=cache_dir()))
    repository = bench_repository(SOURCE_REPOSITORY, private, workdir / "models")
    if args.torch_threads is not None:
        overrides["target"]["torch_threads"] = str(args.torch_threads)
    log = args.log_file or cache_dir() / "bench-load-tritonserver.log"
    server = TritonServer(model=args.model, http_port=0, grpc_port=0, metrics_port=0, overrides=overrides, log_path=log,
                          source=repository,
                          extra_args=(f"--backend-config=python,thread-pool-size={args.bls_threads or 2 * max(levels) + 8}",))
    opts_for = {m.name: GenerationOptions(max_tokens=args.max_tokens, stream=True, policy=m.policy,
                                          temperature=args.temperature if args.temperature > 0 else None,
                                          seed=args.seed) for m in methods}
    settings = {
        "concurrency": levels, "methods": [m.name for m in methods], "transports": transports,
        "prompts": len(prompts), "prompt_source": source, "max_tokens": args.max_tokens,
        "requests_per_stream": {level: _per_stream(args, level) for level in levels},
        "min_requests": args.min_requests, "temperature": args.temperature, "seed": args.seed,
        "max_draft_len": server_params.get("default_max_draft_len", _repository_default("default_max_draft_len")),
        "torch_threads": args.torch_threads if args.torch_threads is not None else
        f"{_repository_default('torch_threads', 'target')} (the repository's default; 0: torch's own choice)",
        "server_params": server_params, "target_params": _params(args.target_param), "model": args.model,
    }
    report: dict = {
        "command": "banditspec bench-load " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "machine": {"cpu_model": cpu_model(), "logical_cpus": os.cpu_count() or 0, "platform": platform.platform()},
        "settings": settings, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [],
    }
    print(f"starting tritonserver ({args.model}) ...", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # leave through `with server`: no orphaned server
    openai_processes: list[subprocess.Popen] = []
    blocks: list[BlockResult] = []
    try:
        with server:
            urls = {"triton": server.grpc_url}
            if "openai" in transports:
                # one front end per controller model, so that no method drafts from the suffix trie
                # another method (or its own earlier level) filled, as through Triton
                for model_name in dict.fromkeys(m.model_name for m in methods):
                    process, urls[f"openai:{model_name}"] = start_openai(
                        server.grpc_url, args.model, cache_dir() / "bench-load-openai.log", triton_model=model_name)
                    openai_processes.append(process)
            blocks = asyncio.run(_sweep(args, levels, methods, transports, prompts, urls, opts_for,
                                        metrics_port=server.metrics_port))
    finally:
        for process in openai_processes:
            process.terminate()
            process.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    mismatches = mark_mismatches(blocks, args.temperature)
    for i, block in enumerate(blocks):
        row = block.summary()
        row["mismatches"] = mismatches.get(i)
        report["rows"].append(row)
    shares = [r["generator_cpu_share"] for r in report["rows"]]
    report["generator"] = {"mean_cpu_share": sum(shares) / len(shares) if shares else 0.0,
                           "max_cpu_share": max(shares, default=0.0)}
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    for path in [args.out / "results.json", *write_report(report, args.out)]:
        print(f"wrote {path}", file=sys.stderr)
    failed = sum(r["failed"] for r in report["rows"])
    differing = sum(r["mismatches"] or 0 for r in report["rows"])
    print(f"{sum(r['requests'] for r in report['rows'])} requests, {failed} failed, {differing} outputs differ from "
          f"plain decoding's", file=sys.stderr)
    return 0


async def _sweep(args: argparse.Namespace, levels: list[int], methods: list[LoadMethod], transports: list[str],
                 prompts: list[str], urls: dict[str, str], opts_for: dict[str, GenerationOptions],
                 metrics_port: int | None = None) -> list[BlockResult]:
    from tqdm import tqdm

    clients: dict[str, Client] = {}  # "<transport>:<model>" for each controller model a method uses
    for transport in transports:
        for method in methods:
            key = f"{transport}:{method.model_name}"
            if key not in clients:
                clients[key] = (TritonStreamClient(urls["triton"], model_name=method.model_name) if transport == "triton"
                                else OpenAIStreamClient(urls[key]))
                await clients[key].start()

    def client_for(transport: str, method: LoadMethod) -> Client:
        return clients[f"{transport}:{method.model_name}"]
    blocks: list[BlockResult] = []
    try:
        print(f"warming up: {len(prompts)} prompts into the prefix cache, one request per method ...",
              file=sys.stderr, flush=True)
        warm = GenerationOptions(max_tokens=1, stream=True, policy="vanilla")
        indices = list(range(len(prompts)))
        await run_block(client_for(transports[0], methods[0]), transport=transports[0], method="warm-up", prompts=prompts,
                        prompt_indices=indices, concurrency=1, requests_per_stream=len(prompts), opts=warm)
        for transport in transports:
            for method in methods:
                short = GenerationOptions(max_tokens=4, stream=True, policy=method.policy)
                await run_block(client_for(transport, method), transport=transport, method=method.name, prompts=prompts,
                                prompt_indices=[0], concurrency=1, requests_per_stream=1, opts=short)
        total = sum(level * _per_stream(args, level) for level in levels) * len(methods) * len(transports)
        bar = tqdm(total=total, unit="req", disable=args.no_progress, file=sys.stderr)
        offset = 0
        for li, level in enumerate(levels):
            # each level its own prompts (cycled only when the list runs out), the same for every method
            count = level * _per_stream(args, level)
            level_indices = [(offset + k) % len(prompts) for k in range(count)]
            offset += count
            for transport in transports:
                for method in rotated(methods, li):
                    bar.set_description(f"{level} streams, {transport}, {method.name}")
                    before = _target_batches(metrics_port)
                    block = await run_block(
                        client_for(transport, method), transport=transport, method=method.name, prompts=prompts,
                        prompt_indices=level_indices, concurrency=level, requests_per_stream=_per_stream(args, level),
                        opts=opts_for[method.name], request_timeout_s=args.request_timeout_s,
                        on_request=lambda _: bar.update(1))
                    block.target_batches = _batches_between(before, _target_batches(metrics_port))
                    blocks.append(block)
                    row = block.summary()
                    bar.write(f"{level:>3} streams {transport:>6} {method.name:>10}: {row['output_tokens_per_s']:8.1f} tok/s"
                              f"  TTFT p50 {row['ttft_p50_s']}  ITL p50 {row['itl_p50_s']}  failed {row['failed']}"
                              f"  generator CPU {100 * row['generator_cpu_share']:.1f} %")
        bar.close()
    finally:
        for client in clients.values():
            await client.close()
    return blocks


def _target_batches(metrics_port: int | None) -> tuple[float, float] | None:
    """(engine calls, sequences verified) by every target model so far, from the metrics port;
    None without one or when it does not answer (the sweep never stops for it)."""
    if metrics_port is None:
        return None
    from banditspec_client.prometheus_text import metric_total, scrape_metrics

    try:
        series = scrape_metrics(metrics_port)
    except OSError:
        return None
    return (metric_total(series, "nv_banditspec_target_verify_batches"),
            metric_total(series, "nv_banditspec_target_verified_sequences"))


def _batches_between(before: tuple[float, float] | None, after: tuple[float, float] | None) -> dict[str, float] | None:
    """The target's engine calls over a block and the sequences they carried on average."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    calls, sequences = after[0] - before[0], after[1] - before[1]
    return {"engine_calls": calls, "sequences_per_call": round(sequences / calls, 3)}


def _per_stream(args: argparse.Namespace, level: int) -> int:
    """Requests each of a level's streams sends: --requests-per-stream, more when the row would
    have fewer than --min-requests."""
    return max(args.requests_per_stream, -(-args.min_requests // level))


def _repository_default(key: str, model: str = "banditspec") -> str:
    """A parameter's value in the model repository's config (what the server runs with)."""
    import re

    from banditspec_server.serve import SOURCE_REPOSITORY

    text = (SOURCE_REPOSITORY / model / "config.pbtxt").read_text()
    found = re.search(r'key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)
    return found.group(1) if found else "?"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
