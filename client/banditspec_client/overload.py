"""Bounded overload run: many more closed-loop clients than ``max_concurrent_sequences``
for a fixed time against a real tritonserver. Reports the admitted requests' latency
percentiles, the share refused with the documented busy answer, any other error, RSS of
the server and its stubs, the target's KV-cache figures against its bound, /dev/shm, and
whether every completed output equals plain greedy decoding.

    .venv/bin/python -m banditspec_client.overload --model tiny --clients 32 --seconds 120

A client that gets ``server busy`` waits ``--busy-backoff-ms`` (default 50) and tries again.
Figures: docs/reliability.md, "Overload".
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
from banditspec.paths import cache_dir
from banditspec_server.serve import TritonServer

from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.soak.expected import VanillaReference
from banditspec_client.soak.processes import server_processes, shm_bytes
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are two good habits for writing clean code?",
    "Translate to French: the weather is nice today.",
    "List three prime numbers.",
    "Summarise: caches keep recent keys and values.",
    "def area(width, height):\n    return width * height\n",
]
POLICIES = ["ucbspec", "exp3spec", "vanilla", "fixed:pld"]


def run_overload(model: str, clients: int, seconds: float, max_concurrent: int, max_tokens: int,
                 busy_backoff_s: float, sample_every_s: float = 2.0) -> dict[str, Any]:
    reference = VanillaReference(model)
    expected = {p: reference.text(p, max_tokens) for p in PROMPTS}
    log = cache_dir() / "overload-tritonserver.log"
    log.write_bytes(b"")
    server = TritonServer(
        model=model, http_port=0, grpc_port=0, metrics_port=0, log_path=log,
        overrides={"banditspec": {"drafters": "pld,suffix", "max_concurrent_sequences": str(max_concurrent)}},
    )
    outcomes: Counter[str] = Counter()
    other_errors: Counter[str] = Counter()
    latencies: list[float] = []
    mismatches: list[str] = []
    samples: list[dict[str, float]] = []
    lock = threading.Lock()
    with server:
        assert server.process is not None  # started by the with
        server_pid = server.process.pid
        processes = server_processes(server_pid)
        regions = {p.shm_region for p in processes if p.shm_region}
        shm_start = shm_bytes(regions)
        stop_at = time.monotonic() + seconds
        done = threading.Event()

        def client(i: int) -> None:
            n = 0
            while time.monotonic() < stop_at:
                prompt = PROMPTS[(i + n) % len(PROMPTS)]
                opts = GenerationOptions(max_tokens=max_tokens, stream=(i + n) % 2 == 0, policy=POLICIES[(i + n) % 4])
                n += 1
                started = time.monotonic()
                try:
                    result = generate_grpc(server.grpc_url, prompt, opts, timeout=300)
                except TritonError as exc:
                    message = str(exc)
                    with lock:
                        if message.startswith("server busy"):
                            outcomes["busy"] += 1
                        else:
                            outcomes["error"] += 1
                            other_errors[message[:120]] += 1
                    if message.startswith("server busy"):
                        time.sleep(busy_backoff_s)
                    continue
                with lock:
                    outcomes["ok"] += 1
                    latencies.append(time.monotonic() - started)
                    if result.text != expected[prompt]:
                        mismatches.append(prompt)

        def sampler() -> None:
            t0 = time.monotonic()
            while not done.wait(sample_every_s):
                try:
                    metrics = scrape_metrics(server.metrics_port)
                except OSError:
                    continue
                procs = server_processes(server_pid)
                samples.append({
                    "t": round(time.monotonic() - t0, 1),
                    "rss_mb": round(sum(p.rss_bytes for p in procs) / 2**20, 1),
                    "active": metric_total(metrics, "nv_banditspec_active_sequences"),
                    "kv_tokens": metric_total(metrics, "nv_banditspec_target_kv_cached_tokens"),
                    "kv_capacity": metric_total(metrics, "nv_banditspec_target_kv_cache_capacity_tokens"),
                    "kv_entries": metric_total(metrics, "nv_banditspec_target_kv_cache_entries"),
                })

        watcher = threading.Thread(target=sampler, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join(10)
        shm_end = shm_bytes(regions)
        stubs_alive = {p.pid for p in server_processes(server_pid) if p.shm_region} == {
            p.pid for p in processes if p.shm_region}
        ready_after = server.is_ready()
    total = sum(outcomes.values())
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {
        "model": model, "clients": clients, "max_concurrent_sequences": max_concurrent, "seconds": seconds,
        "max_tokens": max_tokens, "requests": total, "outcomes": dict(outcomes),
        "busy_share": round(outcomes["busy"] / total, 3) if total else None,
        "admitted_latency_s": {q: round(float(np.percentile(lat, p)), 2) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))}
        | {"max": round(float(lat.max()), 2)},
        "completed_per_s": round(outcomes["ok"] / seconds, 2),
        "other_errors": dict(other_errors), "mismatches": len(mismatches),
        "rss_mb": {"first": samples[0]["rss_mb"] if samples else None, "last": samples[-1]["rss_mb"] if samples else None,
                   "max": max((s["rss_mb"] for s in samples), default=None)},
        "active_max": max((s["active"] for s in samples), default=None),
        "kv_tokens_max": max((s["kv_tokens"] for s in samples), default=None),
        "kv_capacity": samples[-1]["kv_capacity"] if samples else None,
        "kv_entries_max": max((s["kv_entries"] for s in samples), default=None),
        "shm": {"start": shm_start, "end": shm_end}, "stubs_unchanged": stubs_alive, "ready_after": ready_after,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--busy-backoff-ms", type=float, default=50)
    parser.add_argument("--json", type=str, default=None, help="write the report here too")
    args = parser.parse_args(argv)
    report = run_overload(args.model, args.clients, args.seconds, args.max_concurrent, args.max_tokens,
                          args.busy_backoff_ms / 1000)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    bad = report["outcomes"].get("error", 0) or report["mismatches"] or not report["stubs_unchanged"] or not report["ready_after"]
    bad = bad or (report["kv_capacity"] is not None and report["kv_tokens_max"] > report["kv_capacity"])
    bad = bad or report["active_max"] > args.max_concurrent or report["shm"]["start"] != report["shm"]["end"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
