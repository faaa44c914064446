"""The stand-in against tests/trtllm_standin/behaviour.json, in process (the served checks are
in tests/integration/test_trtllm_standin.py): each row of the table has a test here or there,
and every test named in the table exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.trtllm_standin.standin import PERF_OUTPUTS, EngineLimits, StandIn, StandInError, new_token_cap

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "tests" / "trtllm_standin" / "behaviour.json").read_text())
LIMITS = EngineLimits(max_input_len=63, max_seq_len=64, max_draft_len=4, tokens_per_block=8)


def test_every_row_names_an_upstream_source_and_an_existing_test():
    for row in TABLE["rows"]:
        assert row["source"] in TABLE["sources"] and row["anchor"] and row["function"], row["id"]
        for ref in re.findall(r"(tests/[\w/]+\.py)::(\w+)", row["test"]):
            text = (ROOT / ref[0]).read_text()
            assert f"def {ref[1]}(" in text, (row["id"], ref)


@pytest.fixture(scope="module")
def standin():
    from banditspec.engine.models import load_model
    from banditspec.engine.reference import ReferenceEngine

    model, _ = load_model("tiny")
    return StandIn(ReferenceEngine.from_name("tiny"), model.eval(), limits=LIMITS)


def request(ids, n, **extra):
    out = {
        "input_ids": np.asarray([list(ids)], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
    }
    out.update({k: np.asarray(v) for k, v in extra.items()})
    return out


def answer(standin, ids, n, **extra):
    (out,) = list(standin.respond(request(ids, n, **extra)))
    return out


def tokens(out) -> list[int]:
    return [int(t) for t in out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])]]


PROMPT = [5, 9, 13, 17, 21, 25, 29, 33]


def test_perf_metrics_write_all_ten_figures(standin):
    plain = answer(standin, PROMPT, 3)
    assert not set(PERF_OUTPUTS) & set(plain)
    out = answer(standin, PROMPT, 3, return_perf_metrics=[[True]])
    assert set(PERF_OUTPUTS) <= set(out)
    for name, dtype in PERF_OUTPUTS.items():
        assert out[name].dtype == dtype and out[name].shape == (1, 1), name
    t = [int(out[n][0, 0]) for n in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")]
    assert t == sorted(t) and t[0] > 1_600_000_000 * 10**9  # ns since the epoch, in order


def test_after_a_rejection_the_engine_decodes_on_to_request_output_len(standin):
    plain = tokens(answer(standin, PROMPT, 5))
    draft = [plain[0], (plain[1] + 1) % 100, plain[2], plain[3]]  # accepted 1, then rejected
    out = answer(standin, PROMPT, len(draft) + 1, draft_input_ids=[draft], return_perf_metrics=[[True]])
    assert tokens(out) == plain[:5]  # 1 accepted + correction + 3 more of its own
    assert int(out["total_accepted_draft_tokens"][0, 0]) == 1 and int(out["total_draft_tokens"][0, 0]) == 4


def test_end_id_stops_and_is_left_out(standin):
    plain = tokens(answer(standin, PROMPT, 6))
    out = tokens(answer(standin, PROMPT, 6, end_id=[[plain[3]]]))
    assert out == plain[: plain.index(plain[3])]
    full = tokens(answer(standin, PROMPT, 2, exclude_input_in_output=[[False]]))
    assert full == PROMPT + plain[:2]


def test_output_is_cut_to_fit_max_seq_len_with_the_per_step_draft_length(standin):
    assert new_token_cap(50, 20, 0, LIMITS) == 64 - 50 - 4  # no draft: the engine's max_draft_len
    assert new_token_cap(50, 20, 2, LIMITS) == 64 - 50 - 2
    assert new_token_cap(50, 10, 4, LIMITS) == 10
    prompt = list(range(3, 53))  # 50 tokens
    assert len(tokens(answer(standin, prompt, 20))) == 10  # silently: no error, no EOS


def test_limits_refuse_a_too_long_prompt_or_draft(standin):
    with pytest.raises(StandInError, match=r"Prompt length \(64\) exceeds maximum input length \(63\)"):
        answer(standin, list(range(64)), 1)
    with pytest.raises(StandInError, match=r"Draft tokens length \(5\) exceeds maximum draft tokens length \(4\)"):
        answer(standin, PROMPT, 6, draft_input_ids=[[1, 2, 3, 4, 5]])


def test_required_inputs(standin):
    with pytest.raises(StandInError, match="request_output_len is not present in the request"):
        list(standin.respond({"input_ids": np.asarray([PROMPT], dtype=np.int32)}))
    with pytest.raises(StandInError, match="input_ids or encoder_input_features is not present"):
        list(standin.respond({"request_output_len": np.array([[1]], dtype=np.int32)}))


def test_input_lengths_does_not_cut_one_sequence(standin):
    whole = tokens(answer(standin, PROMPT, 3))
    told_short = request(PROMPT, 3)
    told_short["input_lengths"] = np.array([[3]], dtype=np.int32)
    (out,) = list(standin.respond(told_short))
    assert tokens(out) == whole


def test_declared_inputs_it_does_not_use_are_ignored(standin):
    noisy = answer(standin, PROMPT, 3, min_tokens=[[3]], repetition_penalty=[[1.2]],
                   lora_task_id=np.array([[7]], dtype=np.uint64))
    assert tokens(noisy) == tokens(answer(standin, PROMPT, 3))


def test_output_ids_and_sequence_length_must_be_requested():
    """The check lives in the Triton glue (it needs the request's requested outputs)."""
    text = (ROOT / "tests" / "trtllm_standin" / "model.py").read_text()
    assert 'for required in ("output_ids", "sequence_length"):' in text
    assert "tensor must be present in list of output tensors" in text
