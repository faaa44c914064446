"""Conversations, sampling and the best fixed arm in the benchmarks: the multi-turn workload, its
ChatML rendering (history = the model's own answers, whole conversation in the prompt), the per-turn
summary, ``--temperature`` in bench and replay, and the fixed arms bench adds for adaptive methods."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from banditspec.errors import BanditSpecValidationError
from banditspec_client.bench import multiturn
from banditspec_client.bench.compare.command import check_temperature, with_fixed_arms
from banditspec_client.bench.compare.summary import markdown_report, summarize_workload
from banditspec_client.bench.methods import RunRecord, digest, parse_methods
from banditspec_client.bench.multiturn import (
    TurnRecord,
    computed_tokens,
    first_call_ms,
    lossless_mismatches,
    plot_turns,
    summarize_turns,
)
from banditspec_client.bench.workloads import Conversation, load_conversations


@pytest.fixture(scope="module")
def tokenizer():
    from banditspec.engine.models import load_tokenizer

    return load_tokenizer("smollm2")


# -- the workload --------------------------------------------------------------------------
def test_conversations_are_fixed_lists_of_user_turns_whose_shorter_runs_are_prefixes():
    six = load_conversations(6, split="heldout")
    assert len(six) == 6 and all(isinstance(c, Conversation) and len(c.turns) == 3 for c in six)
    assert load_conversations(3, split="heldout") == six[:3]
    assert all(t.strip() == t and t for c in six for t in c.turns)
    two = load_conversations(4, turns=2, split="tune")
    assert all(len(c.turns) == 2 for c in two)
    with pytest.raises(BanditSpecValidationError) as err:
        load_conversations(2, turns=1)
    assert err.value.field == "turns"


def test_conversation_turns_are_the_recorded_human_turns_in_order():
    from banditspec.datasets import sharegpt_conversations

    for conversation in load_conversations(5, split="tune"):
        recorded = sharegpt_conversations()[int(conversation.conversation_id.partition("/")[2])]
        humans = [text.strip() for role, text in recorded if role == "human"]
        assert list(conversation.turns) == humans[: len(conversation.turns)]


# -- ChatML history through the OpenAI API's renderer -----------------------------------------
def test_a_multi_turn_chat_renders_as_chatml_history_that_extends_the_previous_request(tokenizer):
    from banditspec.text import render_chat, text_ids
    from banditspec_server.openai_api.app import Message, chat_prompt

    user1, answer1, user2 = "Write a function that adds two numbers.", "def add(a, b):\n    return a + b", "Now subtract."
    messages = [Message(role="user", content=user1), Message(role="assistant", content=answer1),
                Message(role="user", content=user2)]
    prompt = chat_prompt(tokenizer, messages)
    # ChatML, each turn in order, the assistant's turn opened at the end
    assert prompt.index(f"<|im_start|>user\n{user1}<|im_end|>") < prompt.index(
        f"<|im_start|>assistant\n{answer1}<|im_end|>") < prompt.index(f"<|im_start|>user\n{user2}<|im_end|>")
    assert prompt.endswith("<|im_start|>assistant\n")
    # the token sequence extends turn 1's prompt followed by its answer: the prefix cache can reuse it
    first = text_ids(tokenizer, chat_prompt(tokenizer, messages[:1]))
    answered = text_ids(tokenizer, first_prompt := render_chat(tokenizer, [{"role": "user", "content": user1}]))
    assert answered == first
    ids = text_ids(tokenizer, prompt)
    assert ids[: len(first)] == first
    answer_ids = text_ids(tokenizer, answer1)
    assert ids[len(first): len(first) + len(answer_ids)] == answer_ids
    assert first_prompt in prompt


def test_the_drafters_see_the_whole_history(tokenizer):
    """A prompt-lookup drafter started on turn 2's prompt proposes the continuation of the
    model's turn-1 answer once the new answer starts repeating it: the history is in its context."""
    from banditspec.drafters.registry import build_drafters
    from banditspec.text import render_chat, text_ids

    answer = "The quick brown fox jumps over the lazy dog near the quiet river bank."
    history = [{"role": "user", "content": "Say something."}, {"role": "assistant", "content": answer},
               {"role": "user", "content": "Say it again."}]
    prompt = text_ids(tokenizer, render_chat(tokenizer, history))
    answer_ids = text_ids(tokenizer, answer)
    for name in ("pld", "suffix", "copy"):
        session = build_drafters([name], tokenizer)[name].start(np.asarray(prompt, dtype=np.int32))
        session.observe(np.asarray(answer_ids[:4], dtype=np.int32))
        draft = session.propose(4)
        assert [int(t) for t in draft.token_ids] == answer_ids[4:8], name


