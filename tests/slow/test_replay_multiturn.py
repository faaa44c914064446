"""``banditspec replay --workloads multiturn``: conversations recorded with the target's own greedy
answers as history (real SmolLM2), replayed per turn index, every replayed output exact."""

from __future__ import annotations

import argparse
import json

import pytest

pytestmark = pytest.mark.slow


def _args(tmp_path, **kw) -> argparse.Namespace:
    from banditspec_client.replay import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--workloads", "multiturn", "--prompts", "2", "--turns", "2", "--max-tokens", "10", "--costs", "steep",
            "--drafters", "pld,suffix,copy", "--threads", "1", "--out", str(tmp_path / "replay")]
    return parser.parse_args(argv + [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", str(v))])


def test_each_turns_prompt_is_the_conversation_so_far_with_the_targets_own_answers(tmp_path):
    from banditspec.engine.models import load_tokenizer
    from banditspec_client.bench.workloads import load_conversations
    from banditspec_client.replay import conversation_prompts

    args = _args(tmp_path, split="heldout")
    tokenizer = load_tokenizer("smollm2")
    rows = conversation_prompts(args, tokenizer)
    conversations = load_conversations(2, turns=2, split="heldout")
    assert [kind for kind, _, _ in rows] == ["multiturn/turn1", "multiturn/turn2"] * 2
    for c, conversation in enumerate(conversations):
        (_, first, answer), (_, second, _) = rows[2 * c], rows[2 * c + 1]
        assert second[: len(first)] == first  # turn 2 extends turn 1's prompt
        text = tokenizer.decode(second[len(first):])
        own = tokenizer.decode([t for t in answer if t != tokenizer.eos_token_id], skip_special_tokens=True)
        assert text.startswith(own) and conversation.turns[1] in text


def test_the_multiturn_replay_reports_rows_per_turn_and_exact_outputs(tmp_path):
    from banditspec_client.replay import run

    args = _args(tmp_path)
    assert run(args) == 0
    report = (tmp_path / "replay" / "results.md").read_text()
    assert "| multiturn/turn1 |" in report and "| multiturn/turn2 |" in report
    assert "split tune" in report and "greedy (temperature 0)" in report
    assert "Every replayed output identical to plain decoding: True." in report
    setup = json.loads((tmp_path / "replay" / "results.json").read_text())["setup"]
    assert setup == {"split": "tune", "temperature": 0.0, "workloads": "multiturn"}
