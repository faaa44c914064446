"""Benchmark workloads: fixed, seeded, named lists from the data packages."""

from __future__ import annotations

import pytest
from banditspec.datasets import humaneval_problems, sharegpt_split
from banditspec.errors import BanditSpecValidationError
from banditspec_client.bench.workloads import WORKLOADS, Prompt, load_workload, parse_workloads


@pytest.mark.parametrize("name", WORKLOADS)
def test_each_workload_is_a_fixed_list_whose_shorter_runs_are_prefixes(name):
    six = load_workload(name, 6)
    assert len(six) == 6 and all(isinstance(p, Prompt) and p.workload == name and p.text.strip() for p in six)
    assert load_workload(name, 6) == six
    assert load_workload(name, 3) == six[:3]
    assert len({p.prompt_id for p in six}) == 6


def test_the_seed_changes_the_order():
    assert [p.prompt_id for p in load_workload("code", 8, seed=0)] != [p.prompt_id for p in load_workload("code", 8, seed=1)]


def test_code_prompts_ask_to_complete_a_humaneval_function():
    by_id = {p["task_id"]: p for p in humaneval_problems()}
    for prompt in load_workload("code", 5):
        problem = by_id[prompt.prompt_id]
        assert problem["prompt"] in prompt.text
        assert problem["canonical_solution"] not in prompt.text


def test_code_edit_prompts_contain_the_whole_solution_to_rewrite():
    by_id = {p["task_id"]: p for p in humaneval_problems()}
    for prompt in load_workload("code-edit", 8):
        problem = by_id[prompt.prompt_id.removesuffix("/edit")]
        assert problem["prompt"] + problem["canonical_solution"] in prompt.text
    instructions = {p.text.split("\n", 1)[0] for p in load_workload("code-edit", 12)}
    assert len(instructions) > 1  # several kinds of edit, not one template


def test_chat_prompts_are_first_human_turns_of_the_eval_split_only():
    eval_turns = {c[0][1].strip() for c in sharegpt_split("eval") if c and c[0][0] == "human"}
    train_turns = {text.strip() for c in sharegpt_split("train") for _, text in c}
    prompts = load_workload("chat", 40)
    assert all(p.text in eval_turns for p in prompts)
    assert not [p.prompt_id for p in prompts if p.text in train_turns]
    assert all(sum(ch.isascii() for ch in p.text) / len(p.text) >= 0.95 for p in prompts)


def test_mixed_interleaves_the_three_kinds():
    mixed = load_workload("mixed", 9)
    assert [p.kind for p in mixed] == ["code", "code-edit", "chat"] * 3
    assert all(p.workload == "mixed" for p in mixed)


def test_bad_names_and_sizes_are_rejected_naming_the_field():
    with pytest.raises(BanditSpecValidationError) as err:
        load_workload("poetry")
    assert err.value.field == "workload"
    with pytest.raises(BanditSpecValidationError) as err:
        load_workload("code", 0)
    assert err.value.field == "prompts"
    with pytest.raises(BanditSpecValidationError):
        parse_workloads("code,nope")
    assert parse_workloads("all") == list(WORKLOADS)
    assert parse_workloads("chat, code") == ["chat", "code"]
