"""RELIABILITY.md against a real tritonserver (tiny random-weight model: behaviour, not text
quality): drafter faults, target failures, cancellation under load, shutdown with requests
in flight, server-side limits. docs/reliability.md maps each checklist line to a test."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN as L
from banditspec.errors import parse_retry_after
from banditspec.paths import cache_dir
from banditspec_client.prometheus_text import metric_total, scrape_metrics
from banditspec_client.soak.expected import VanillaReference
from banditspec_client.soak.processes import leftovers, server_processes
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc, generate_http
from banditspec_server.serve import TritonServer

pytestmark = pytest.mark.integration

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are two good habits for writing clean code?",
    "Translate to French: the weather is nice today.",
    "List three prime numbers.",
    "Summarise: caches keep recent keys and values.",
]
DEADLINE_MS = 200
FAULT_PLUGIN = str(Path(__file__).resolve().parents[1] / "fault_drafters.py")  # outside the shipped package


def start_server(name: str, **overrides) -> TritonServer:
    log = cache_dir() / f"reliability-{name}.log"
    log.write_bytes(b"")
    server = TritonServer(
        model="tiny", http_port=0, grpc_port=0, metrics_port=0, log_path=log,
        overrides=overrides,
    )
    return server.__enter__()


@pytest.fixture(scope="module")
def reference():
    return VanillaReference("tiny")


@pytest.fixture(scope="module")
def fault_server():
    """Test-only fault drafters enabled by configuration, a short per-step deadline, room for 100 streams."""
    server = start_server(
        "faults",
        banditspec={
            "drafters": "pld,suffix,fault_raise,fault_hang",
            "drafter_plugin": FAULT_PLUGIN,
            "drafter_deadline_ms": str(DEADLINE_MS),
            "max_concurrent_sequences": "100",
        },
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def limits_server():
    """Small server-side limits, and a target whose context (80) is shorter than the controller's."""
    server = start_server(
        "limits",
        banditspec={
            "drafters": "pld,fault_hang",
            "drafter_plugin": FAULT_PLUGIN,
            "drafter_deadline_ms": "3000",
            "max_concurrent_sequences": "2",
            "max_queue_size": "1",
            "max_prompt_tokens": "48",
            "max_tokens_limit": "64",
            "max_stop_words": "2",
        },
        target={"max_context": "80"},
    )
    yield server
    server.stop()


def metrics(server) -> dict:
    return scrape_metrics(server.metrics_port)


def wait_idle(server, timeout: float = 30.0) -> float:
    """Seconds until no sequence is active (fails the test after ``timeout``)."""
    started = time.monotonic()
    while metric_total(metrics(server), "nv_banditspec_active_sequences") > 0:
        assert time.monotonic() - started < timeout, "sequences still active"
        time.sleep(0.1)
    return time.monotonic() - started


def healthy(server) -> bool:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as resp:
        return resp.status == 200


# --- faults -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["ucbspec", "exp3spec", "fixed:fault_raise"])
def test_a_raising_drafter_is_dropped_and_counted_and_the_request_is_lossless(fault_server, reference, policy):
    before = metrics(fault_server)
    prompt = PROMPTS[0]
    result = generate_grpc(
        fault_server.grpc_url, prompt, GenerationOptions(max_tokens=24, policy=policy, arms=["fault_raise", "pld"])
    )
    assert result.text == reference.text(prompt, 24)
    assert result.stats["dropped_arms"] == {f"fault_raise@{L}": "propose failed: InjectedFault"}
    after = metrics(fault_server)
    failures = "nv_banditspec_drafter_failures"
    assert metric_total(after, failures, drafter="fault_raise", kind="error") == metric_total(
        before, failures, drafter="fault_raise", kind="error") + 1


