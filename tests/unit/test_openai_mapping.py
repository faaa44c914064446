"""OpenAI request fields -> banditspec inputs, Triton errors -> OpenAI errors (no server)."""

from __future__ import annotations

import pytest
from banditspec.errors import parse_retry_after
from banditspec_server.openai_api.app import (
    ChatRequest,
    CompletionRequest,
    OpenAIError,
    _triton_error,
    _usage,
    common_inputs,
)
from banditspec_server.openai_api.triton import ModelFacts, TritonError

FACTS = ModelFacts(max_tokens_limit=1024, max_context=2048, inputs=frozenset({"text_input", "max_tokens", "top_p", "policy"}))


def test_fields_map_to_banditspec_inputs():
    req = CompletionRequest(model="m", prompt="p", max_tokens=7, temperature=0, seed=5, stop="x", top_p=1.0,
                            policy="vanilla", arms="pld,rest", max_draft_len=3)
    inputs = common_inputs(req, FACTS, None, 16)
    assert inputs == {"max_tokens": 7, "stream": False, "temperature": 0.0, "apply_chat_template": False, "top_p": 1.0,
                      "random_seed": 5, "stop_words": ["x"], "policy": "vanilla", "arms": ["pld,rest"], "max_draft_len": 3}


def test_defaults_follow_openai():
    completion = common_inputs(CompletionRequest(model="m", prompt="p"), FACTS, None, 16)
    assert completion["max_tokens"] == 16 and completion["temperature"] == 1.0
    chat = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert common_inputs(chat, FACTS, 2000, None)["max_tokens"] == 48  # what fits in the context
    assert common_inputs(chat, FACTS, 10, None)["max_tokens"] == 1024  # the server's limit


@pytest.mark.parametrize("kw, param", [(dict(n=2), "n"), (dict(logit_bias={"1": 2.0}), "logit_bias")])
def test_unsupported_fields_are_refused_by_name(kw, param):
    with pytest.raises(OpenAIError) as err:
        common_inputs(CompletionRequest(model="m", prompt="p", **kw), FACTS, None, 16)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    "message, status, param",
    [
        ("top_p: top-p (nucleus) sampling is not supported", 400, "top_p"),
        ("text_input: prompt has 5000 tokens, the limit is 1536", 400, "messages"),
        ("server busy: 8 sequences in flight (max_concurrent_sequences); retry later", 503, None),
        ("target engine failed: target: Stub process 'target_0_0' is not healthy. (retry after 21 s)", 503, None),
        ("server busy: 64 waiting (max_queue); retry later (retry after 3 s)", 503, None),
        ("Request for unknown model: 'banditspec' has no available versions", 503, None),  # unloading: restart
        ("target engine failed: target: boom", 500, None),  # no hint: the target failed, it is not down
        ("decoding failed (RuntimeError)", 500, None),
    ],
)
def test_triton_messages_map_to_status_and_param(message, status, param):
    err = _triton_error(TritonError("", message), "messages", FACTS.inputs, retry_after=lambda: 7)
    assert err.status == status and err.param == param
    assert err.kind == ("invalid_request_error" if status == 400 else "server_error" if status == 500 else "server_busy")
    if status == 503:  # Retry-After: the message's own hint, else the server's restart estimate
        assert err.retry_after == (parse_retry_after(message) or 7) and parse_retry_after(err.message) == err.retry_after
    else:
        assert err.retry_after is None


@pytest.mark.parametrize("status", ["UNAVAILABLE", "CANCELLED"])
def test_a_broken_connection_is_a_503_with_the_restart_estimate(status):
    err = _triton_error(TritonError(status, "the inference server closed the stream (Socket closed)"), "prompt",
                        FACTS.inputs, retry_after=lambda: 19)
    assert (err.status, err.retry_after, err.kind) == (503, 19, "server_busy")
    assert err.message.endswith("(retry after 19 s)")


def test_a_request_without_a_seed_sends_none_so_the_server_draws_a_fresh_one():
    assert "random_seed" not in common_inputs(CompletionRequest(model="m", prompt="p", temperature=0.8), FACTS, None, 16)
    assert common_inputs(CompletionRequest(model="m", prompt="p", seed=0), FACTS, None, 16)["random_seed"] == 0


def test_usage_reports_the_prompt_tokens_the_target_found_cached():
    stats = {"prompt_tokens": 120, "generated_tokens": 16, "cached_prompt_tokens": 98}
    assert _usage(stats) == {"prompt_tokens": 120, "completion_tokens": 16, "total_tokens": 136,
                             "prompt_tokens_details": {"cached_tokens": 98}}
    assert "prompt_tokens_details" not in _usage({"prompt_tokens": 5, "generated_tokens": 1})  # the target did not say
    assert _usage(None) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
