"""``banditspec soak``: start a server, run the soak, stop the server; print the report."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from banditspec_client.soak.expected import VanillaReference
from banditspec_client.soak.report import SoakReport, check_stop
from banditspec_client.soak.traffic import run_soak
from banditspec_client.soak.workload import build_workload


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
    from banditspec_server.serve import TritonServer

    reference = VanillaReference(model)
    cases = build_workload(requests, seed=seed)
    overrides = {"banditspec": {"max_concurrent_sequences": str(2 * concurrency), "metrics_log_interval_s": "10"}}
    if target_cache_entries is not None:
        overrides["target"] = {"cache_entries": str(target_cache_entries)}
    server = TritonServer(
        model=model, http_port=0, grpc_port=0, metrics_port=0, log_path=log_path,
        overrides=overrides,
    )
    with server:
        report = run_soak(server, cases, reference, concurrency=concurrency, sample_every_s=sample_every_s)
        check_stop(server, report)
    return report


def run(args: argparse.Namespace) -> int:
    report = soak(args.model, args.requests, args.concurrency, seed=args.seed, sample_every_s=args.sample_every,
                  target_cache_entries=args.target_cache_entries, log_path=args.log_file)
    print(json.dumps(report.summary(), indent=1))
    for failure in report.failures[:20]:
        print(f"FAIL: {failure}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"summary": report.summary(), "failures": report.failures,
                                         "samples": [asdict(s) for s in report.samples]}, indent=1))
    return 1 if report.failures else 0