# -- per-turn summary ---------------------------------------------------------------------------
def _turn(conv: str, turn: int, method: str, tokens: int, seconds: float, ttft: float, out: str = "same",
          control: float | None = None) -> TurnRecord:
    return TurnRecord(conv, turn, method, prompt_tokens=40 * turn, new_tokens=40 if turn == 1 else 20,
                      generated_tokens=tokens, seconds=seconds, ttft_seconds=ttft, steps=tokens // 2,
                      output_digest=digest(out), control_ttft_seconds=control,
                      control_new_tokens=None if control is None else 18)


def test_turn_summary_pools_per_turn_and_compares_ttft_with_the_control():
    records = [
        _turn("c1", 1, "vanilla", 32, 2.0, 0.2), _turn("c1", 2, "vanilla", 32, 2.0, 0.1, control=0.1),
        _turn("c1", 1, "costaware", 32, 1.0, 0.2), _turn("c1", 2, "costaware", 32, 0.5, 0.12, control=0.1),
        _turn("c2", 1, "vanilla", 32, 2.0, 0.2),  # costaware never ran c2: left out
    ]
    rows = {(r.method, r.turn): r for r in summarize_turns(records, ["vanilla", "costaware"])}
    assert rows[("vanilla", 1)].requests == 1
    assert rows[("costaware", 1)].speedup == pytest.approx(2.0)
    assert rows[("costaware", 2)].speedup == pytest.approx(4.0)
    assert rows[("costaware", 2)].ttft_over_control == pytest.approx(1.2)
    assert rows[("vanilla", 1)].ttft_over_control is None
    assert rows[("costaware", 2)].mean_new_tokens == 20 and rows[("costaware", 2)].mean_control_new_tokens == 18


