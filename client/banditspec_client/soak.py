"""``banditspec soak``: hundreds of mixed requests against a real tritonserver.

Good requests (every policy, streamed or not, gRPC or HTTP, some with stop words),
cancelled streams and invalid requests run concurrently. Meanwhile the server's process
tree is sampled: resident memory per process (server, each Python stub), the target's
prefix KV cache (``nv_banditspec_target_kv_*`` gauges) and its /dev/shm regions.

It fails when a good request errs or differs from plain greedy decoding of the same
model in this process, when a cancelled stream's text is not a prefix of that output,
when an invalid request is not rejected naming its field, when acceptance of a
deterministic arm drifts between repeats of one prompt, when the KV cache exceeds its
bound, when /dev/shm or memory grows, or when stopping the server leaves a stub process
or a /dev/shm region behind.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from banditspec_client.prometheus_text import (  # noqa: F401  (the soak's metrics, re-exported)
    Series,
    metric_total,
    parse_metrics,
    scrape_metrics,
)
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc, generate_http

MB = 1024 * 1024
PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Rewrite this function with type hints and keep the body unchanged:\n\n"
    "def area(width, height):\n    return width * height\n",
    "What are two good habits for writing clean code?",
    "Summarise in one sentence: the cache keeps the keys and values of recent sequences.",
    "List three prime numbers and explain why they are prime.",
    "Translate to French: the weather is nice today.",
)
GOOD_POLICIES = ("ucbspec", "exp3spec", "uniform", "vanilla", "fixed:pld", "fixed:suffix")
DETERMINISTIC_POLICY = "fixed:pld"  # per-request drafter: its acceptance must repeat exactly
# (options that a server must reject, the field its message must start with)
INVALID_CASES = (
    (dict(max_tokens=0), "max_tokens"),
    (dict(policy="best"), "policy"),
    (dict(arms=["magic"]), "arms"),
    (dict(max_draft_len=99), "max_draft_len"),
    (dict(temperature=-1.0), "temperature"),
    (dict(stop_words=[f"w{i}" for i in range(40)]), "stop_words"),
)


# --- the server's process tree ------------------------------------------------------------


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    role: str  # "server", or the model a Python stub serves ("banditspec", "target", "eagle")
    rss_bytes: int
    shm_region: str | None  # the stub's /dev/shm region name


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def server_processes(server_pid: int) -> list[ProcessInfo]:
    """The server and its children; a Python-backend stub's argv is
    ``stub <repo>/<model>/<version>/model.py <shm region> ...``."""
    out = [ProcessInfo(server_pid, "server", _rss(server_pid), None)]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _ppid(int(entry.name)) != server_pid:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_stub = len(argv) > 2 and argv[0].endswith("triton_python_backend_stub")
        role = Path(argv[1]).parent.parent.name if is_stub else "child"
        out.append(ProcessInfo(int(entry.name), role, _rss(int(entry.name)), argv[2] if is_stub else None))
    return out


def shm_bytes(regions: set[str]) -> tuple[int, int]:
    """(how many of ``regions`` exist in /dev/shm, their total size in bytes)."""
    paths = [Path("/dev/shm") / name for name in regions]
    sizes = [p.stat().st_size for p in paths if p.exists()]
    return len(sizes), sum(sizes)


def leftovers(processes: list[ProcessInfo], wait_s: float = 5.0) -> tuple[list[int], list[str]]:
    """Processes still alive (after up to ``wait_s`` for exiting ones to go) and /dev/shm
    regions still present; call after a stop."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p.pid for p in processes if _ppid(p.pid) is not None]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    regions = [p.shm_region for p in processes if p.shm_region and (Path("/dev/shm") / p.shm_region).exists()]
    return alive, regions


# --- the reference: plain greedy decoding in this process ---------------------------------


class VanillaReference:
    """Text of plain greedy decoding with the server's model, memoised; thread-safe."""

    def __init__(self, model: str):
        from banditspec.runtime import load_local

        self._stack = load_local(model, arms=("pld",))
        self._lock = threading.Lock()
        self._memo: dict[tuple, str] = {}

    def text(self, prompt: str, max_tokens: int, stop_words: tuple[str, ...] = ()) -> str:
        from banditspec.config import GenerationRequest
        from banditspec.decoding import run_to_completion
        from banditspec.text import prompt_ids, stop_sequences

        key = (prompt, max_tokens, stop_words)
        with self._lock:
            if key not in self._memo:
                tok = self._stack.tokenizer
                request = GenerationRequest(
                    prompt_ids(tok, prompt, chat=True),
                    max_tokens,
                    policy="vanilla",
                    stop_sequences=stop_sequences(tok, list(stop_words)),
                )
                result = run_to_completion(self._stack.engine, self._stack.decoder.start(request))
                self._memo[key] = tok.decode(result.token_ids, skip_special_tokens=True)
            return self._memo[key]