def test_hanging_drafters_cost_one_deadline_each_and_requests_stay_lossless(fault_server, reference):
    before = metrics(fault_server)
    opts = GenerationOptions(max_tokens=24, policy="ucbspec", arms=["fault_hang", "pld", "suffix"])

    def one(i):
        started = time.monotonic()
        result = generate_grpc(fault_server.grpc_url, PROMPTS[i % len(PROMPTS)], opts)
        return result, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=6) as pool:
        runs = list(pool.map(one, range(6)))
    for i, (result, seconds) in enumerate(runs):
        assert result.text == reference.text(PROMPTS[i % len(PROMPTS)], 24)
        assert result.stats["dropped_arms"] == {f"fault_hang@{L}": "deadline exceeded"}
        assert seconds < 15, "a hung drafter must cost its deadline, not its hang (30 s)"
    after = metrics(fault_server)
    key = dict(drafter="fault_hang", kind="deadline")
    assert metric_total(after, "nv_banditspec_drafter_failures", **key) == metric_total(
        before, "nv_banditspec_drafter_failures", **key) + 6


def test_cancelling_10_of_100_concurrent_streams(fault_server, reference):
    before = metrics(fault_server)
    policies = ["ucbspec", "exp3spec", "fixed:pld", "vanilla"]
    cancelled = set(range(5, 100, 10))  # 10 of them, spread over the burst

    def one(i):
        prompt = PROMPTS[i % len(PROMPTS)]
        if i in cancelled:
            opts = GenerationOptions(max_tokens=1000, stream=True, policy=policies[i % 4])
            return generate_grpc(fault_server.grpc_url, prompt, opts, cancel_after=2, timeout=300)
        opts = GenerationOptions(max_tokens=24, stream=i % 2 == 0, policy=policies[i % 4])
        return generate_grpc(fault_server.grpc_url, prompt, opts, timeout=300)

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(one, range(100)))
    for i, result in enumerate(results):
        expected = reference.text(PROMPTS[i % len(PROMPTS)], 64)
        if i in cancelled:
            assert result.responses == 2 and expected.startswith(result.text), f"cancelled stream {i}"
        else:
            assert result.text == reference.text(PROMPTS[i % len(PROMPTS)], 24), f"stream {i} differs"
    wait_idle(fault_server)  # every slot (and its per-request state) released
    after = metrics(fault_server)
    delta = {o: metric_total(after, "nv_banditspec_requests", outcome=o) - metric_total(before, "nv_banditspec_requests", outcome=o)
             for o in ("success", "cancelled")}
    assert delta == {"success": 90, "cancelled": 10}
    tokens = metric_total(after, "nv_banditspec_generated_tokens") - metric_total(before, "nv_banditspec_generated_tokens")
    assert tokens < 90 * 24 + 10 * 300, f"cancelled streams kept generating: {tokens} tokens"
    # the target's prefix KV cache stays within its bounds (cancelled sequences are evicted, LRU)
    assert 0 < metric_total(after, "nv_banditspec_target_kv_cached_tokens") <= metric_total(
        after, "nv_banditspec_target_kv_cache_capacity_tokens")
    assert metric_total(after, "nv_banditspec_target_kv_cache_entries") <= 16  # target cache_entries


# --- target failures ----------------------------------------------------------------------


def test_a_target_error_mid_request_fails_clearly_then_the_server_serves(limits_server, reference):
    before = metrics(limits_server)
    started = time.monotonic()
    with pytest.raises(TritonError) as failure:  # prompt ~40 tokens + 60 > the target's context of 80
        generate_grpc(limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=60, policy="vanilla"), timeout=60)
    assert time.monotonic() - started < 30
    message = str(failure.value)
    assert message.startswith("target engine failed") and "context of 80" in message, message
    assert "Traceback" not in message and ".py" not in message
    assert generate_grpc(limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=8)).text == reference.text("Hi.", 8)
    after = metrics(limits_server)
    assert metric_total(after, "nv_banditspec_requests", outcome="target_error") == metric_total(
        before, "nv_banditspec_requests", outcome="target_error") + 1


