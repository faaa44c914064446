"""perf_analyzer really runs against the real server: a short streaming concurrency sweep
writes its CSV, and the profile export yields TTFT / inter-token latency."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PERF_SWEEP = Path(__file__).resolve().parents[2] / "perf" / "perf_sweep.py"
MAX_TOKENS = 8


def _load_perf_sweep():
    spec = importlib.util.spec_from_file_location("perf_sweep", PERF_SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def perf_sweep():
    module = _load_perf_sweep()
    try:
        path = module.perf_analyzer_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    probe = subprocess.run([str(path), "--version"], env=module.perf_analyzer_env(), capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"perf_analyzer does not start here (libb64-0d / libcudart missing?): {probe.stderr[-300:]}")
    return module


def test_concurrency_sweep_writes_csv_and_streaming_metrics(server, perf_sweep, tmp_path):
    data = perf_sweep.make_input_data(["Name two colours.", "def add(a, b):"], MAX_TOKENS)
    metrics = perf_sweep.sweep(server.grpc_url, data, ["ucbspec", "vanilla"], [1, 2], 2, tmp_path, timeout=240)

    with open(tmp_path / "perf_analyzer.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], int(r["Concurrency"])) for r in rows] == [("ucbspec", 1), ("ucbspec", 2), ("vanilla", 1), ("vanilla", 2)]
    assert all(float(r["Inferences/Second"]) > 0 for r in rows)

    assert [(m["policy"], m["concurrency"]) for m in metrics] == [("ucbspec", 1), ("ucbspec", 2), ("vanilla", 1), ("vanilla", 2)]
    for m in metrics:
        assert m["requests"] >= 2
        assert 0 < m["output_tokens"] <= m["requests"] * MAX_TOKENS
        assert 0 < m["ttft_ms_p50"] <= m["latency_ms_p50"]
        assert m["output_tokens_per_s"] > 0
    assert (tmp_path / "llm_metrics.md").read_text().count("| ucbspec |") == 2

    profile = json.loads((tmp_path / "runs" / "vanilla_c1.profile.json").read_text())
    request = profile["experiments"][0]["requests"][0]
    assert request["request_inputs"]["policy"] == "vanilla"
    # streaming: plain decoding sends one response per step, the last one carries the stats
    assert len(request["response_timestamps"]) >= 2