def test_the_first_call_is_read_from_the_stats_and_averaged_only_when_every_turn_reports_it(tmp_path):
    assert first_call_ms({"verify_ms": [81.5, 40.0]}) == 81.5
    assert first_call_ms({}) is None and first_call_ms({"verify_ms": []}) is None
    a = _turn("c1", 2, "vanilla", 32, 2.0, 0.1, control=0.1)
    b = _turn("c2", 2, "vanilla", 32, 2.0, 0.1, control=0.1)
    a.first_call_ms, a.control_first_call_ms, b.first_call_ms, b.control_first_call_ms = 90.0, 60.0, 70.0, 50.0
    first = [_turn(c, 1, "vanilla", 32, 2.0, 0.2) for c in ("c1", "c2")]
    rows = {(r.method, r.turn): r for r in summarize_turns([*first, a, b], ["vanilla"])}
    assert rows[("vanilla", 2)].mean_first_call_ms == pytest.approx(80.0)
    assert rows[("vanilla", 2)].mean_control_first_call_ms == pytest.approx(55.0)
    assert rows[("vanilla", 1)].mean_first_call_ms is None  # not reported for those turns
    report = multiturn.markdown_report(list(rows.values()), [*first, a, b], title="t", command="c", setup={},
                                       skipped={}, greedy=True)
    assert "| vanilla | 2 | 2 |" in report and "| 80 | 55 |" in report
    png = plot_turns(list(rows.values()), tmp_path / "turns.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_new_tokens_are_what_the_target_computed_where_it_says():
    assert computed_tokens(120, {"cached_prompt_tokens": 98}) == 22
    assert computed_tokens(120, {}) is None and computed_tokens(120, {"cached_prompt_tokens": True}) is None


def test_a_turn_whose_answer_differs_from_vanillas_is_flagged():
    records = [_turn("c1", 1, "vanilla", 8, 1.0, 0.1), _turn("c1", 1, "costaware", 8, 1.0, 0.1),
               _turn("c1", 2, "vanilla", 8, 1.0, 0.1), _turn("c1", 2, "costaware", 8, 1.0, 0.1, out="other")]
    assert lossless_mismatches(records) == [("c1", 2, "costaware")]


# -- sampling and the best fixed arm in bench -----------------------------------------------------
def test_bench_runs_every_fixed_arm_an_adaptive_method_may_choose():
    methods, added = with_fixed_arms(parse_methods("vanilla,pld,suffix,copy,costaware"),
                                     ("pld", "suffix", "rest", "eagle", "copy"))
    assert added == ["rest", "eagle"]
    assert [m.name for m in methods] == ["vanilla", "pld", "suffix", "copy", "rest", "eagle", "costaware"]
    plain, none_added = with_fixed_arms(parse_methods("vanilla,pld"), ("pld", "rest"))
    assert none_added == [] and [m.name for m in plain] == ["vanilla", "pld"]


def test_the_best_fixed_arm_is_chosen_among_eagle_and_rest_too():
    def rec(method: str, seconds: float) -> RunRecord:
        return RunRecord("chat", "chat", "p1", method, 40, seconds, 20, digest("same"))

    records = [rec("vanilla", 4.0), rec("suffix", 2.0), rec("eagle", 1.5), rec("rest", 3.0), rec("costaware", 1.6)]
    s = summarize_workload("chat", records, ["vanilla", "suffix", "eagle", "rest", "costaware"])
    assert s.best_fixed == "eagle"
    assert "best fixed arm: eagle, among suffix, eagle, rest" in markdown_report(
        [s], title="t", command="c", setup={}, skipped={})


def test_sampled_runs_are_not_compared_token_by_token():
    records = [RunRecord("chat", "chat", "p1", "vanilla", 8, 1.0, 8, digest("a")),
               RunRecord("chat", "chat", "p1", "pld", 8, 1.0, 4, digest("b"))]
    assert summarize_workload("chat", records, ["vanilla", "pld"]).lossless_mismatches == [("p1", "pld")]
    sampled = summarize_workload("chat", records, ["vanilla", "pld"], greedy=False)
    assert sampled.lossless_mismatches == []
    report = markdown_report([sampled], title="t", command="c", setup={}, skipped={})
    assert "Sampled" in report and "Lossless" not in report


@pytest.mark.parametrize("bad", [-0.1, 2.5, True])
def test_bench_refuses_a_bad_temperature_naming_it(bad):
    with pytest.raises(BanditSpecValidationError) as err:
        check_temperature(bad)
    assert err.value.field == "temperature"
    assert check_temperature(0.7) == 0.7


def test_bench_runs_multiturn_alone():
    from banditspec_client.cli import main

    assert main(["bench", "--workload", "multiturn,chat", "--prompts", "1"]) == 2


# -- replay: greedy only, splits, conversations ------------------------------------------------------
def _replay_args(**kw) -> argparse.Namespace:
    base = dict(prompts_file=None, workloads="code,chat", prompts=2, skip=0, split="tune", temperature=0.0)
    return argparse.Namespace(**{**base, **kw})


def test_replay_refuses_sampling_and_mixing_multiturn_with_single_prompts():
    from banditspec_client.replay import check_replay_options

    check_replay_options(_replay_args())
    with pytest.raises(BanditSpecValidationError) as err:
        check_replay_options(_replay_args(temperature=0.7))
    assert err.value.field == "temperature" and "greedy" in str(err.value)
    with pytest.raises(BanditSpecValidationError) as err:
        check_replay_options(_replay_args(workloads="multiturn,chat"))
    assert err.value.field == "workloads"


def test_replay_takes_its_prompts_from_the_split_it_names():
    from banditspec_client.replay import _prompts

    tune = {t for _, t in _prompts(_replay_args(prompts=20))}
    held = {t for _, t in _prompts(_replay_args(prompts=20, split="heldout"))}
    assert len(tune) == len(held) == 40 and not tune & held