def test_an_unavailable_target_fails_clearly_without_hanging():
    """A target that is not there is a server-side condition: the message says so and carries the
    retry hint (the model's ``retry_after_s``). Triton 2.51's HTTP /generate answers it 400 all the
    same (docs/reliability.md, "Status codes": upstream computes the status from an error it has
    already freed); this test says when that changes."""
    server = start_server("no-target", banditspec={"target_name": "no_such_model", "drafters": "pld", "retry_after_s": "7"})
    try:  # start-up's warm-up request has already met the missing target: count from here
        before = metric_total(metrics(server), "nv_banditspec_requests", outcome="target_error")
        for call in (generate_grpc, generate_http):
            started = time.monotonic()
            with pytest.raises(TritonError) as failure:
                call(server.grpc_url if call is generate_grpc else server.http_url, "Hi.", GenerationOptions(max_tokens=8), timeout=60)
            assert time.monotonic() - started < 10
            message = str(failure.value)
            assert message.startswith("target engine failed: no_such_model") and "Traceback" not in message, message
            assert parse_retry_after(message) == 7, message
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/banditspec/generate",
                                         data=json.dumps({"text_input": "Hi.", "max_tokens": 8}).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=60)
        assert answer.value.code == 400, "Triton's /generate now keeps the model's status: update docs/reliability.md"
        assert healthy(server)
        assert metric_total(metrics(server), "nv_banditspec_requests", outcome="target_error") == before + 3
        assert metric_total(metrics(server), "nv_banditspec_active_sequences") == 0
    finally:
        server.stop()


# --- shutdown -----------------------------------------------------------------------------


def test_stopping_the_server_with_requests_in_flight_is_clean():
    server = start_server("shutdown", banditspec={"drafters": "pld,suffix"})
    try:
        processes = server_processes(server.process.pid)
    except BaseException:
        server.stop()  # never leave a server behind when the test fails early
        raise
    stubs = [p for p in processes if p.shm_region]
    streaming = [threading.Event() for _ in range(6)]
    outcomes: dict[int, str] = {}

    def one(i):
        opts = GenerationOptions(max_tokens=1000, stream=True, policy="ucbspec" if i % 2 else "vanilla")
        try:
            generate_grpc(server.grpc_url, PROMPTS[i % len(PROMPTS)], opts, on_text=lambda _: streaming[i].set(), timeout=120)
            outcomes[i] = "finished"
        except TritonError as exc:
            outcomes[i] = str(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    try:
        assert {p.role for p in stubs} == {"banditspec", "target", "eagle"}  # eagle loads, serving nothing for tiny
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in streaming), "streams never started"
        started = time.monotonic()
        code = server.stop(timeout=60)
        stop_seconds = time.monotonic() - started
    finally:
        server.stop()
    for t in threads:
        t.join(60)
    assert code == 0, f"tritonserver exited with {code} (a negative code means it had to be killed)"
    assert stop_seconds < 30
    assert len(outcomes) == 6, "a client hung after the shutdown"
    for message in outcomes.values():
        assert message == "finished" or "Traceback" not in message
    alive, regions = leftovers(processes)
    assert alive == [] and regions == []


def test_an_idle_http_keepalive_client_does_not_leave_shm_behind():
    import http.client

    server = start_server("keepalive", banditspec={"drafters": "pld"})
    processes = server_processes(server.process.pid)
    idle = http.client.HTTPConnection("localhost", server.http_port)
    try:
        idle.request("GET", "/v2/health/ready")
        idle.getresponse().read()  # the connection stays open, idle
        server.stop(timeout=5)
        alive, regions = leftovers(processes)
    finally:
        idle.close()
        server.stop()
        for p in processes:  # never leave this test's regions behind, whatever the verdict
            if p.shm_region:
                (Path("/dev/shm") / p.shm_region).unlink(missing_ok=True)
    assert alive == [] and regions == []


# --- limits and security posture ----------------------------------------------------------

