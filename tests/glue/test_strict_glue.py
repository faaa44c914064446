"""The fake pb_utils is as strict as the real one where it matters, and the `target` adapter
returns to each request of a batch exactly what that request gets alone."""

from __future__ import annotations

import time

import numpy as np
import pytest
from banditspec.errors import parse_retry_after

from tests.glue import fake_pb_utils
from tests.glue.fake_pb_utils import answers
from tests.glue.test_banditspec_model import CountingMock, config_args, load_model_module, request, stack  # noqa: F401

FINAL = fake_pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_a_sender_refuses_sends_after_the_final_flag():
    sender = fake_pb_utils.ResponseSender()
    sender.send(fake_pb_utils.InferenceResponse([]), flags=FINAL)
    with pytest.raises(fake_pb_utils.TritonModelException, match="closed"):
        sender.send(fake_pb_utils.InferenceResponse([]))
    with pytest.raises(fake_pb_utils.TritonModelException):
        sender.send(flags=FINAL)
    assert len(sender.sent) == 1


def test_responses_hold_tensors_with_triton_types_only():
    with pytest.raises(fake_pb_utils.TritonModelException):
        fake_pb_utils.Tensor("x", [1, 2, 3])  # a list, not a numpy array
    with pytest.raises(fake_pb_utils.TritonModelException):
        fake_pb_utils.Tensor("x", np.array([1 + 2j]))
    with pytest.raises(fake_pb_utils.TritonModelException):
        fake_pb_utils.InferenceResponse(output_tensors=[np.array([1])])


def test_bls_returns_only_the_requested_outputs():
    def handler(model, tensors, outputs):
        return fake_pb_utils.InferenceResponse([fake_pb_utils.Tensor("a", np.array([1])), fake_pb_utils.Tensor("b", np.array([2]))])

    pb = fake_pb_utils.make_module(handler)
    response = pb.InferenceRequest(model_name="m", requested_output_names=["b"], inputs=[]).exec()
    assert [t.name() for t in response.output_tensors] == ["b"]
    assert pb.get_output_tensor_by_name(response, "a") is None


def test_the_banditspec_adapter_never_sends_after_final(stack):  # noqa: F811
    """Every request ends with exactly one FINAL, for good, bad and cancelled requests alike
    (the strict sender would raise inside the adapter otherwise and the request would hang)."""
    model, _, _ = stack
    requests = [request(max_tokens=5), request(max_tokens=0), request(stream=np.array([[True]]), max_tokens=12)]
    cancelled = request(stream=np.array([[True]]), max_tokens=200)
    cancelled.sender.cancelled = True
    model.execute(requests + [cancelled])
    for req in requests + [cancelled]:
        assert req.sender.done.wait(30)
        assert [flags & FINAL for _, flags in req.sender.sent].count(FINAL) == 1
        assert req.sender.sent[-1][1] & FINAL


def _target_request(ids, draft=None):
    tensors = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
               "request_output_len": np.array([[8]], dtype=np.int32)}
    if draft is not None:
        tensors["draft_input_ids"] = np.array([draft], dtype=np.int32)
    return fake_pb_utils.Request(tensors)


def _outputs(response):
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy().tolist() for t in response.output_tensors}


def test_the_target_adapter_returns_each_request_of_a_batch_its_solo_result(monkeypatch):
    import banditspec.engine.reference as reference

    def fresh_target():
        engine = CountingMock()
        monkeypatch.setattr(reference.ReferenceEngine, "from_name", classmethod(lambda cls, name, **kw: engine))
        module = load_model_module("target", fake_pb_utils.make_module(lambda *a: None))
        target = module.TritonPythonModel()
        target.initialize(config_args("target"))
        return target, engine

    cases = [([5, 6, 7], [8, 9]), ([1, 2, 3, 4, 5, 6], None), ([9, 9], [1, 2, 3]), ([3, 1, 4, 1, 5], [9])]
    solo = []
    for ids, draft in cases:
        target, _ = fresh_target()
        (response,) = answers(target, [_target_request(ids, draft)])
        solo.append(_outputs(response))
    assert len({str(s) for s in solo}) == len(cases), "the cases must differ for the check to mean anything"
    target, engine = fresh_target()
    batched = answers(target, [_target_request(ids, draft) for ids, draft in cases])
    assert engine.batches == [len(cases)]  # one engine call for the whole batch
    got = [_outputs(r) for r in batched]
    # the pass each row was verified in: the one pass, holding every case (fields: VERIFY_PASS_FIELDS)
    passes = [a.pop("verify_pass") for a in got]
    for s in solo:
        s.pop("verify_pass")
    assert got == solo
    assert all(p == passes[0] for p in passes) and passes[0][0][2] == len(cases)
    assert passes[0][0][3] == sum(1 + len(draft or ()) for _, draft in cases)