# --- workload -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SoakCase:
    kind: str  # "good" | "cancel" | "invalid"
    prompt: str
    options: GenerationOptions
    protocol: str = "grpc"  # "grpc" | "http"
    cancel_after: int | None = None  # responses before the client cancels
    bad_field: str | None = None  # for "invalid": the field the error must name


def build_workload(n: int, *, seed: int = 0, cancel_share: float = 0.1, invalid_share: float = 0.1,
                   max_tokens: tuple[int, ...] = (8, 16, 24, 32, 40), cancel_max_tokens: int = 200) -> list[SoakCase]:
    """``n`` cases in a seeded random order; good requests draw their max_tokens from
    ``max_tokens`` (few distinct values: the references are computed once per value)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        prompt = rng.choice(PROMPTS)
        draw = rng.random()
        if draw < invalid_share:
            options, bad_field = rng.choice(INVALID_CASES)
            opts = GenerationOptions(**{"max_tokens": 8, **options})
            cases.append(SoakCase("invalid", prompt, opts, rng.choice(["grpc", "http"]), bad_field=bad_field))
        elif draw < invalid_share + cancel_share:
            opts = GenerationOptions(max_tokens=cancel_max_tokens, stream=True, policy=rng.choice(GOOD_POLICIES))
            cases.append(SoakCase("cancel", prompt, opts, "grpc", cancel_after=rng.randint(1, 3)))
        else:
            policy = rng.choice(GOOD_POLICIES)
            deterministic = policy == DETERMINISTIC_POLICY  # repeats of one setting, for the drift check
            stop = (".",) if rng.random() < 0.15 and not deterministic else ()
            opts = GenerationOptions(
                max_tokens=max_tokens[-1] if deterministic else rng.choice(max_tokens),
                stream=rng.random() < 0.4,
                policy=policy,
                stop_words=stop,
            )
            cases.append(SoakCase("good", prompt, opts, "http" if rng.random() < 0.2 else "grpc"))
    return cases


# --- running and judging ------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    done: int  # requests finished so far
    rss_by_role: dict[str, int]
    kv_cached_tokens: float
    kv_capacity_tokens: float
    kv_entries: float
    kv_evictions: float
    shm_regions: int
    shm_bytes: int
    active_sequences: float

    @property
    def rss_total(self) -> int:
        return sum(self.rss_by_role.values())


@dataclass
class SoakReport:
    requests: int = 0
    good: int = 0
    cancelled: int = 0
    invalid: int = 0
    seconds: float = 0.0
    generated_tokens: int = 0
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    drift_groups_checked: int = 0
    server_outcomes: dict[str, float] = field(default_factory=dict)
    leftover_processes: list[int] = field(default_factory=list)
    leftover_shm: list[str] = field(default_factory=list)

    def rss_mb(self, at: str) -> float:
        """Total RSS in MB of the sample "start" (before traffic), "warm" (after a fifth
        of the requests), "end" (after traffic) or "peak"."""
        if not self.samples:
            return 0.0
        if at == "peak":
            return max(s.rss_total for s in self.samples) / MB
        if at == "start":
            return self.samples[0].rss_total / MB
        if at == "end":
            return self.samples[-1].rss_total / MB
        warm = [s for s in self.samples if s.done >= self.requests / 5] or self.samples
        return warm[0].rss_total / MB

    @property
    def kv_max_tokens(self) -> float:
        return max((s.kv_cached_tokens for s in self.samples), default=0.0)

    @property
    def kv_capacity_tokens(self) -> float:
        return max((s.kv_capacity_tokens for s in self.samples), default=0.0)

    def summary(self) -> dict:
        first, last = (self.samples[0], self.samples[-1]) if self.samples else (None, None)
        return {
            "requests": self.requests, "good": self.good, "cancelled": self.cancelled, "invalid": self.invalid,
            "failures": len(self.failures), "seconds": round(self.seconds, 1),
            "generated_tokens": self.generated_tokens,
            "rss_mb": {k: round(self.rss_mb(k), 1) for k in ("start", "warm", "end", "peak")},
            "rss_mb_by_process_end": {k: round(v / MB, 1) for k, v in (last.rss_by_role if last else {}).items()},
            "kv_cached_tokens_max": self.kv_max_tokens, "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_entries_max": max((s.kv_entries for s in self.samples), default=0.0),
            "kv_evictions": last.kv_evictions if last else 0.0,
            "shm": {"start": [first.shm_regions, first.shm_bytes] if first else None,
                    "end": [last.shm_regions, last.shm_bytes] if last else None},
            "drift_groups_checked": self.drift_groups_checked,
            "server_outcomes": self.server_outcomes,
            "leftover_processes": self.leftover_processes, "leftover_shm": self.leftover_shm,
        }


class _Runner:
    def __init__(self, server, reference: VanillaReference, report: SoakReport):
        self.server = server
        self.reference = reference
        self.report = report
        self.lock = threading.Lock()
        self.done = 0
        self.pld_acceptance: dict[tuple, list] = {}

    def fail(self, text: str) -> None:
        with self.lock:
            self.report.failures.append(text)

    def run_case(self, case: SoakCase) -> None:
        try:
            self._run_case(case)
        except Exception as exc:  # a harness bug must fail the soak, not vanish in a thread
            self.fail(f"{case.kind} {case.options}: {type(exc).__name__}: {exc}")
        finally:
            with self.lock:
                self.done += 1

    def _call(self, case: SoakCase):
        if case.protocol == "http":
            return generate_http(self.server.http_url, case.prompt, case.options, timeout=300)
        return generate_grpc(self.server.grpc_url, case.prompt, case.options, cancel_after=case.cancel_after, timeout=300)

    def _run_case(self, case: SoakCase) -> None:
        opts = case.options
        if case.kind == "invalid":
            try:
                self._call(case)
            except TritonError as exc:
                if not str(exc).startswith(case.bad_field) or "Traceback" in str(exc):
                    self.fail(f"invalid {case.bad_field}: unclear error {str(exc)[:200]!r}")
                return
            self.fail(f"invalid {case.bad_field}: accepted ({opts})")
            return
        try:
            result = self._call(case)
        except TritonError as exc:
            self.fail(f"{case.kind} {opts.policy} {case.protocol}: error {str(exc)[:200]!r}")
            return
        expected = self.reference.text(case.prompt, opts.max_tokens, tuple(opts.stop_words))
        if case.kind == "cancel":
            if not expected.startswith(result.text):
                self.fail(f"cancelled {opts.policy}: streamed text is not a prefix of plain decoding")
            return
        if result.text != expected:
            self.fail(f"good {opts.policy} {case.protocol} max_tokens={opts.max_tokens}: differs from plain "
                      f"decoding on prompt {case.prompt[:40]!r}")
            return
        with self.lock:
            self.report.generated_tokens += int(result.stats.get("generated_tokens", 0))
            if opts.policy == DETERMINISTIC_POLICY:
                key = (case.prompt, opts.max_tokens, tuple(opts.stop_words))
                self.pld_acceptance.setdefault(key, []).append(result.stats.get("accepted"))

    def sample(self, started: float, processes_of, regions: set[str]) -> Sample:
        procs = processes_of()
        rss: dict[str, int] = {}
        for p in procs:
            rss[p.role] = rss.get(p.role, 0) + p.rss_bytes
        try:
            metrics = scrape_metrics(self.server.metrics_port)
        except OSError:
            metrics = {}
        count, size = shm_bytes(regions)
        return Sample(
            seconds=round(time.monotonic() - started, 2),
            done=self.done,
            rss_by_role=rss,
            kv_cached_tokens=metric_total(metrics, "nv_banditspec_target_kv_cached_tokens"),
            kv_capacity_tokens=metric_total(metrics, "nv_banditspec_target_kv_cache_capacity_tokens"),
            kv_entries=metric_total(metrics, "nv_banditspec_target_kv_cache_entries"),
            kv_evictions=metric_total(metrics, "nv_banditspec_target_kv_cache_evictions"),
            shm_regions=count,
            shm_bytes=size,
            active_sequences=metric_total(metrics, "nv_banditspec_active_sequences"),
        )


def run_soak(server, cases: list[SoakCase], reference: VanillaReference, *, concurrency: int = 8,
             sample_every_s: float = 2.0, rss_tolerance: float = 0.15, rss_slack_mb: float = 64.0) -> SoakReport:
    """Run ``cases`` against a started :class:`~banditspec_client.serve.TritonServer`
    (the caller stops it), sampling its process tree; returns the judged report."""
    report = SoakReport(requests=len(cases))
    report.good = sum(c.kind == "good" for c in cases)
    report.cancelled = sum(c.kind == "cancel" for c in cases)
    report.invalid = sum(c.kind == "invalid" for c in cases)
    runner = _Runner(server, reference, report)
    for case in cases:  # references first: their cost must not look like server latency
        if case.kind != "invalid":
            reference.text(case.prompt, case.options.max_tokens, tuple(case.options.stop_words))
    server_pid = server.process.pid
    regions = {p.shm_region for p in server_processes(server_pid) if p.shm_region}
    started = time.monotonic()
    report.samples.append(runner.sample(started, lambda: server_processes(server_pid), regions))
    stop = threading.Event()

    def sampler():
        while not stop.wait(sample_every_s):
            report.samples.append(runner.sample(started, lambda: server_processes(server_pid), regions))

    thread = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
    thread.start()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="soak") as pool:
        list(pool.map(runner.run_case, cases))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and runner.sample(started, list, set()).active_sequences > 0:
        time.sleep(0.2)  # cancelled sequences stop at their next step
    stop.set()
    thread.join()
    report.samples.append(runner.sample(started, lambda: server_processes(server_pid), regions))
    report.seconds = time.monotonic() - started
    outcomes = scrape_metrics(server.metrics_port).get("nv_banditspec_requests", [])
    report.server_outcomes = {labels.get("outcome", "?"): value for labels, value in outcomes}
    _judge(report, runner, rss_tolerance, rss_slack_mb)
    return report


def _judge(report: SoakReport, runner: _Runner, rss_tolerance: float, rss_slack_mb: float) -> None:
    for key, runs in runner.pld_acceptance.items():
        if len(runs) > 1:
            report.drift_groups_checked += 1
            if any(r != runs[0] for r in runs):
                report.failures.append(f"acceptance of {DETERMINISTIC_POLICY} drifted on prompt {key[0][:40]!r}: {runs}")
    if report.kv_max_tokens > report.kv_capacity_tokens > 0:
        report.failures.append(f"KV cache held {report.kv_max_tokens} tokens, over its bound {report.kv_capacity_tokens}")
    first, last = report.samples[0], report.samples[-1]
    if (last.shm_regions, last.shm_bytes) != (first.shm_regions, first.shm_bytes):
        report.failures.append(f"/dev/shm changed: {first.shm_regions} regions {first.shm_bytes} B -> "
                               f"{last.shm_regions} regions {last.shm_bytes} B")
    warm, end = report.rss_mb("warm"), report.rss_mb("end")
    if end > warm * (1 + rss_tolerance) + rss_slack_mb:
        report.failures.append(f"RSS grew from {warm:.0f} MB (warm) to {end:.0f} MB")
    if last.active_sequences:
        report.failures.append(f"{last.active_sequences:.0f} sequences still active after the run")


def check_stop(server, report: SoakReport) -> None:
    """Stop ``server`` and record stub processes or /dev/shm regions it left behind."""
    processes = server_processes(server.process.pid)
    server.stop()
    report.leftover_processes, report.leftover_shm = leftovers(processes)
    if report.leftover_processes or report.leftover_shm:
        report.failures.append(f"after stop: processes {report.leftover_processes}, shm {report.leftover_shm}")


# --- CLI ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--target-cache-entries", type=int, default=None,
                        help="the target's prefix-cache entries (small values make eviction happen often)")
    parser.add_argument("--json", type=Path, default=None, help="write the report (summary + samples) here")
    parser.add_argument("--log-file", type=Path, default=None, help="server log")


def soak(model: str, requests: int, concurrency: int, *, seed: int = 0, sample_every_s: float = 2.0,
         target_cache_entries: int | None = None, log_path: Path | None = None) -> SoakReport:
    """Start a server, run the soak, stop the server; everything judged in the report."""
    from banditspec_client.serve import TritonServer, free_port

    reference = VanillaReference(model)
    cases = build_workload(requests, seed=seed)
    overrides = {"banditspec": {"max_concurrent_sequences": str(2 * concurrency), "metrics_log_interval_s": "10"}}
    if target_cache_entries is not None:
        overrides["target"] = {"cache_entries": str(target_cache_entries)}
    server = TritonServer(
        model=model, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), log_path=log_path,
        overrides=overrides,
    )
    with server:
        report = run_soak(server, cases, reference, concurrency=concurrency, sample_every_s=sample_every_s)
        check_stop(server, report)
    return report


def run(args) -> int:
    report = soak(args.model, args.requests, args.concurrency, seed=args.seed, sample_every_s=args.sample_every,
                  target_cache_entries=args.target_cache_entries, log_path=args.log_file)
    print(json.dumps(report.summary(), indent=1))
    for failure in report.failures[:20]:
        print(f"FAIL: {failure}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"summary": report.summary(), "failures": report.failures,
                                         "samples": [asdict(s) for s in report.samples]}, indent=1))
    return 1 if report.failures else 0

