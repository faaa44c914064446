"""``banditspec bench-load``'s pure parts: the closed loop on a fake client (failures are
counted, never fatal), the per-block statistics, the losslessness check, the method and
prompt-file parsing, and the report (Markdown and figures)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from banditspec_client.bench.concurrency.command import (
    add_arguments,
    load_prompts,
    mark_mismatches,
    parse_methods,
    read_prompts_file,
    rotated,
)
from banditspec_client.bench.concurrency.load import BlockResult, Client, RequestOutcome, percentile, run_block
from banditspec_client.bench.concurrency.summary import markdown, ratios, write_report
from banditspec_client.triton_client import GenerationOptions


class FakeClient(Client):
    """Answers ``prompt.upper()`` in ``tokens`` tokens after ``delay`` s, the first text after
    ``first`` s; refuses every request beyond ``capacity`` in flight (as a full server does)."""

    def __init__(self, capacity: int = 100, delay: float = 0.02, first: float = 0.005, tokens: int = 5):
        self.capacity, self.delay, self.first, self.tokens = capacity, delay, first, tokens
        self.in_flight = 0
        self.most = 0
        self.order: list[tuple[int, str]] = []

    async def request(self, prompt, opts, outcome, began):
        if self.in_flight >= self.capacity:
            raise ConnectionError("server busy")
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.order.append((outcome.stream, prompt))
        try:
            await asyncio.sleep(self.first)
            outcome.ttft_s = self.first
            await asyncio.sleep(self.delay - self.first)
            outcome.output_tokens, outcome.text = self.tokens, prompt.upper()
        finally:
            self.in_flight -= 1


PROMPTS = ["a", "b", "c", "d", "e"]


def block(client: Client, concurrency: int, requests: int = 2, method: str = "m") -> BlockResult:
    return asyncio.run(run_block(client, transport="triton", method=method, prompts=PROMPTS,
                                 prompt_indices=list(range(len(PROMPTS))), concurrency=concurrency,
                                 requests_per_stream=requests, opts=GenerationOptions(max_tokens=5)))


def test_a_closed_loop_keeps_each_stream_to_one_request_in_flight():
    client = FakeClient()
    result = block(client, 3, requests=2)
    assert len(result.outcomes) == 6 and not result.failed and client.most == 3
    # stream s sends prompts s, s + 3 (cycled)
    assert sorted(client.order) == [(0, "a"), (0, "d"), (1, "b"), (1, "e"), (2, "a"), (2, "c")]
    row = result.summary()
    assert row["output_tokens"] == 30 and row["requests"] == 6 and row["failed"] == 0
    assert row["output_tokens_per_s"] == pytest.approx(30 / result.wall_s, rel=1e-3)
    assert row["ttft_p50_s"] == pytest.approx(0.005) and row["latency_p50_s"] >= 0.02
    assert 0 <= row["generator_cpu_share"] < 5


def test_refused_requests_are_counted_and_the_streams_go_on():
    client = FakeClient(capacity=2)
    result = block(client, 4, requests=2)
    row = result.summary()
    assert row["requests"] == 8 and row["failed"] == 4  # two at a time got in, twice
    assert row["errors"] == ["triton: ConnectionError: server busy"]
    assert row["output_tokens"] == 20


def test_inter_token_latency_is_the_time_after_the_first_token_per_further_token():
    outcome = RequestOutcome(0, 0, 0.0, latency_s=1.0, ttft_s=0.2, output_tokens=5)
    assert outcome.itl_s == pytest.approx(0.2)
    assert RequestOutcome(0, 0, 0.0, latency_s=1.0, ttft_s=0.2, output_tokens=1).itl_s is None
    assert percentile([], 50) is None and percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_outputs_that_differ_from_plain_decodings_are_counted_per_block():
    def made(method: str, texts: dict[int, str]) -> BlockResult:
        result = BlockResult("triton", method, 2, 1.0, 0.0)
        result.outcomes = [RequestOutcome(0, i, 0.0, text=t, output_tokens=3) for i, t in texts.items()]
        return result

    blocks = [made("vanilla", {0: "x", 1: "y"}), made("pld@4", {0: "x", 1: "z"}), made("default", {0: "x", 2: "q"})]
    assert mark_mismatches(blocks, 0.0) == {0: 0, 1: 1, 2: 0}
    assert mark_mismatches(blocks, 0.7) == {}  # sampled outputs are not compared


def test_methods_and_their_policies():
    methods = parse_methods("vanilla,pld@4,default,costaware,eagle")
    assert [(m.name, m.policy) for m in methods] == [("vanilla", "vanilla"), ("pld@4", "fixed:pld@4"),
                                                      ("default", None), ("costaware", "costaware"),
                                                      ("eagle", "fixed:eagle")]
    for bad in ("warp@2", "pld@x", "vanilla,vanilla", ""):
        with pytest.raises(SystemExit):
            parse_methods(bad)
    assert [m.name for m in rotated(methods[:3], 1)] == ["pld@4", "default", "vanilla"]


def test_prompts_files(tmp_path: Path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "one"}\n"two"\n\n{"prompt": "three"}\n')
    assert read_prompts_file(jsonl) == ["one", "two", "three"]
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\nsecond\n")
    assert read_prompts_file(plain) == ["first prompt", "second"]
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(SystemExit, match="bad.jsonl:1"):
        read_prompts_file(tmp_path / "bad.jsonl")


def report_of(blocks: list[BlockResult]) -> dict:
    rows = []
    for b in blocks:
        row = b.summary()
        row["mismatches"] = 0
        rows.append(row)
    return {
        "command": "banditspec bench-load --concurrency 1,2",
        "machine": {"cpu_model": "Test CPU", "logical_cpus": 2, "platform": "x"},
        "settings": {"concurrency": [1, 2], "methods": ["vanilla", "default"], "transports": ["triton"],
                     "prompts": 5, "prompt_source": "test", "max_tokens": 5, "requests_per_stream": 2,
                     "temperature": 0.0, "seed": None, "max_draft_len": "8", "torch_threads": 1,
                     "server_params": {}, "model": "tiny"},
        "generator": {"mean_cpu_share": 0.05, "max_cpu_share": 0.1},
        "rows": rows,
    }


def test_workload_prompts_come_from_the_held_out_split_unless_told_and_the_report_says_which():
    import argparse

    from banditspec_client.bench.workloads import load_workload

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    prompts, source = load_prompts(parser.parse_args(["--prompts", "6"]))
    assert prompts == [p.text for p in load_workload("mixed", 6, split="heldout")]
    assert "split heldout" in source and "splits.json" in source
    tuned, source = load_prompts(parser.parse_args(["--prompts", "6", "--split", "tune"]))
    assert tuned == [p.text for p in load_workload("mixed", 6, split="tune")] and "split tune" in source
    assert not set(tuned) & set(prompts)


def test_the_report_states_the_settings_and_has_a_row_per_block(tmp_path: Path):
    blocks = [block(FakeClient(delay=d), level, method=m) for level in (1, 2) for m, d in (("vanilla", 0.03), ("default", 0.02))]
    report = report_of(blocks)
    text = markdown(report)
    for fact in ("Test CPU", "2 logical CPUs", "torch threads: 1", "prompts: 5", "output tokens per request: 5",
                 "L (max_draft_len): 8", "temperature: 0.0", "concurrency: 1, 2", "5.0 % of one core"):
        assert fact in text
    assert text.count("| default |") == 2 and text.count("| vanilla |") == 2
    r = ratios(report["rows"])
    assert r[("triton", 1, "vanilla")] == 1.0 and r[("triton", 1, "default")] > 1.0
    written = write_report(report, tmp_path)
    assert [p.name for p in written] == ["results.md", "load-triton.png"] and written[1].stat().st_size > 10_000
    json.dumps(report)  # the results JSON


def test_methods_that_learn_from_past_outputs_get_their_own_controller_model():
    from banditspec_client.bench.concurrency.command import parse_methods

    names = {m.name: m.model_name for m in parse_methods("vanilla,default,pld@4,suffix@4,costaware,eagle@4")}
    assert names == {"vanilla": "banditspec", "pld@4": "banditspec", "eagle@4": "banditspec",
                     "default": "banditspec_default", "suffix@4": "banditspec_suffix_4",
                     "costaware": "banditspec_costaware"}
