"""``banditspec bench --workload multiturn``: real conversations through the OpenAI chat API of a real
tritonserver (started by the command), plain decoding against the default, greedy."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # a benchmark command end to end


def test_multiturn_bench_plays_each_conversation_with_each_method_and_stays_lossless(tmp_path):
    from banditspec_client.cli import main

    out = tmp_path / "mt"
    assert main(["bench", "--workload", "multiturn", "--prompts", "2", "--turns", "2", "--max-tokens", "12",
                 "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    payload = json.loads((out / "results.json").read_text())
    assert payload["setup"]["split"].startswith("heldout") and payload["setup"]["decoding"] == "greedy"
    records = payload["records"]
    assert sorted({(r["method"], r["turn"]) for r in records}) == [
        ("costaware", 1), ("costaware", 2), ("vanilla", 1), ("vanilla", 2)]
    by_key = {(r["conversation_id"], r["turn"], r["method"]): r for r in records}
    for (conversation, turn, method), r in by_key.items():
        assert r["generated_tokens"] > 0 and r["ttft_seconds"] <= r["seconds"]
        # the default's answers, hence its histories, are plain decoding's
        assert r["output_digest"] == by_key[(conversation, turn, "vanilla")]["output_digest"]
        if turn == 2:
            first = by_key[(conversation, 1, method)]
            # the whole conversation is the prompt; only its new part is past the cached history
            assert r["prompt_tokens"] > first["prompt_tokens"] + r["new_tokens"] - 1
            assert r["control_ttft_seconds"] is not None and r["control_new_tokens"] > 0
        else:
            assert r["new_tokens"] == r["prompt_tokens"] and r["control_ttft_seconds"] is None
    report = (out / "results.md").read_text()
    assert "Lossless: every method's answer equals vanilla's on every turn" in report
    assert "TTFT / control" in report
    assert (out / "turns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
