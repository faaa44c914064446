"""Prometheus metrics on Triton's metrics port (real tritonserver, real SmolLM2): they sit
next to Triton's own ``nv_`` metrics and move exactly as the requests' own stats say.
Drafter-failure counters are checked with the fault drafters in test_reliability.py."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter

import pytest
from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc, generate_http

pytestmark = pytest.mark.integration

CODE_PROMPT = (
    "Rewrite this function with type hints and keep the body unchanged:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n"
    "    return width * height\n"
)
MAX_DRAFT_LEN = 16  # the server's limit: histogram buckets are le=0..16


def wait_idle(server, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while metric_total(scrape_metrics(server.metrics_port), "nv_banditspec_active_sequences") > 0:
        assert time.monotonic() < deadline, "sequences still active"
        time.sleep(0.1)


def delta(after, before, name, **labels) -> float:
    return metric_total(after, name, **labels) - metric_total(before, name, **labels)


def cumulative(values: Counter, bound: int) -> list[int]:
    """Prometheus bucket counts le=0..bound of the observed integer values."""
    return [sum(n for v, n in values.items() if v <= le) for le in range(bound + 1)]


def test_speculation_metrics_move_exactly_with_the_requests(server):
    wait_idle(server)
    before = scrape_metrics(server.metrics_port)
    runs = [
        ("fixed:pld", CODE_PROMPT),
        ("ucbspec", CODE_PROMPT),
        ("vanilla", "Say hello."),
        ("exp3spec", "Write a Python function that returns the n-th Fibonacci number."),
    ]
    stats = [generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=24, policy=p)).stats for p, prompt in runs]
    after = scrape_metrics(server.metrics_port)

    per_arm: dict[str, dict[str, int]] = {}
    accepted_by_arm: dict[str, Counter] = {}
    drafted_per_step: Counter = Counter()
    for s in stats:
        for arm, totals in s["per_arm"].items():
            entry = per_arm.setdefault(arm, Counter())
            entry.update(totals)
        for arm, drafted, accepted in zip(s["arms"], s["drafted"], s["accepted"]):
            accepted_by_arm.setdefault(arm, Counter())[accepted] += 1
            drafted_per_step[drafted] += 1
    assert sum(t["accepted"] for t in per_arm.values()) > 0, "PLD on a copy-editing prompt accepts tokens"
    for arm, totals in per_arm.items():
        assert delta(after, before, "nv_banditspec_arm_pulls", arm=arm) == totals["pulls"], arm
        assert delta(after, before, "nv_banditspec_drafted_tokens", arm=arm) == totals["drafted"], arm
        assert delta(after, before, "nv_banditspec_accepted_tokens", arm=arm) == totals["accepted"], arm
        hist = "nv_banditspec_accepted_length"
        assert delta(after, before, f"{hist}_count", arm=arm) == totals["pulls"]
        assert delta(after, before, f"{hist}_sum", arm=arm) == totals["accepted"]
        buckets = [delta(after, before, f"{hist}_bucket", arm=arm, le=str(le)) for le in range(MAX_DRAFT_LEN + 1)]
        assert buckets == cumulative(accepted_by_arm[arm], MAX_DRAFT_LEN), arm
    gamma = "nv_banditspec_speculation_length"
    steps = sum(s["steps"] for s in stats)
    assert delta(after, before, f"{gamma}_count") == steps
    assert delta(after, before, f"{gamma}_sum") == sum(sum(s["drafted"]) for s in stats)
    assert [delta(after, before, f"{gamma}_bucket", le=str(le)) for le in range(MAX_DRAFT_LEN + 1)] == cumulative(
        drafted_per_step, MAX_DRAFT_LEN)
    assert delta(after, before, "nv_banditspec_generated_tokens") == sum(s["generated_tokens"] for s in stats)
    assert delta(after, before, "nv_banditspec_requests", outcome="success") == len(runs)
    # Triton's own counters moved too, for both models
    assert delta(after, before, "nv_inference_request_success", model="banditspec") == len(runs)
    assert delta(after, before, "nv_inference_request_success", model="target") == steps
    assert delta(after, before, "nv_banditspec_target_forward_passes") >= 1


def test_active_sequences_follow_a_stream(server):
    wait_idle(server)
    streaming = threading.Event()
    done = threading.Event()

    def stream():
        try:
            generate_grpc(server.grpc_url, CODE_PROMPT, GenerationOptions(max_tokens=48, stream=True),
                          on_text=lambda _: streaming.set())
        finally:
            done.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert streaming.wait(120)
    during = metric_total(scrape_metrics(server.metrics_port), "nv_banditspec_active_sequences")
    thread.join(300)
    assert done.is_set()
    assert during == 1
    wait_idle(server, timeout=10)


def test_rejected_requests_are_counted_by_outcome(server):
    wait_idle(server)
    before = scrape_metrics(server.metrics_port)
    for bad in (GenerationOptions(max_tokens=0), GenerationOptions(max_tokens=8, policy="best")):
        with pytest.raises(TritonError):
            generate_http(server.http_url, "Hi.", bad)
    after = scrape_metrics(server.metrics_port)
    assert delta(after, before, "nv_banditspec_requests", outcome="invalid") == 2
    assert delta(after, before, "nv_banditspec_requests", outcome="success") == 0


def test_families_carry_help_and_type_in_tritons_conventions(server):
    generate_grpc(server.grpc_url, "Say hi.", GenerationOptions(max_tokens=4, policy="fixed:pld"))  # arm series exist
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    expected = {
        "nv_banditspec_requests": "counter",
        "nv_banditspec_active_sequences": "gauge",
        "nv_banditspec_arm_pulls": "counter",
        "nv_banditspec_drafted_tokens": "counter",
        "nv_banditspec_accepted_tokens": "counter",
        "nv_banditspec_accepted_length": "histogram",
        "nv_banditspec_speculation_length": "histogram",
        "nv_banditspec_generated_tokens": "counter",
        "nv_banditspec_target_kv_cached_tokens": "gauge",
        "nv_banditspec_target_kv_cache_capacity_tokens": "gauge",
    }
    for name, kind in expected.items():
        assert f"# TYPE {name} {kind}\n" in text, name
        help_line = next(line for line in text.splitlines() if line.startswith(f"# HELP {name} "))
        assert len(help_line) > len(f"# HELP {name} ") + 10
    assert 'nv_inference_count{model="banditspec",version="1"}' in text  # Triton's own, same port
    series = scrape_metrics(server.metrics_port)
    for labels, _ in series["nv_banditspec_arm_pulls"]:
        assert labels["model"] == "banditspec" and labels["version"] == "1" and labels["arm"]
