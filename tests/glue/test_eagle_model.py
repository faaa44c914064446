"""The ``eagle`` Triton adapter with triton_python_backend_utils mocked, and the controller's
remote eagle arm calling it through the fake BLS (random head over the tiny Llama)."""

from __future__ import annotations

import banditspec.drafters.eagle as eagle_drafters
import banditspec.engine.models as models
import numpy as np
import pytest
from banditspec.drafters.eagle import EagleDrafter
from banditspec.drafters.eagle_remote import RemoteEagleDrafter

from tests.glue import fake_pb_utils
from tests.glue.test_banditspec_model import config_args, load_model_module
from tests.unit.test_eagle import make_head, random_ids, target_hidden


@pytest.fixture(scope="module")
def tiny():
    model, _ = models.load_model("tiny")
    return model


def eagle_model(monkeypatch, tiny, fits=True):
    monkeypatch.setattr(eagle_drafters, "head_fit_problem", lambda name, weights=None: None if fits else "head built for hidden 576")
    monkeypatch.setattr(eagle_drafters, "load_default_eagle_drafter",
                        lambda model, weights=None, min_confidence=0.0: EagleDrafter(make_head(model), model.get_input_embeddings().weight,
                                                                       min_confidence=min_confidence))
    monkeypatch.setattr(models, "load_model", lambda name: (tiny, None))
    module = load_model_module("eagle", fake_pb_utils.make_module(lambda *a: None))
    model = module.TritonPythonModel()
    model.initialize(config_args("eagle", max_sequences="4", min_confidence="0"))
    return model


def call(model, **tensors):
    (response,) = model.execute([fake_pb_utils.Request(tensors)])
    return response


def test_start_observe_propose_end(monkeypatch, tiny):
    model = eagle_model(monkeypatch, tiny)
    prompt = random_ids(8, seed=1)
    sid = np.array([42], dtype=np.uint64)
    first = call(model, sequence_id=sid, prompt_ids=np.array(prompt, dtype=np.int32), max_draft_len=np.array([4], dtype=np.int32))
    assert not first.has_error()
    assert fake_pb_utils.get_output_tensor_by_name(first, "draft_ids").as_numpy().size == 0  # no features yet
    hidden = target_hidden(tiny, prompt + [5])[:-1]
    second = call(model, sequence_id=sid, input_ids=np.array([5], dtype=np.int32), hidden_states=hidden,
                  max_draft_len=np.array([3], dtype=np.int32))
    draft = fake_pb_utils.get_output_tensor_by_name(second, "draft_ids").as_numpy()
    assert draft.dtype == np.int32 and draft.shape == (3,)
    ended = call(model, sequence_id=sid, end=np.array([True]))
    assert not ended.has_error() and len(model.service) == 0


@pytest.mark.parametrize("tensors, field", [
    (dict(sequence_id=np.array([7], dtype=np.uint64)), "sequence_id"),  # never started
    (dict(prompt_ids=np.array([3], dtype=np.int32)), "sequence_id"),  # missing
    (dict(sequence_id=np.array([7], dtype=np.uint64), prompt_ids=np.array([-1], dtype=np.int32)), "prompt_ids"),
    (dict(sequence_id=np.array([7], dtype=np.uint64), prompt_ids=np.array([3], dtype=np.int32),
          max_draft_len=np.array([17], dtype=np.int32)), "max_draft_len"),
])
def test_bad_input_is_invalid_arg_naming_the_field(monkeypatch, tiny, tensors, field):
    model = eagle_model(monkeypatch, tiny)
    response = call(model, **tensors)
    assert response.has_error() and response.error().code() == fake_pb_utils.TritonError.INVALID_ARG
    assert response.error().message().startswith(f"{field}:") and "Traceback" not in response.error().message()
    ok = call(model, sequence_id=np.array([8], dtype=np.uint64), prompt_ids=np.array([3, 4], dtype=np.int32))
    assert not ok.has_error()  # the next good call works


def test_a_head_that_does_not_fit_the_target_is_unavailable(monkeypatch, tiny):
    model = eagle_model(monkeypatch, tiny, fits=False)
    response = call(model, sequence_id=np.array([1], dtype=np.uint64), prompt_ids=np.array([3], dtype=np.int32))
    assert response.error().code() == fake_pb_utils.TritonError.UNAVAILABLE and "hidden 576" in response.error().message()


def test_the_remote_arm_through_the_fake_bls(monkeypatch, tiny):
    model = eagle_model(monkeypatch, tiny)
    calls = []

    def bls(model_name, tensors, outputs):
        calls.append(model_name)
        (response,) = model.execute([fake_pb_utils.Request(tensors)])
        return response

    pb = fake_pb_utils.make_module(bls)
    banditspec_module = load_model_module("banditspec", pb)
    prompt = random_ids(6, seed=3)
    local = EagleDrafter(make_head(tiny), tiny.get_input_embeddings().weight).start(prompt)
    remote = RemoteEagleDrafter(banditspec_module.bls_infer).start(prompt)
    rows = target_hidden(tiny, prompt + [9, 10])[:-1]
    for session in (local, remote):
        session.observe([9, 10], rows)
    assert remote.propose(4).token_ids.tolist() == local.propose(4).token_ids.tolist()
    remote.close(finished=True)
    assert calls == ["eagle", "eagle"] and len(model.service) == 0
