"""Against a real tritonserver: every path a client uses, lossless, streaming, bad input,
cancellation, concurrency."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from banditspec_client.triton_client import GenerationOptions, TritonError, generate_grpc, generate_http

pytestmark = pytest.mark.integration

PROMPTS = [
    "Rewrite this function with type hints and keep the body unchanged:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative size')\n    return width * height\n",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What are two good habits for writing clean code?",
]
MAX_TOKENS = 48
POLICIES = ["vanilla", "ucbspec", "exp3spec", "fixed:pld", "fixed:suffix", "fixed:rest", "fixed:eagle"]


@pytest.mark.parametrize("policy", POLICIES)
def test_grpc_output_equals_in_process_vanilla(server, local_vanilla, policy):
    drafted = 0
    for prompt in PROMPTS:
        result = generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, policy=policy))
        assert result.text == local_vanilla(prompt, MAX_TOKENS), f"first differing prompt: {prompt!r}"
        assert result.responses == 1
        assert result.stats["steps"] >= 1 and result.stats["generated_tokens"] <= MAX_TOKENS
        assert not result.stats["dropped_arms"], result.stats["dropped_arms"]
        drafted += sum(result.stats["drafted"])
    assert (drafted > 0) == (policy != "vanilla"), "the arm was served and really drafted"


def test_the_eagle_arm_drafts_in_the_eagle_model_through_bls(server, local_vanilla):
    """fixed:eagle and ucbspec call the `eagle` model (Triton's own counters move), lossless;
    plain decoding does not call it."""
    from banditspec_client.prometheus_text import metric_total, scrape_metrics

    def eagle_calls() -> float:
        return metric_total(scrape_metrics(server.metrics_port), "nv_inference_count", model="eagle")

    prompt = PROMPTS[2]
    for policy, called in (("vanilla", False), ("fixed:eagle", True), ("ucbspec", True)):
        before = eagle_calls()
        result = generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, policy=policy))
        assert result.text == local_vanilla(prompt, MAX_TOKENS)
        pulls = sum(1 for arm in result.stats["arms"] if arm.startswith("eagle"))
        assert (eagle_calls() > before) == called, policy
        if policy == "fixed:eagle":  # at most one call per pull, plus the one that ends the sequence
            assert 2 <= eagle_calls() - before <= pulls + 1


def test_streaming_sends_several_responses_that_concatenate_to_the_text(server, local_vanilla):
    prompt = PROMPTS[0]
    result = generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, stream=True))
    assert result.responses > 1
    assert result.text == local_vanilla(prompt, MAX_TOKENS)
    assert result.stats["mean_accepted_tokens"] >= 1.0


@pytest.mark.parametrize("stream", [False, True])
def test_http_generate_endpoints(server, local_vanilla, stream):
    prompt = PROMPTS[1]
    result = generate_http(server.http_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, stream=stream, policy="ucbspec"))
    assert result.text == local_vanilla(prompt, MAX_TOKENS)
    assert (result.responses > 1) == stream


def test_two_requests_in_flight_both_complete_correctly(server, local_vanilla):
    out = {}

    def worker(i, prompt, policy):
        out[i] = generate_grpc(server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, policy=policy)).text

    threads = [threading.Thread(target=worker, args=(i, PROMPTS[i], p)) for i, p in enumerate(["ucbspec", "fixed:pld"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert out[0] == local_vanilla(PROMPTS[0], MAX_TOKENS)
    assert out[1] == local_vanilla(PROMPTS[1], MAX_TOKENS)


def _http_error(server, body) -> tuple[int, str]:
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/banditspec/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, timeout=120).read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()).get("error", "")
    return 200, ""


BAD_HTTP = [
    ({"text_input": "", "max_tokens": 8}, "text_input"),
    ({"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": -4}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": 100000}, "max_tokens"),
    ({"text_input": "hi", "max_tokens": 8, "policy": "best"}, "policy"),
    ({"text_input": "hi", "max_tokens": 8, "arms": ["pld", "magic"]}, "arms"),
    ({"text_input": "hi", "max_tokens": 8, "max_draft_len": 99}, "max_draft_len"),
    ({"text_input": "hi", "max_tokens": 8, "policy": "ucbspec", "arms": ["pld@9"]}, "arms"),
    ({"text_input": "hi", "max_tokens": 8, "temperature": -1.0}, "temperature"),
    ({"text_input": "nul \u0000 here", "max_tokens": 8}, "text_input"),
    ({"text_input": "word " * 3000, "max_tokens": 8}, "text_input"),
    ({"text_input": "hi", "max_tokens": 1025, "policy": "vanilla"}, "max_tokens"),
]


@pytest.mark.parametrize("body, field", BAD_HTTP)
def test_bad_input_is_rejected_naming_the_field_then_a_good_request_works(server, body, field):
    code, message = _http_error(server, body)
    assert code == 400, message
    assert message.startswith(field), message
    assert "Traceback" not in message and ".py" not in message
    ok = generate_http(server.http_url, "Say hi.", GenerationOptions(max_tokens=4))
    assert ok.stats["generated_tokens"] >= 1


def test_missing_required_input_is_rejected_by_triton(server):
    code, message = _http_error(server, {"text_input": "hi"})
    assert code == 400 and "max_tokens" in message


def test_non_utf8_and_wrong_dtype_over_grpc(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    errors = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"\xff\xfe\xfd"]], dtype=object))
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[8]], dtype=np.int32))
    client.async_stream_infer("banditspec", [text, max_tokens])
    client.stop_stream()
    client.close()
    assert errors and errors[0] is not None and "text_input" in str(errors[0])


def test_cancelled_stream_stops_and_frees_its_slot(server, local_vanilla):
    # max_concurrent_sequences is 4: cancel 4 streams, then 4 concurrent requests must all be admitted.
    for _ in range(4):
        partial = generate_grpc(
            server.grpc_url, PROMPTS[2], GenerationOptions(max_tokens=400, stream=True, policy="vanilla"), cancel_after=2
        )
        assert partial.responses == 2
    time.sleep(1.0)  # the server sees a cancellation at its next step boundary
    results = {}

    def worker(i):
        try:
            results[i] = generate_grpc(server.grpc_url, PROMPTS[2], GenerationOptions(max_tokens=16, policy="vanilla")).text
        except TritonError as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r == local_vanilla(PROMPTS[2], 16) for r in results.values()), results


@pytest.fixture(scope="module")
def eagle3_server():
    """A second server whose `eagle` arm is the shipped EAGLE-3 head (both models told)."""
    from banditspec.paths import cache_dir
    from banditspec_server.serve import TritonServer

    log = cache_dir() / "integration-tritonserver-eagle3.log"
    srv = TritonServer(
        model="smollm2", http_port=0, grpc_port=0, metrics_port=0, log_path=log,
        overrides={"banditspec": {"eagle_head": "eagle3", "max_concurrent_sequences": "2"},
                   "eagle": {"eagle_head": "eagle3"}},
    )
    with srv:
        yield srv


@pytest.mark.long  # an optional head with its own server; the default head runs through Triton above
def test_the_eagle3_head_through_triton_is_lossless_and_drafts(eagle3_server, local_vanilla):
    """EAGLE-3 reads three target layers (hidden_states_layers through the target model) and
    drafts in the `eagle` model: outputs equal plain decoding, and its drafts are accepted."""
    accepted = 0
    for prompt in PROMPTS:
        result = generate_grpc(eagle3_server.grpc_url, prompt, GenerationOptions(max_tokens=MAX_TOKENS, policy="fixed:eagle"))
        assert result.text == local_vanilla(prompt, MAX_TOKENS), f"first differing prompt: {prompt!r}"
        assert not result.stats["dropped_arms"], result.stats["dropped_arms"]
        accepted += sum(result.stats["accepted"])
    assert accepted > 0, "the EAGLE-3 head drafted and some drafts were accepted"
