"""Concurrent sequences' steps as one call: the multi-row codec and the gatherer
(banditspec.engine.tensor_codec, banditspec.engine.gather)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from banditspec.engine.contract import VerifyRequest, VerifyResult
from banditspec.engine.gather import VerifyGatherer
from banditspec.engine.tensor_codec import (
    TensorEngine,
    decode_requests,
    decode_results,
    encode_request,
    encode_requests,
    encode_results,
)
from banditspec.errors import BanditSpecValidationError, EngineError

from tests.mock_engine import MockEngine


def _req(ids, draft=(), **kw) -> VerifyRequest:
    return VerifyRequest(np.asarray(ids, np.int32), np.asarray(draft, np.int32), **kw)


def _same_request(a: VerifyRequest, b: VerifyRequest) -> bool:
    return (a.input_ids.tolist() == b.input_ids.tolist() and a.draft_ids.tolist() == b.draft_ids.tolist()
            and a.temperature == b.temperature and a.seed == b.seed and a.end_id == b.end_id
            and a.hidden_from == b.hidden_from and tuple(a.hidden_layers) == tuple(b.hidden_layers))


# --- the codec ----------------------------------------------------------------------------------


def test_one_sequence_keeps_the_tensorrt_llm_shapes():
    tensors = encode_request(_req([4, 5, 6], [7, 8], end_id=2), with_reference_extras=False)
    assert tensors["input_ids"].tolist() == [[4, 5, 6]]
    assert tensors["input_lengths"].tolist() == [[3]]
    assert tensors["request_output_len"].tolist() == [[3]]
    assert tensors["draft_input_ids"].tolist() == [[7, 8]]
    assert tensors["end_id"].tolist() == [[2]]
    assert "temperature" not in tensors and "hidden_states_from" not in tensors
    assert "draft_input_ids" not in encode_request(_req([4]), with_reference_extras=False)


def test_several_sequences_round_trip_row_by_row():
    reqs = [
        _req([1, 2, 3, 4, 5], [6, 7, 8], end_id=0, hidden_from=4, hidden_layers=(1, 5)),
        _req([9], [], end_id=0, hidden_from=-1, hidden_layers=(1, 5)),
        _req([3, 3, 0, 3], [0], temperature=0.5, seed=11, end_id=0, hidden_from=0, hidden_layers=(1, 5)),
    ]
    tensors = encode_requests(reqs, with_reference_extras=True)
    assert tensors["input_ids"].shape == (3, 5) and tensors["draft_input_ids"].shape == (3, 3)
    assert tensors["draft_input_ids"][1].tolist() == [-1, -1, -1]  # padding, never a token id
    decoded = decode_requests(tensors)
    assert len(decoded) == 3
    for a, b in zip(reqs, decoded):
        assert _same_request(a, b), (a, b)
    assert decoded[0].temperature == 0.0 and decoded[2].temperature == 0.5


def test_a_draft_ending_in_token_zero_keeps_it():
    reqs = [_req([1, 2], [0, 0]), _req([1], [5])]
    assert [r.draft_ids.tolist() for r in decode_requests(encode_requests(reqs, with_reference_extras=False))] == [[0, 0], [5]]


def test_results_of_several_sequences_round_trip_with_their_hidden_rows():
    reqs = [_req([1, 2, 3], [4, 5], hidden_from=2), _req([7, 8], [9, 9, 9], hidden_from=-1), _req([5], [], hidden_from=0)]
    results = [
        VerifyResult(np.array([4, 6], np.int32), 1, np.arange(2 * 4, dtype=np.float32).reshape(2, 4)),  # 3 - 2 + 1 rows
        VerifyResult(np.array([9, 9, 9, 1], np.int32), 3, None),
        VerifyResult(np.array([2], np.int32), 0, np.ones((1, 4), np.float32)),
    ]
    tensors = encode_results(results)
    assert tensors["output_ids"].shape == (3, 1, 4) and tensors["hidden_states"].shape == (3, 2, 4)
    back = decode_results(tensors, reqs)
    for want, got in zip(results, back):
        assert got.output_ids.tolist() == want.output_ids.tolist() and got.num_accepted == want.num_accepted
        if want.hidden_states is None:
            assert got.hidden_states is None
        else:
            assert np.array_equal(got.hidden_states, want.hidden_states)


def test_a_row_that_does_not_fit_is_named():
    tensors = encode_requests([_req([1, 2]), _req([3])], with_reference_extras=False)
    tensors["input_lengths"] = np.array([[2], [5]], np.int32)
    with pytest.raises(BanditSpecValidationError, match=r"input_lengths: 5 does not fit .* \(sequence 1\)"):
        decode_requests(tensors)
    tensors = encode_requests([_req([1, 2], [3]), _req([3], [4])], with_reference_extras=False)
    tensors["seed"] = np.array([[1]], np.uint64)
    with pytest.raises(BanditSpecValidationError, match="seed: expected one value per sequence"):
        decode_requests(tensors)


def test_the_tensor_engine_sends_up_to_max_rows_compatible_sequences_a_call():
    mock = MockEngine(vocab_size=50, eos_id=0)
    calls = []

    def infer(model, tensors, outputs):
        rows = decode_requests(tensors)
        calls.append(len(rows))
        return {k: v for k, v in encode_results(mock.verify(rows)).items() if k in outputs}

    engine = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=2)
    reqs = [_req([1, 2, 3 + i], [mock.target([1, 2, 3 + i]), 1]) for i in range(5)]
    sampled = _req([4, 4], [1], temperature=1.0)
    sampled.draft_probs = np.full((1, 50), 1 / 50, np.float32)  # q: can't share a call with point-mass drafts
    got = engine.verify(reqs + [sampled])
    assert calls == [2, 2, 1, 1]
    solo = mock.verify(reqs + [sampled])
    assert [(g.output_ids.tolist(), g.num_accepted) for g in got] == [(s.output_ids.tolist(), s.num_accepted) for s in solo]
    tensorrtllm = TensorEngine(infer, vocab_size=50, max_context=512, eos_id=0, max_rows=4, tensorrtllm=True)
    assert tensorrtllm.max_rows == 1  # TensorRT-LLM takes one sequence a request


# --- the gatherer -------------------------------------------------------------------------------


class SlowCountingEngine(MockEngine):
    """A mock target that takes ``seconds`` a call, records each call's rows and checks
    that calls never overlap (the gatherer keeps one at the target)."""

    def __init__(self, seconds: float = 0.0, poison: int | None = None):
        super().__init__(vocab_size=50, eos_id=0, max_context=4096)
        self.seconds = seconds
        self.poison = poison
        self.sizes: list[int] = []
        self._inside = 0
        self.overlapped = False
        self._lock = threading.Lock()

    def verify(self, requests):
        with self._lock:
            self._inside += 1
            self.overlapped |= self._inside > 1
            self.sizes.append(len(requests))
        try:
            time.sleep(self.seconds)
            if self.poison is not None and any(self.poison in r.input_ids.tolist() for r in requests):
                raise EngineError("target refused the request")
            return super().verify(requests)
        finally:
            with self._lock:
                self._inside -= 1


def _decode(engine, first: list[int], steps: int) -> list[int]:
    """Plain greedy decoding of ``steps`` tokens through ``engine``, one call a step."""
    seq = list(first)
    for _ in range(steps):
        (result,) = engine.verify([_req(seq)])
        seq.extend(result.output_ids.tolist())
    return seq


def _run_threads(engine, starts, steps):
    out: list = [None] * len(starts)

    def work(i):
        try:
            out[i] = _decode(engine, starts[i], steps)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(starts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_lone_sequence_never_waits():
    inner = SlowCountingEngine()
    gatherer = VerifyGatherer(inner, window_s=5.0, max_rows=8, active=lambda: 1)
    began = time.monotonic()
    got = _decode(gatherer, [1, 2], 20)
    assert time.monotonic() - began < 2.0  # the 5 s window never applied
    assert got == _decode(inner, [1, 2], 20) and inner.sizes.count(1) == len(inner.sizes)


def test_concurrent_sequences_go_out_together_and_each_gets_its_own_tokens():
    inner = SlowCountingEngine(seconds=0.002)
    starts = [[1, 2], [3, 4], [5, 6]]
    gatherer = VerifyGatherer(inner, window_s=5.0, max_rows=8, active=lambda: len(starts))
    began = time.monotonic()
    got = _run_threads(gatherer, starts, 15)
    assert time.monotonic() - began < 5.0  # groups completed by count, not by the window
    assert got == [_decode(MockEngine(vocab_size=50, eos_id=0, max_context=4096), s, 15) for s in starts]
    assert inner.sizes == [3] * 15 and gatherer.calls == 15 and gatherer.rows == 45
    assert not inner.overlapped


def test_a_sequence_that_stays_away_delays_the_others_at_most_the_window():
    inner = SlowCountingEngine()
    gatherer = VerifyGatherer(inner, window_s=0.05, max_rows=8, active=lambda: 2)  # one of the two never calls
    began = time.monotonic()
    _decode(gatherer, [1, 2], 3)
    elapsed = time.monotonic() - began
    assert 3 * 0.05 <= elapsed < 3 * 0.05 + 1.0
    assert inner.sizes == [1, 1, 1]


def test_at_most_max_rows_a_call():
    inner = SlowCountingEngine(seconds=0.003)
    starts = [[i, i + 1] for i in range(1, 6)]
    gatherer = VerifyGatherer(inner, window_s=0.5, max_rows=2, active=lambda: len(starts))
    got = _run_threads(gatherer, starts, 6)
    assert got == [_decode(MockEngine(vocab_size=50, eos_id=0, max_context=4096), s, 6) for s in starts]
    assert max(inner.sizes) == 2 and sum(inner.sizes) == 30


def test_a_step_that_comes_while_a_call_is_out_goes_at_once():
    """It would only queue behind that call: the target's batcher merges what queued."""
    inner = SlowCountingEngine(seconds=0.3)
    gatherer = VerifyGatherer(inner, window_s=0.5, max_rows=8, active=lambda: 3)  # nobody completes a group
    first = threading.Thread(target=_decode, args=(gatherer, [1, 2], 1))
    first.start()  # waits out the window (0.5 s), then its call takes 0.3 s
    time.sleep(0.6)
    began = time.monotonic()
    _decode(gatherer, [3, 4], 1)
    first.join(5)
    assert inner.overlapped  # sent while the first call was at the target, not after its window
    assert time.monotonic() - began < 0.45


