"""A request's tensors parsed once into RequestInputs; the prompt's rules in one place."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN, DEFAULT_POLICY, GenerationRequest, Limits, validate_request
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.config import ServingDefaults
from banditspec.serving.controller import RequestInputs, parse_inputs

from tests.fake_tokenizer import ByteTokenizer


def parse(defaults=ServingDefaults(), **tensors) -> RequestInputs:
    inputs = {"text_input": np.array([b"hello"], dtype=object), "max_tokens": np.array([8], dtype=np.int32), **tensors}
    return parse_inputs(inputs, defaults, vocab_size=257, eos_id=256, max_draft_len_limit=16)


def test_defaults_fill_what_the_request_leaves_out():
    parsed = parse()
    assert (parsed.text_input, parsed.max_tokens, parsed.stream, parsed.policy) == ("hello", 8, False, DEFAULT_POLICY)
    assert (parsed.arms, parsed.max_draft_len, parsed.reward, parsed.stop_words) == (None, DEFAULT_MAX_DRAFT_LEN, "accepted", [])
    assert parse(ServingDefaults(arms=("pld",), chat_template=False)).arms == ["pld"]
    request = parse(ServingDefaults(chat_template=False)).generation_request(ByteTokenizer())
    assert list(request.prompt_ids) == list(b"hello") and request.max_tokens == 8


def test_trtllm_inputs_resolve_into_the_same_fields():
    assert parse(num_draft_tokens=np.array([0], dtype=np.int32)).policy == "vanilla"
    explicit = parse(num_draft_tokens=np.array([0], dtype=np.int32), policy=np.array([b"ucbspec"], dtype=object))
    assert explicit.policy == "ucbspec"
    assert parse(num_draft_tokens=np.array([3], dtype=np.int32)).max_draft_len == 3
    with pytest.raises(BanditSpecValidationError, match="^num_draft_tokens"):
        parse(num_draft_tokens=np.array([17], dtype=np.int32))


def test_num_draft_tokens_from_1_to_the_servers_limit_set_max_draft_len():
    """The server's limit here is 16: 1 and 16 are served as L, 17 is refused (0 = plain)."""
    for k in (1, 16):
        assert parse(num_draft_tokens=np.array([k], dtype=np.int32)).max_draft_len == k
    with pytest.raises(BanditSpecValidationError, match="^num_draft_tokens: must be in 0..16, got 17"):
        parse(num_draft_tokens=np.array([17], dtype=np.int32))


@pytest.mark.parametrize("text", [b"   ", b"a\x00b"])
def test_a_prompt_with_nothing_to_say_is_refused_before_decoding(text):
    parsed = parse(text_input=np.array([text], dtype=object))
    with pytest.raises(BanditSpecValidationError, match="^text_input: (the prompt is empty|contains a NUL)"):
        parsed.generation_request(ByteTokenizer())


def test_an_empty_list_of_token_ids_is_the_same_empty_prompt():
    with pytest.raises(BanditSpecValidationError, match="^text_input: the prompt is empty$"):
        validate_request(GenerationRequest(prompt_ids=[], max_tokens=4), max_context=64, vocab_size=257, limits=Limits())
