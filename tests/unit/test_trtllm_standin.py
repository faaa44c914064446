"""The TensorRT-LLM stand-in itself (tests/trtllm_standin/standin.py), in process: it must
behave as contract.json says the real model does, or the integration tests prove nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trtllm_standin.standin import BlockCache, StandInError, parse_call

VOCAB = 100


def tensors(ids=(5, 6, 7), n=4, **extra):
    out = {
        "input_ids": np.asarray([list(ids)], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
    }
    out.update({k: np.asarray(v) for k, v in extra.items()})
    return out


def call(**kw):
    return parse_call(tensors(**kw), exclude_input_default=True, max_draft_len=4, vocab_size=VOCAB)


@pytest.mark.parametrize("extra, sampling", [
    ({}, False),
    ({"temperature": [[0.7]]}, False),  # temperature alone: greedy, as TensorRT-LLM
    ({"temperature": [[0.7]], "runtime_top_k": [[1]]}, False),
    ({"temperature": [[0.7]], "runtime_top_k": [[0]], "runtime_top_p": [[0.0]]}, False),
    ({"temperature": [[0.7]], "runtime_top_k": [[0]], "runtime_top_p": [[1.0]]}, True),
    ({"temperature": [[0.7]], "runtime_top_k": [[40]]}, True),
    ({"temperature": [[0.7]], "runtime_top_k": [[1]], "runtime_top_p": [[0.9]]}, False),
])
def test_greedy_unless_top_k_or_top_p(extra, sampling):
    assert call(**extra).sampling is sampling


def test_defaults():
    c = parse_call(tensors(ids=(5, 6, 7)), exclude_input_default=True, max_draft_len=4, vocab_size=VOCAB)
    assert c.input_ids == [5, 6, 7] and c.seed == 0 and c.end_id == -1 and c.temperature == 1.0
    assert c.exclude_input and not c.streaming and not c.perf_metrics


def test_declared_inputs_it_does_not_use_are_ignored():
    plain = call()
    noisy = call(min_tokens=[[3]], repetition_penalty=[[1.2]], lora_task_id=np.array([[7]], dtype=np.uint64))
    assert noisy == plain


@pytest.mark.parametrize("extra, field", [
    ({"request_output_len": [[0]]}, "request_output_len"),
    ({"draft_input_ids": [[1, 2, 3, 4, 5]]}, "Draft tokens length"),
    ({"draft_input_ids": [[1, 200]]}, "draft_input_ids"),
    ({"beam_width": [[2]]}, "beam_width"),
    ({"runtime_top_k": [[5]], "temperature": [[0.0]]}, "temperature"),
])
def test_bad_requests_name_the_input(extra, field):
    with pytest.raises(StandInError, match=f"^{field}"):
        call(**extra)
    with pytest.raises(StandInError, match="^input_ids or encoder_input_features is not present"):
        parse_call({"input_lengths": np.array([[1]])}, exclude_input_default=True, max_draft_len=4, vocab_size=VOCAB)


def test_block_cache_reuses_full_blocks_of_a_known_prefix():
    cache = BlockCache(tokens_per_block=4, max_blocks=3)
    seq = list(range(10))
    assert cache.reused(seq) == 0
    cache.store(seq + [10, 11])  # 12 tokens: 3 full blocks
    assert cache.reused(seq + [10, 11, 12]) == 3
    assert cache.reused(seq + [10, 11]) == 2  # at least one token is left to compute
    assert cache.reused([99] + seq) == 0  # a different first block: nothing
    cache.store(list(range(50, 58)))  # 2 more blocks: the least recently used go
    assert cache.reused(seq + [10, 11, 12]) < 3


@pytest.fixture(scope="module")
def standin():
    from banditspec.engine.models import load_model
    from banditspec.engine.reference import ReferenceEngine

    from tests.trtllm_standin.standin import StandIn

    model, _ = load_model("tiny")
    return StandIn(ReferenceEngine.from_name("tiny"), model.eval(), tokens_per_block=4, max_draft_len=4)


def answer(standin, **kw):
    return [r["output_ids"].reshape(-1).tolist() for r in standin.respond(tensors(ids=(11, 12, 13, 14, 15), **kw))]


def test_after_a_rejection_it_decodes_on_and_leaves_eos_out(standin):
    (plain,) = answer(standin, n=8)
    draft = [plain[0], (plain[1] + 1) % 49152, plain[2]]
    (out,) = answer(standin, n=4, draft_input_ids=np.asarray([draft], dtype=np.int32))
    assert out == plain[:4], "accepted 1 + correction + 2 more target tokens: more than accepted + 1"
    eos = plain[3]
    assert eos not in plain[:3]
    (cut,) = answer(standin, n=8, end_id=np.array([[eos]], dtype=np.int32))
    assert cut == plain[:3], "stops at end_id without returning it"
    chunks = answer(standin, n=4, draft_input_ids=np.asarray([draft], dtype=np.int32), streaming=np.array([[True]]))
    assert chunks == [plain[:2], [plain[2]], [plain[3]]]


def test_sampling_restarts_from_the_seed_per_request(standin):
    sample = {"temperature": np.array([[1.0]], dtype=np.float32), "runtime_top_p": np.array([[1.0]], dtype=np.float32)}
    a = answer(standin, n=6, seed=np.array([[3]], dtype=np.uint64), **sample)
    assert a == answer(standin, n=6, seed=np.array([[3]], dtype=np.uint64), **sample)
    assert a != answer(standin, n=6, seed=np.array([[4]], dtype=np.uint64), **sample)
    assert answer(standin, n=6, temperature=np.array([[1.0]], dtype=np.float32)) == answer(standin, n=6)


def test_perf_metrics_only_when_asked(standin):
    ids = list(range(20, 31))
    first = list(standin.respond(tensors(ids=ids, n=2, return_perf_metrics=np.array([[True]]))))[-1]
    grown = ids + first["output_ids"].reshape(-1).tolist()
    second = list(standin.respond(tensors(ids=grown, n=2, return_perf_metrics=np.array([[True]]))))[-1]
    assert int(second["kv_cache_reused_blocks"][0, 0]) == (len(grown) - 1) // 4
    assert "kv_cache_reused_blocks" not in list(standin.respond(tensors(ids=ids, n=2)))[-1]
