"""The banditspec and target Triton adapters with triton_python_backend_utils mocked.

The BLS call from `banditspec` is routed into the real `target` adapter, which runs a
mock engine; so both model.py files, the codec and the controller run end to end."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import threading
import time

import numpy as np
import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN as L
from banditspec.paths import REPO_ROOT

from tests.fake_tokenizer import ByteTokenizer
from tests.glue import fake_pb_utils
from tests.glue.fake_pb_utils import answers
from tests.mock_engine import MockEngine

REPO = REPO_ROOT / "model_repository"


def load_model_module(name: str, pb_module):
    sys.modules["triton_python_backend_utils"] = pb_module
    spec = importlib.util.spec_from_file_location(f"model_{name}", REPO / name / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_args(name: str, **params) -> dict:
    text = (REPO / name / "config.pbtxt").read_text()
    import re

    found = dict(re.findall(r'key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text))
    found.update(params)
    return {"model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in found.items()}})}


class CountingMock(MockEngine):
    def __init__(self):
        super().__init__(vocab_size=257, eos_id=256, max_context=2048)
        self.batches = []

    def verify(self, requests):
        self.batches.append(len(requests))
        return super().verify(requests)


@pytest.fixture
def stack(monkeypatch):
    """(banditspec model instance, target model instance, mock engine)."""
    import banditspec.engine.reference as reference
    import banditspec.serving.setup as setup

    engine = CountingMock()
    target_holder = {}

    def bls(model_name, tensors, outputs):
        assert model_name == "target"
        (response,) = answers(target_holder["model"], [fake_pb_utils.Request(tensors)])
        return response

    pb = fake_pb_utils.make_module(bls)
    monkeypatch.setattr(setup, "load_serving_tokenizer", lambda params: ByteTokenizer())
    monkeypatch.setattr(reference.ReferenceEngine, "from_name", classmethod(lambda cls, name, **kw: engine))
    target_module = load_model_module("target", pb)
    target = target_module.TritonPythonModel()
    target.initialize(config_args("target"))
    target_holder["model"] = target
    bandit_module = load_model_module("banditspec", pb)
    model = bandit_module.TritonPythonModel()
    model.initialize(config_args("banditspec", drafters="pld,suffix", chat_template="false"))
    yield model, target, engine
    model.finalize()


def request(text="hello world", max_tokens=30, **extra):
    tensors = {"text_input": np.array([[text.encode()]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    tensors.update(extra)
    return fake_pb_utils.Request(tensors)


def texts(sender):
    out = []
    for response, _ in sender.sent:
        if response is not None and not response.has_error():
            t = fake_pb_utils.get_output_tensor_by_name(response, "text_output")
            out.append(t.as_numpy().reshape(-1)[0].decode())
    return out


def errors(sender):
    return [(r.error().code(), r.error().message()) for r, _ in sender.sent if r is not None and r.has_error()]


def test_batch_of_two_with_an_invalid_first_serves_the_second(stack):
    model, _, engine = stack
    bad = request(max_tokens=0)
    good = request(policy=np.array([[b"ucbspec"]], dtype=object))
    assert model.execute([bad, good]) is None
    assert bad.sender.done.wait(10) and good.sender.done.wait(30)
    assert errors(bad.sender) == [(fake_pb_utils.TritonError.INVALID_ARG, "max_tokens: must be >= 1, got 0")]
    expected = ByteTokenizer().decode(engine.vanilla(list(b"hello world"), 30))
    assert "".join(texts(good.sender)) == expected
    assert good.sender.sent[-1][1] == fake_pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_stats_output_and_streaming(stack):
    model, _, engine = stack
    req = request(stream=np.array([[True]]), policy=np.array([[b"fixed:pld"]], dtype=object))
    model.execute([req])
    assert req.sender.done.wait(30)
    chunks = texts(req.sender)
    assert len(chunks) > 1
    final, flags = req.sender.sent[-1]
    stats = json.loads(fake_pb_utils.get_output_tensor_by_name(final, "speculation_stats").as_numpy().reshape(-1)[0])
    assert stats["generated_tokens"] == 30 and set(stats["arms"]) <= {f"pld@{L}", "vanilla"}
    assert "".join(chunks) == ByteTokenizer().decode(engine.vanilla(list(b"hello world"), 30))


def test_batch_dimension_above_one_is_rejected(stack):
    model, _, _ = stack
    req = fake_pb_utils.Request(
        {"text_input": np.array([[b"a"], [b"b"]], dtype=object), "max_tokens": np.array([[5], [5]], dtype=np.int32)}
    )
    model.execute([req])
    assert req.sender.done.wait(10)
    (code, message), = errors(req.sender)
    assert code == fake_pb_utils.TritonError.INVALID_ARG and message.startswith("text_input")


def test_target_adapter_rejects_bad_tensors_per_request(stack):
    _, target, engine = stack
    good = fake_pb_utils.Request({"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32)})
    bad = fake_pb_utils.Request({"input_ids": np.array([[1, 2, 3]], dtype=np.int32), "input_lengths": np.array([[9]], dtype=np.int32)})
    responses = answers(target, [bad, good])
    assert responses[0].has_error() and responses[0].error().message().startswith("input_lengths")
    assert not responses[1].has_error()
    assert engine.batches[-1] == 1


def test_target_adapter_verifies_a_batch_in_one_engine_call(stack):
    _, target, engine = stack
    reqs = [
        fake_pb_utils.Request({"input_ids": np.array([[1, 2, 3 + i]], dtype=np.int32), "draft_input_ids": np.array([[4, 5]], dtype=np.int32)})
        for i in range(3)
    ]
    responses = answers(target, reqs)
    assert engine.batches[-1] == 3
    assert all(not r.has_error() for r in responses)


@pytest.mark.parametrize("early", [True, False])
def test_answering_early_runs_the_smaller_pass_first_and_answers_each_request_once(stack, early):
    """Two continuing sequences (3 rows each) and a new one (a 2-token prompt): answering
    early, the new sequence's pass (2 rows) goes first; either way every request gets its
    own answer, and the same one."""
    _, target, engine = stack
    target.answer_early = early

    def step(ids, draft=()):
        tensors = {"input_ids": np.array([ids], dtype=np.int32)}
        if draft:
            tensors["draft_input_ids"] = np.array([draft], dtype=np.int32)
        return fake_pb_utils.Request(tensors)

    first = answers(target, [step([1, 2, 3, 4]), step([1, 2, 3, 5])])  # two new sequences
    following = [np.concatenate([[1, 2, 3, 4 + i], fake_pb_utils.get_output_tensor_by_name(r, "output_ids").as_numpy()
                                 .reshape(-1)]).astype(np.int32).tolist() for i, r in enumerate(first)]
    engine.batches.clear()
    requests = [step(following[0], (7, 8)), step([9, 10]), step(following[1], (7, 8))]
    responses = answers(target, requests)
    assert engine.batches == ([1, 2] if early else [2, 1])  # the new sequence alone, then the others
    assert all(not r.has_error() for r in responses)
    alone = [answers(target, [step(following[0], (7, 8))])[0], answers(target, [step([9, 10])])[0]]
    for got, want in zip(responses[:2], alone):
        assert np.array_equal(fake_pb_utils.get_output_tensor_by_name(got, "output_ids").as_numpy(),
                              fake_pb_utils.get_output_tensor_by_name(want, "output_ids").as_numpy())


def test_initialize_freezes_the_loaded_heap_unless_told_not_to(monkeypatch):
    """gc_freeze (default true): every model's initialize leaves what loading allocated out of
    the cyclic collector's walks (banditspec.serving.heap); "false" leaves the heap as it was."""
    import gc

    import banditspec.engine.reference as reference

    monkeypatch.setattr(reference.ReferenceEngine, "from_name", classmethod(lambda cls, name, **kw: CountingMock()))
    target_module = load_model_module("target", fake_pb_utils.make_module(lambda *a: None))
    gc.unfreeze()
    target_module.TritonPythonModel().initialize(config_args("target", gc_freeze="false"))
    assert gc.get_freeze_count() == 0
    target_module.TritonPythonModel().initialize(config_args("target"))
    assert gc.get_freeze_count() > 1000  # this process's modules, at least