def test_a_refused_sequence_fails_alone():
    inner = SlowCountingEngine(poison=7)
    starts = [[1, 2], [7, 7], [3, 4]]
    gatherer = VerifyGatherer(inner, window_s=5.0, max_rows=8, active=lambda: len(starts))
    got = _run_threads(gatherer, starts, 1)
    assert isinstance(got[1], EngineError)
    assert got[0] == _decode(MockEngine(vocab_size=50, eos_id=0, max_context=4096), [1, 2], 1)
    assert got[2] == _decode(MockEngine(vocab_size=50, eos_id=0, max_context=4096), [3, 4], 1)
    assert inner.sizes[0] == 3 and sorted(inner.sizes[1:]) == [1, 1, 1]  # the group, then each alone


def test_a_window_of_zero_is_a_call_per_step():
    inner = SlowCountingEngine()
    gatherer = VerifyGatherer(inner, window_s=0.0, max_rows=8, active=lambda: 3)
    _decode(gatherer, [1, 2], 4)
    assert inner.sizes == [1, 1, 1, 1] and gatherer.calls == 0
    with pytest.raises(ValueError, match="window_s"):
        VerifyGatherer(inner, window_s=-1.0, max_rows=8)


def test_a_waiting_step_never_sends_another_sequence_s_step():
    """A step answered while another sequence's step comes in must return, not carry the
    newcomer's call to the target first (its own sequence would wait a whole extra call)."""
    inner = SlowCountingEngine(seconds=0.3)
    gatherer = VerifyGatherer(inner, window_s=0.2, max_rows=8, active=lambda: 3)
    took: dict[str, float] = {}

    def step(name, ids, delay):
        time.sleep(delay)
        began = time.monotonic()
        gatherer.verify([_req(ids)])
        took[name] = time.monotonic() - began

    threads = [threading.Thread(target=step, args=a) for a in (("a", [1, 2], 0.0), ("b", [3, 4], 0.0), ("c", [5, 6], 0.35))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert took["a"] < 0.2 + 0.3 + 0.15 and took["b"] < 0.2 + 0.3 + 0.15, took  # window + its own call
    assert took["c"] < 0.3 + 0.15, took  # sent at once while a and b's call was out
