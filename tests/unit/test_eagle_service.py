"""The ``eagle`` model's logic (banditspec.drafters.eagle_service) and the controller's BLS drafter
(banditspec.drafters.eagle_remote), joined by an in-process ``infer`` that goes through the
same tensor table as the Triton adapter. A random head over the tiny Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from banditspec.drafters.eagle import EagleDrafter
from banditspec.drafters.eagle_remote import RemoteEagleDrafter
from banditspec.drafters.eagle_service import EagleCall, EagleService, call_from_tensors
from banditspec.errors import BanditSpecValidationError

from tests.unit.test_eagle import make_head, random_ids, target_hidden

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    from banditspec.engine.models import load_model

    model, _ = load_model("tiny")
    return model


@pytest.fixture(scope="module")
def drafter(tiny):
    return EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight)


class CountingInfer:
    """infer(model, tensors, outputs) into an EagleService; records every call."""

    def __init__(self, service: EagleService):
        self.service = service
        self.calls: list[dict] = []

    def __call__(self, model_name, tensors, outputs):
        assert model_name == "eagle" and list(outputs) == ["draft_ids"]
        self.calls.append(dict(tensors))
        return {"draft_ids": self.service.handle(call_from_tensors(tensors))}


def run_steps(session, model, prompt, continuation, schedule):
    """Feed ``continuation`` in chunks; before each chunk propose (schedule[i] = max_len, 0 = not
    chosen). The target's features come from a plain forward. Returns the proposals."""
    proposals, sequence, first = [], list(prompt), True
    for chunk, max_len in zip(continuation, schedule):
        proposals.append(session.propose(max_len).token_ids.tolist() if max_len else None)
        sequence += chunk
        hidden = target_hidden(model, sequence)
        rows = hidden[:-1] if first else hidden[-len(chunk) - 1:-1]  # first step: prompt rows too
        session.observe(chunk, rows)
        first = False
    proposals.append(session.propose(4).token_ids.tolist())
    return proposals


def test_remote_proposals_equal_in_process_ones_and_cost_one_call_each(drafter, tiny):
    prompt = random_ids(9, seed=11)
    continuation = [random_ids(n, seed=20 + i) for i, n in enumerate([1, 3, 2, 1, 4, 2])]
    schedule = [3, 0, 4, 0, 0, 2]  # the arm is chosen at some steps only
    local = run_steps(drafter.start(prompt), tiny, prompt, continuation, schedule)
    infer = CountingInfer(EagleService(drafter))
    remote_session = RemoteEagleDrafter(infer).start(prompt)
    remote = run_steps(remote_session, tiny, prompt, continuation, schedule)
    assert remote == local
    assert len(infer.calls) == sum(1 for g in schedule if g) + 1  # one call per proposal, none per observe
    assert "prompt_ids" in infer.calls[0] and all("prompt_ids" not in c for c in infer.calls[1:])
    # the second call carries the two steps observed since the first: 1 + 3 tokens, their rows
    assert infer.calls[1]["input_ids"].tolist() == continuation[0] + continuation[1]
    remote_session.close(finished=True)
    assert infer.calls[-1]["end"].tolist() == [True] and len(infer.service) == 0


def test_a_session_never_proposed_costs_no_call(drafter, tiny):
    infer = CountingInfer(EagleService(drafter))
    session = RemoteEagleDrafter(infer).start(random_ids(5, seed=1))
    session.observe([7], np.zeros((5, 64), dtype=np.float32))
    session.close(finished=True)
    assert infer.calls == []


def test_missing_features_mean_empty_drafts_without_a_call(drafter, tiny):
    infer = CountingInfer(EagleService(drafter))
    prompt = random_ids(6, seed=2)
    session = RemoteEagleDrafter(infer).start(prompt)
    session.observe([5], None)
    assert len(session.propose(4)) == 0 and infer.calls == []


def test_sequences_are_bounded_least_recently_used_first(drafter, tiny):
    service = EagleService(drafter, max_sequences=2)
    for key in (1, 2):
        service.handle(EagleCall(key, prompt_ids=np.array(random_ids(4, seed=key), dtype=np.int32)))
    service.handle(EagleCall(1))  # touch 1: 2 is now the oldest
    service.handle(EagleCall(3, prompt_ids=np.array(random_ids(4, seed=3), dtype=np.int32)))
    assert len(service) == 2 and service.evicted == 1
    service.handle(EagleCall(1))
    with pytest.raises(BanditSpecValidationError, match="sequence_id.*evicted"):
        service.handle(EagleCall(2))
    service.handle(EagleCall(1, end=True))
    with pytest.raises(BanditSpecValidationError, match="sequence_id"):
        service.handle(EagleCall(1))


@pytest.mark.parametrize("tensors, field", [
    ({}, "sequence_id"),
    ({"sequence_id": np.array([1, 2], dtype=np.uint64)}, "sequence_id"),
    ({"sequence_id": np.array([1], dtype=np.uint64), "prompt_ids": np.array([49152], dtype=np.int32)}, "prompt_ids"),
    ({"sequence_id": np.array([1], dtype=np.uint64), "prompt_ids": np.array([3], dtype=np.int32),
      "max_draft_len": np.array([99], dtype=np.int32)}, "max_draft_len"),
    ({"sequence_id": np.array([1], dtype=np.uint64), "prompt_ids": np.array([3, 4], dtype=np.int32),
      "input_ids": np.array([5], dtype=np.int32), "hidden_states": np.zeros((9, 3), dtype=np.float32)}, "hidden_states"),
])
def test_bad_calls_name_the_field(drafter, tensors, field):
    service = EagleService(drafter)
    with pytest.raises(BanditSpecValidationError) as info:
        service.handle(call_from_tensors(tensors))
    assert info.value.field == field


def test_constructor_arguments_are_checked(drafter):
    with pytest.raises(BanditSpecValidationError, match="max_sequences"):
        EagleService(drafter, max_sequences=0)
    with pytest.raises(BanditSpecValidationError, match="max_draft_len"):
        EagleService(drafter, max_draft_len=-1)