def test_the_target_adapter_answers_a_request_of_several_sequences_row_by_row(monkeypatch):
    """The controller sends its concurrent sequences' steps as one request of several rows
    (banditspec.engine.gather): each row gets what it gets alone, in one engine call; a row
    the target refuses fails its request, naming the row, and spares the other requests."""
    import banditspec.engine.reference as reference
    from banditspec.engine.contract import VerifyRequest
    from banditspec.engine.tensor_codec import decode_results, encode_requests

    engine = CountingMock()
    monkeypatch.setattr(reference.ReferenceEngine, "from_name", classmethod(lambda cls, name, **kw: engine))
    module = load_model_module("target", fake_pb_utils.make_module(lambda *a: None))
    target = module.TritonPythonModel()
    target.initialize(config_args("target"))
    cases = [([5, 6, 7], [8, 9]), ([1, 2, 3, 4, 5, 6], []), ([9, 9], [1, 2, 3]), ([3, 1, 4, 1, 5], [9])]
    reqs = [VerifyRequest(np.array(ids, np.int32), np.array(draft, np.int32)) for ids, draft in cases]
    solo = [engine.verify([r])[0] for r in reqs]
    engine.batches.clear()
    (response,) = answers(target, [fake_pb_utils.Request(encode_requests(reqs, with_reference_extras=True))])
    assert engine.batches == [len(cases)]
    rows = decode_results({t.name(): t.as_numpy() for t in response.output_tensors}, reqs)
    assert [(r.output_ids.tolist(), r.num_accepted) for r in rows] == [(r.output_ids.tolist(), r.num_accepted) for r in solo]
    bad = [VerifyRequest(np.array([5, 6], np.int32)), VerifyRequest(np.array([5, 10**6], np.int32))]
    good = fake_pb_utils.Request(encode_requests(reqs[:1], with_reference_extras=True))
    refused, answered = answers(target, [fake_pb_utils.Request(encode_requests(bad, with_reference_extras=True)), good])
    assert refused.has_error() and "input_ids" in refused.error().message() and "sequence 1" in refused.error().message()
    assert not answered.has_error()


# --- adapter outcomes, code included ------------------------------------------------------------


def _codes(sender):
    return [(r.error().code(), r.error().message()) for r, _ in sender.sent if r is not None and r.has_error()]


@pytest.mark.parametrize("failure, code, prefix", [
    (lambda: __import__("banditspec.errors", fromlist=["x"]).BanditSpecValidationError("input_ids", "bad"), "INVALID_ARG", "input_ids"),
    (lambda: RuntimeError("boom"), "INTERNAL", "target: verification failed (RuntimeError)"),
])
def test_the_target_adapter_maps_engine_failures_to_codes(stack, monkeypatch, failure, code, prefix):  # noqa: F811
    _, target, engine = stack

    def fail(requests):
        raise failure()

    monkeypatch.setattr(engine, "verify", fail)
    (response,) = answers(target, [_target_request([1, 2, 3])])
    assert response.has_error()
    assert response.error().code() == getattr(fake_pb_utils.TritonError, code)
    assert response.error().message().startswith(prefix)


def test_the_banditspec_adapter_sends_unavailable_when_the_target_fails(stack, monkeypatch):  # noqa: F811
    model, _, engine = stack

    def fail(requests):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "verify", fail)
    req = request(max_tokens=5)
    model.execute([req])
    assert req.sender.done.wait(30)
    ((code, message),) = _codes(req.sender)
    assert code == fake_pb_utils.TritonError.UNAVAILABLE
    assert message == "target engine failed: target: target: verification failed (RuntimeError)"


def test_the_banditspec_adapter_sends_unavailable_when_busy(stack):  # noqa: F811
    model, _, _ = stack
    defaults = model.controller.defaults  # a full queue is refused: slots + queue + 3 requests
    limit = defaults.max_concurrent_sequences + defaults.max_queue_size
    held = [request(stream=np.array([[True]]), max_tokens=1000) for _ in range(limit + 3)]
    for r in held:
        r.sender.cancelled = False
    model.execute(held)
    deadline = time.monotonic() + 60
    while sum(r.sender.done.is_set() for r in held) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the three beyond the queue are answered at once
    for r in held:
        r.sender.cancelled = True  # the rest leave: their slots and their places
    busy = []
    for r in held:
        assert r.sender.done.wait(60)
        busy += [c for c in _codes(r.sender) if c[1].startswith("server busy")]
    assert len(busy) == 3 and all(parse_retry_after(message) for _, message in busy)
    assert busy and all(code == fake_pb_utils.TritonError.UNAVAILABLE for code, _ in busy)