LIMIT_CASES = [
    (dict(prompt="word " * 60), "text_input", "the limit is 48"),
    (dict(max_tokens=65), "max_tokens", "exceeds the limit 64"),
    (dict(stop_words=["a", "b", "c"]), "stop_words", "at most 2 stop words"),
    (dict(stop_words=["x " * 40]), "stop_words", "1..32 tokens"),
]


@pytest.mark.parametrize("case, field, detail", LIMIT_CASES, ids=["prompt", "max_tokens", "stop_count", "stop_length"])
def test_limits_from_configuration_are_enforced_with_clear_errors(limits_server, reference, case, field, detail):
    case = dict(case)
    prompt = case.pop("prompt", "Hi.")
    opts = GenerationOptions(**{"max_tokens": 8, **case})
    for call, url in ((generate_grpc, limits_server.grpc_url), (generate_http, limits_server.http_url)):
        with pytest.raises(TritonError) as failure:
            call(url, prompt, opts)
        message = str(failure.value)
        assert message.startswith(field) and detail in message, message
    assert generate_grpc(limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=8)).text == reference.text("Hi.", 8)


def test_beyond_the_sequence_limit_a_request_queues_and_a_full_queue_refuses_with_busy(limits_server, reference):
    # fixed:fault_hang: each request's first step waits the 3 s deadline, holding its slot
    opts = GenerationOptions(max_tokens=8, policy="fixed:fault_hang")
    with ThreadPoolExecutor(max_workers=3) as pool:
        holders = [pool.submit(generate_grpc, limits_server.grpc_url, "Hi.", opts) for _ in range(2)]
        time.sleep(1.0)
        queued = pool.submit(generate_grpc, limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=8))
        time.sleep(0.5)
        assert not queued.done()  # both slots are held: it waits in the queue (max_queue_size 1) ...
        with pytest.raises(TritonError) as failure:  # ... and the queue is full: refused at once
            generate_grpc(limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=8))
        held = [h.result(60) for h in holders]
        waited = queued.result(60)  # ... and is served once a slot frees
    message = str(failure.value)
    assert message.startswith("server busy") and "max_concurrent_sequences" in message, message
    assert parse_retry_after(message) is not None, message
    assert all(r.text == reference.text("Hi.", 8) for r in held)
    assert waited.text == reference.text("Hi.", 8)
    wait_idle(limits_server)
    assert generate_grpc(limits_server.grpc_url, "Hi.", GenerationOptions(max_tokens=8)).text == reference.text("Hi.", 8)


BAD_SELECTORS = [
    (dict(arms=["../../etc/passwd"]), "arms"),
    (dict(arms=["fault_raise"]), "arms"),  # exists in the code base, not in this deployment
    (dict(arms=["rest"]), "arms"),  # likewise: REST is not configured here
    (dict(policy="fixed:/tmp/evil.py"), "arms"),
    (dict(policy="__import__('os').system('true')"), "policy"),
    (dict(reward="file:///etc/passwd"), "reward"),
]


@pytest.mark.parametrize("case, field", BAD_SELECTORS)
def test_no_request_input_selects_a_path_a_model_or_code(limits_server, case, field):
    with pytest.raises(TritonError) as failure:
        generate_http(limits_server.http_url, "Hi.", GenerationOptions(max_tokens=8, **case))
    assert str(failure.value).startswith(field), str(failure.value)


def test_configuration_names_in_a_request_body_are_ignored(limits_server, reference):
    body = {"text_input": "Hi.", "max_tokens": 8, "target_name": "no_such_model", "rest_datastore": "/tmp/x",
            "drafters": "fault_raise", "tokenizer_dir": "/etc", "max_tokens_limit": "100000"}
    request = urllib.request.Request(
        f"http://{limits_server.http_url}/v2/models/banditspec/generate",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        answer = json.loads(resp.read())
    assert answer["text_output"] == reference.text("Hi.", 8)
