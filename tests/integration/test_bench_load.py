"""``banditspec bench-load`` as a user runs it: the real command starts a real tritonserver
(tiny random-weight model) and the OpenAI API, sweeps two levels through both transports, and
writes its report; every greedy output equals plain decoding's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # a benchmark command end to end


def test_a_small_sweep_through_both_transports(tmp_path: Path):
    out = tmp_path / "load"
    command = [sys.executable, "-m", "banditspec_client.cli", "bench-load", "--model", "tiny", "--concurrency", "2",
               "--prompts", "3", "--max-tokens", "8", "--methods", "vanilla,default", "--min-requests", "1", "--no-progress",
               "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    rows = report["rows"]
    assert {(r["transport"], r["concurrency"], r["method"]) for r in rows} == {
        (t, 2, m) for t in ("triton", "openai") for m in ("vanilla", "default")}
    for row in rows:
        assert row["requests"] == 2 * row["concurrency"]  # two requests a stream
        assert row["failed"] == 0, row["errors"]
        assert row["mismatches"] == 0  # greedy: every output equals plain decoding's
        assert row["output_tokens"] > 0 and row["ttft_p50_s"] is not None and row["output_tokens_per_s"] > 0
        assert 0 <= row["generator_cpu_share"] < 1.0
    text = (out / "results.md").read_text()
    assert report["machine"]["cpu_model"] in text and "temperature: 0.0" in text
    assert (out / "load-triton.png").stat().st_size > 10_000 and (out / "load-openai.png").stat().st_size > 10_000


def test_the_openai_transport_alone_serves_every_method_from_its_own_controller_copy(tmp_path: Path):
    out = tmp_path / "load"
    command = [sys.executable, "-m", "banditspec_client.cli", "bench-load", "--model", "tiny", "--concurrency", "1",
               "--prompts", "2", "--max-tokens", "8", "--methods", "vanilla,default,suffix@4", "--transports", "openai",
               "--min-requests", "1", "--no-progress", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["transport"], r["method"]) for r in rows} == {("openai", m) for m in ("vanilla", "default", "suffix@4")}
    for row in rows:  # the private copies exist without Triton among the transports
        assert row["failed"] == 0, row["errors"]
        assert row["mismatches"] == 0