def test_a_down_target_is_unavailable_with_the_retry_hint(stack):
    """Triton's words for a dead target stub make the failure retryable: UNAVAILABLE, and the
    message ends with the model's retry_after_s (30 by default)."""
    model, target, _ = stack
    down = fake_pb_utils.TritonError("Stub process 'target_0_0' is not healthy.")
    target.execute = lambda requests: [fake_pb_utils.InferenceResponse(error=down) for _ in requests]
    req = request()
    model.execute([req])
    assert req.sender.done.wait(10)
    (code, message), = errors(req.sender)
    assert code == fake_pb_utils.TritonError.UNAVAILABLE, message
    assert message.startswith("target engine failed: target: Stub process") and message.endswith("(retry after 30 s)")


def test_a_bad_field_stays_invalid_whatever_its_words(stack):
    model, _, _ = stack
    req = request(policy=np.array([[b"unknown model"]], dtype=object))
    model.execute([req])
    assert req.sender.done.wait(10)
    (code, message), = errors(req.sender)
    assert code == fake_pb_utils.TritonError.INVALID_ARG and message.startswith("policy") and "retry after" not in message


def test_a_request_thread_that_outlives_the_stop_is_logged_with_where_it_is(stack, caplog):
    """finalize waits for the request threads; one still running a few seconds after the stop
    is named in the log with its stack (then waited for), so a slow stop says what it waits on."""
    model, _, _ = stack
    module = type(model).finalize.__globals__  # the model file's globals (loaded from its path)
    release, entered = threading.Event(), threading.Event()

    def stuck_handle(inputs, sink):
        entered.set()
        release.wait(10)

    model.controller.handle = stuck_handle
    model.execute([request()])
    assert entered.wait(5)
    original, module["FINALIZE_REPORT_S"] = module["FINALIZE_REPORT_S"], 0.1
    stopping = threading.Thread(target=model.finalize)
    try:
        with caplog.at_level(logging.WARNING, logger="banditspec.model"):
            stopping.start()
            deadline = time.monotonic() + 5
            while "still running" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.02)
        assert "1 request thread(s) still running" in caplog.text and "stuck_handle" in caplog.text
        assert stopping.is_alive()  # still waiting for it
    finally:
        module["FINALIZE_REPORT_S"] = original
        release.set()
        stopping.join(10)
    assert not stopping.is_alive()
