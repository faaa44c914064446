"""Batched verification through a real tritonserver: concurrent requests with different
speculation lengths share the target's forward passes (the controller gathers their steps
into one BLS request) and each still gets exactly its solo output; the server-wide gamma controller caps
what every request drafts."""

from __future__ import annotations

import threading

import pytest
from banditspec_client.prometheus_text import metric_total, metric_value, scrape_metrics
from banditspec_client.triton_client import GenerationOptions, generate_grpc

pytestmark = pytest.mark.integration

EDIT_PROMPTS = [
    "Add type hints to this function and keep the body unchanged:\n\n"
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n        return high\n    return value\n",
    "Rename the variable total to result in this function and show the whole function:\n\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n",
    "Add a docstring to this function and repeat it in full:\n\n"
    "def is_even(number):\n    return number % 2 == 0\n",
    "Rewrite this loop with enumerate and show the full function:\n\n"
    "def show(items):\n    for i in range(len(items)):\n        print(i, items[i])\n",
]
POLICIES = ["vanilla", "fixed:pld@1", "fixed:pld@2", "fixed:pld@4"]  # gamma 0, 1, 2, 4 in flight together
MAX_TOKENS = 40
TARGET_COUNTERS = ("verify_batches", "verified_sequences", "mixed_draft_batches", "draft_tokens")


def _target_counters(series) -> dict[str, float]:
    return {name: metric_total(series, f"nv_banditspec_target_{name}") for name in TARGET_COUNTERS}


def _concurrently(url: str, jobs: list[tuple[str, GenerationOptions]]) -> list:
    results: list = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def worker(i: int) -> None:
        start.wait()
        try:
            results[i] = generate_grpc(url, jobs[i][0], jobs[i][1])
        except Exception as exc:  # reported by the assertions below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def test_concurrent_mixed_gamma_requests_share_forward_passes_and_equal_their_solo_runs(server, local_vanilla):
    series = scrape_metrics(server.metrics_port)
    before = _target_counters(series)
    passes_before = metric_value(series, "nv_banditspec_target_forward_passes")
    gathered_before = [metric_total(series, f"nv_banditspec_target_gathered_{n}", model="banditspec") for n in ("requests", "sequences")]
    jobs = [(p, GenerationOptions(max_tokens=MAX_TOKENS, policy=pol, max_draft_len=4)) for p, pol in zip(EDIT_PROMPTS, POLICIES)]
    results = _concurrently(server.grpc_url, jobs)
    series = scrape_metrics(server.metrics_port)
    after = _target_counters(series)
    for (prompt, opts), result in zip(jobs, results):
        assert not isinstance(result, Exception), result
        assert result.text == local_vanilla(prompt, MAX_TOKENS), f"{opts.policy} differs on {prompt!r}"
    assert max(max(r.stats["drafted"]) for r in results) >= 2, "no request drafted: the gamma mix was not exercised"
    delta = {name: after[name] - before[name] for name in TARGET_COUNTERS}
    assert delta["verified_sequences"] == sum(r.stats["steps"] for r in results)
    assert delta["verified_sequences"] > delta["verify_batches"], f"no batch held two sequences: {delta}"
    assert delta["mixed_draft_batches"] >= 1, f"no batch mixed draft lengths: {delta}"
    assert metric_total(series, "nv_banditspec_target_largest_batch") >= 2
    # the controller gathered its sequences' steps into requests of several rows (engine/gather.py)
    requests, sequences = (metric_total(series, f"nv_banditspec_target_gathered_{n}", model="banditspec") - b
                           for n, b in zip(("requests", "sequences"), gathered_before))
    assert sequences == sum(r.stats["steps"] for r in results) and requests < sequences, (requests, sequences)
    passes_after = metric_value(series, "nv_banditspec_target_forward_passes")
    if passes_before is not None and passes_after is not None:  # the engine's own count: one pass per batch
        assert passes_after - passes_before == delta["verify_batches"]


@pytest.fixture(scope="module")
def ucb_server():
    """A tiny-model server whose banditspec model caps every request with the ucb controller."""
    from banditspec.paths import cache_dir
    from banditspec_server.serve import TritonServer

    overrides = {"banditspec": {"gamma_controller": "ucb", "gamma_controller_max": "2", "drafters": "pld", "max_concurrent_sequences": "4"}}
    srv = TritonServer(
        model="tiny", http_port=0, grpc_port=0, metrics_port=0,
        overrides=overrides, log_path=cache_dir() / "integration-ucb-tritonserver.log",
    )
    with srv:
        yield srv


@pytest.fixture(scope="module")
def tiny_vanilla():
    from banditspec.config import GenerationRequest
    from banditspec.decoding.session import run_to_completion
    from banditspec.serving.runtime import load_local
    from banditspec.text import prompt_ids

    stack = load_local("tiny", arms=("pld",))

    def run(prompt: str, max_tokens: int) -> str:
        ids = prompt_ids(stack.tokenizer, prompt, chat=True)
        result = run_to_completion(stack.engine, stack.decoder.start(GenerationRequest(ids, max_tokens, policy="vanilla")))
        return stack.tokenizer.decode(result.token_ids, skip_special_tokens=True)

    return run


def test_the_ucb_controller_caps_every_request_and_stays_lossless(ucb_server, tiny_vanilla):
    jobs = [(p, GenerationOptions(max_tokens=MAX_TOKENS, policy="fixed:pld@4", max_draft_len=4)) for p in EDIT_PROMPTS]
    results = _concurrently(ucb_server.grpc_url, jobs)
    drafted = []
    for (prompt, _), result in zip(jobs, results):
        assert not isinstance(result, Exception), result
        assert result.text == tiny_vanilla(prompt, MAX_TOKENS)
        drafted += result.stats["drafted"]
    assert max(drafted) <= 2, "a request drafted beyond the controller's largest gamma"
    assert max(drafted) >= 1, "nothing was drafted: the cap was not exercised"
