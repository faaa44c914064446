"""The pass the target reports with every answer (engine/verify_pass.py, the codec's verify_pass)."""

from __future__ import annotations

import numpy as np
from banditspec.engine.contract import REFERENCE_EXTRA_OUTPUTS, VERIFY_PASS_FIELDS, VerifyPass, VerifyRequest
from banditspec.engine.tensor_codec import TensorEngine, decode_requests, decode_results, encode_results
from banditspec.engine.verify_pass import PassTimer
from banditspec.evaluation.replay import VirtualClock

from tests.mock_engine import MockEngine


class TimedMock(MockEngine):
    def __init__(self, clock: VirtualClock, seconds: float):
        super().__init__(vocab_size=50, eos_id=0, max_context=4096)
        self.clock, self.seconds = clock, seconds

    def verify(self, requests):
        self.clock.advance(self.seconds)
        return super().verify(requests)


def _req(ids, draft=()) -> VerifyRequest:
    return VerifyRequest(np.asarray(ids, np.int32), np.asarray(draft, np.int32))


def test_a_pass_is_described_by_what_it_verified_and_how_long_it_took():
    clock = VirtualClock()
    engine = TimedMock(clock, 0.125)
    timer = PassTimer(clock=clock)
    batch = [_req([1, 2, 3], [engine.target([1, 2, 3]), 7]), _req(list(range(1, 8)))]
    results = timer.verify(engine, batch, prefill=False)
    facts = results[0].verified_in
    assert facts is not None and all(r.verified_in is facts for r in results)
    assert (facts.serial, facts.prefill, facts.sequences, facts.rows) == (1, False, 2, 4)
    assert facts.produced == sum(r.output_ids.size for r in results)
    assert facts.context == (3 * 3 + 1 * 7) / 4  # by rows fed
    assert (facts.longest, facts.runner_up, facts.deepest) == (3, 1, 7)  # what a padded pass computes
    assert facts.seconds == 0.125
    assert timer.verify(engine, batch[:1], prefill=True)[0].verified_in.serial == 2  # type: ignore[union-attr]
    engine.packs_rows = True  # a target whose passes are packed pads nothing, and says so
    packed = timer.verify(engine, batch, prefill=False)[0].verified_in
    assert packed is not None and (packed.longest, packed.runner_up, packed.deepest) == (0, 0, 0)
    assert (packed.sequences, packed.rows) == (2, 4)


def test_the_pass_travels_with_each_row_and_only_when_asked_for():
    assert REFERENCE_EXTRA_OUTPUTS["verify_pass"] == ("TYPE_FP64", [len(VERIFY_PASS_FIELDS)])
    mock = MockEngine(vocab_size=50, eos_id=0)
    timer = PassTimer()
    asked: list[list[str]] = []

    def infer(model, tensors, outputs):
        asked.append(list(outputs))
        answer = encode_results(timer.verify(mock, decode_requests(tensors), prefill=False))
        return {k: v for k, v in answer.items() if k in outputs}

    reqs = [_req([1, 2, 3 + i], [mock.target([1, 2, 3 + i])]) for i in range(3)]
    engine = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=4, reports_passes=True)
    got = engine.verify(reqs)
    assert "verify_pass" in asked[-1]
    passes = {id(r.verified_in) for r in got}
    assert len(passes) == 3 and {r.verified_in.serial for r in got} == {1}  # type: ignore[union-attr]
    assert all(r.verified_in == VerifyPass(serial=1, prefill=False, sequences=3, rows=6, produced=6,  # type: ignore[union-attr]
                                           context=r.verified_in.context, seconds=r.verified_in.seconds,
                                           longest=2, runner_up=2, deepest=3) for r in got)
    one = engine.verify(reqs[:1])[0]
    assert one.verified_in is not None and one.verified_in.sequences == 1
    silent = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=4)
    assert all(r.verified_in is None for r in silent.verify(reqs)) and "verify_pass" not in asked[-1]
    trtllm = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, reports_passes=True, tensorrtllm=True)
    assert not trtllm.reports_passes  # TensorRT-LLM answers no such tensor


def test_the_cached_tokens_travel_with_each_row_and_only_when_asked_for():
    assert REFERENCE_EXTRA_OUTPUTS["cached_tokens"] == ("TYPE_INT32", [1])
    mock = MockEngine(vocab_size=50, eos_id=0)

    def cached(results):
        for i, result in enumerate(results):
            result.cached_tokens = 10 * (i + 1)
        return results

    def infer(model, tensors, outputs):
        answer = encode_results(cached(mock.verify(decode_requests(tensors))))
        return {k: v for k, v in answer.items() if k in outputs}

    reqs = [_req([1, 2, 3 + i]) for i in range(3)]
    batched = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=4, reports_passes=True)
    assert [r.cached_tokens for r in batched.verify(reqs)] == [10, 20, 30]
    alone = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, reports_passes=True)
    assert [r.cached_tokens for r in alone.verify(reqs[:1])] == [10]
    silent = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=4)  # not asked: not said
    assert [r.cached_tokens for r in silent.verify(reqs)] == [None, None, None]
    answer = encode_results(cached(mock.verify(reqs[:2])))
    answer["cached_tokens"] = answer["cached_tokens"][:1]  # a row short: ignored, not fatal
    assert [r.cached_tokens for r in decode_results(answer, reqs[:2])] == [None, None]


def test_a_malformed_pass_is_ignored_not_fatal():
    mock = MockEngine(vocab_size=50, eos_id=0)
    reqs = [_req([1, 2]), _req([3, 4])]
    tensors = encode_results(mock.verify(reqs))
    tensors["verify_pass"] = np.full((2, 3), np.nan)
    assert all(r.verified_in is None for r in decode_results(tensors, reqs))
