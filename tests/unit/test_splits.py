"""The tuning / held-out split: one committed file, built by a fixed rule, content-disjoint across
every workload (a HumanEval function or a ShareGPT conversation is in one split for all of them)."""

from __future__ import annotations

import json

import pytest
from banditspec.datasets import humaneval_problems
from banditspec.errors import BanditSpecValidationError
from banditspec_client.bench.splits import CONTENT_MIN_CHARS, SPLIT_FILE, SPLITS, build_splits, load_splits
from banditspec_client.bench.workloads import WORKLOADS, load_conversations, load_workload


def _all_content(split: str) -> tuple[set[str], set[str]]:
    """(every prompt text, every substantial conversation turn) that ``split`` sends, over
    every workload: the single-prompt ones and the multi-turn conversations."""
    prompts = {p.text for name in WORKLOADS for p in load_workload(name, split=split)}
    turns = {t for turns in (2, 3) for c in load_conversations(split=split, turns=turns) for t in c.turns
             if len(t) >= CONTENT_MIN_CHARS}
    return prompts, turns


def test_the_committed_split_file_is_what_the_rule_builds():
    built = build_splits()
    committed = json.loads(SPLIT_FILE.read_text())
    assert committed == built
    for source in ("humaneval", "sharegpt"):
        tune, heldout = set(built[source]["tune"]), set(built[source]["heldout"])
        assert tune and heldout and not tune & heldout
        assert min(len(tune), len(heldout)) > 0.4 * (len(tune) + len(heldout))  # about half each
    assert set(built["humaneval"]["tune"]) | set(built["humaneval"]["heldout"]) == {p["task_id"] for p in humaneval_problems()}


def test_no_content_is_in_both_splits_in_any_workload():
    tune_prompts, tune_turns = _all_content("tune")
    held_prompts, held_turns = _all_content("heldout")
    assert tune_prompts and held_prompts and tune_turns and held_turns
    # no prompt text, and no substantial turn of a chat or a conversation, in both
    assert not tune_prompts & held_prompts
    assert not (tune_prompts | tune_turns) & (held_prompts | held_turns)
    # a HumanEval function (its signature and docstring) occurs in the prompts of one split only,
    # whatever the workload built from it (code, code-edit, mixed)
    splits = load_splits()
    for problem in humaneval_problems():
        own = splits.split_of_function(problem["task_id"])
        other_prompts = tune_prompts if own == "heldout" else held_prompts
        assert not [t for t in other_prompts if problem["prompt"] in t], problem["task_id"]
        own_prompts = held_prompts if own == "heldout" else tune_prompts
        assert sum(problem["prompt"] in t for t in own_prompts) >= 2  # code and code-edit (and mixed)


@pytest.mark.parametrize("split", SPLITS)
def test_every_workload_draws_only_from_its_split(split):
    splits = load_splits()
    for name in WORKLOADS:
        for prompt in load_workload(name, split=split):
            source, _, number = prompt.prompt_id.partition("/")
            if source == "HumanEval":
                assert splits.split_of_function(prompt.prompt_id.removesuffix("/edit")) == split
            else:
                assert source == "sharegpt" and splits.split_of_conversation(int(number)) == split
    for conversation in load_conversations(split=split):
        assert splits.split_of_conversation(int(conversation.conversation_id.partition("/")[2])) == split


def test_mixed_tuning_prompts_hold_no_held_out_prompt():
    held = {p.text for name in WORKLOADS for p in load_workload(name, split="heldout")}
    assert not [p.prompt_id for p in load_workload("mixed", 60, split="tune") if p.text in held]


def test_enough_held_out_material_for_a_headline_row():
    for name in WORKLOADS:
        assert len(load_workload(name, split="heldout")) >= 24
    assert len(load_conversations(split="heldout")) >= 24


def test_an_unknown_split_is_refused_naming_the_field():
    with pytest.raises(BanditSpecValidationError) as err:
        load_workload("code", 3, split="test")
    assert err.value.field == "split"
    with pytest.raises(BanditSpecValidationError) as err:
        load_conversations(3, split="train")
    assert err.value.field == "split"
