"""Behaviours pinned against an independent expectation (tests that catch what
they claim): stop words where one is a prefix of another, or only a later one matches;
max_tokens at its limit and one past it; a boolean max_tokens through the library API."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.config import GenerationRequest, Limits, validate_request
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.errors import BanditSpecValidationError
from banditspec.serving.controller import Controller, ServingDefaults

from tests.fake_tokenizer import ByteTokenizer
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle
from tests.unit.test_serving import AsciiEngine, RecordingSink, expected_text, inputs

PROMPT = "hello world"
N = 60


def controller_with(limits: Limits | None = None):
    engine = AsciiEngine(vocab_size=257, eos_id=256, max_context=1024)
    drafters = {"right": ScriptedDrafter("right", oracle(engine, length_cap=3)),
                "wrong": ScriptedDrafter("wrong", always_wrong(engine))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters, **({"limits": limits} if limits else {}))
    return Controller(decoder, engine, ByteTokenizer(), ServingDefaults(chat_template=False)), engine


def stop_words_tensor(words):
    return np.array([[w.encode() for w in words]], dtype=object)


def earliest_cut(text: str, words) -> str:
    """The independent expectation: the text before the earliest occurrence of any stop word."""
    found = [text.find(w) for w in words if text.find(w) >= 0]
    return text[: min(found)] if found else text


@pytest.mark.parametrize("order", ["long_first", "short_first"])
@pytest.mark.parametrize("policy", ["vanilla", "ucbspec"])
def test_two_stop_words_one_a_prefix_of_the_other(order, policy):
    controller, engine = controller_with()
    full = expected_text(engine, PROMPT, N)
    long_word = full[20:24]
    short_word = long_word[:2]  # a prefix of the long one; may also occur earlier on its own
    words = [long_word, short_word] if order == "long_first" else [short_word, long_word]
    sink = RecordingSink()
    controller.handle(inputs(PROMPT, N, stop_words=stop_words_tensor(words), policy=np.array([[policy.encode()]], dtype=object)), sink)
    assert not sink.errors
    assert sink.text == earliest_cut(full, words)
    assert len(sink.text) <= 20  # never past the first occurrence of the longer one either


def test_only_a_later_stop_word_matches():
    controller, engine = controller_with()
    full = expected_text(engine, PROMPT, N)
    absent = "zzzzzz"
    assert absent not in full
    word = full[30:33]
    sink = RecordingSink()
    controller.handle(inputs(PROMPT, N, stop_words=stop_words_tensor([absent, word])), sink)
    assert sink.text == earliest_cut(full, [word]) and len(sink.text) <= 30
    assert sink.sent[-1][1]["finish_reason"] == "stop"


def test_max_tokens_at_the_limit_is_served_and_one_past_is_rejected():
    limit = 24
    controller, engine = controller_with(Limits(max_tokens=limit))
    sink = RecordingSink()
    controller.handle(inputs(PROMPT, limit), sink)
    assert not sink.errors and sink.text == expected_text(engine, PROMPT, limit)
    sink = RecordingSink()
    controller.handle(inputs(PROMPT, limit + 1), sink)
    assert sink.errors == [("invalid", f"max_tokens: {limit + 1} exceeds the limit {limit}")]


@pytest.mark.parametrize("value", [True, False, 3.0, "3", None])
def test_the_library_api_rejects_a_max_tokens_that_is_not_an_int(value):
    request = GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=value)
    with pytest.raises(BanditSpecValidationError) as failure:
        validate_request(request, max_context=1024, vocab_size=257, limits=Limits())
    assert str(failure.value).startswith("max_tokens")


def test_the_library_api_accepts_max_tokens_at_the_limit_and_rejects_one_past():
    limits = Limits(max_tokens=10)
    validate_request(GenerationRequest([1, 2, 3], 10), max_context=1024, vocab_size=257, limits=limits)
    with pytest.raises(BanditSpecValidationError, match="max_tokens: 11 exceeds the limit 10"):
        validate_request(GenerationRequest([1, 2, 3], 11), max_context=1024, vocab_size=257, limits=limits)
    # the context bound, at and one past it
    validate_request(GenerationRequest([1, 2, 3], 7), max_context=10, vocab_size=257, limits=limits)
    with pytest.raises(BanditSpecValidationError, match="^max_tokens"):
        validate_request(GenerationRequest([1, 2, 3], 8), max_context=10, vocab_size=257, limits=limits)


# --- every limit of validate_request / parse_arm at its boundary (found by scripts/mutation.sh) ---


def check(request, limits=Limits(max_prompt_tokens=8), vocab_size=257):
    validate_request(request, max_context=1024, vocab_size=vocab_size, limits=limits)


def rejects(field, request, **kw):
    with pytest.raises(BanditSpecValidationError) as failure:
        check(request, **kw)
    assert str(failure.value).startswith(field), str(failure.value)
    return str(failure.value)


def test_prompt_length_at_the_limit_is_served_and_one_past_is_rejected():
    check(GenerationRequest([1] * 8, 4))
    assert "prompt has 9 tokens, the limit is 8" in rejects("text_input", GenerationRequest([1] * 9, 4))


def test_token_ids_must_lie_in_the_vocabulary():
    check(GenerationRequest([0, 256], 4))
    for bad in (-1, 257):
        message = rejects("text_input", GenerationRequest([1, bad], 4))
        assert message.endswith("token ids must be in 0..256")


@pytest.mark.parametrize("value", [True, 3.0, "3"])
def test_max_draft_len_must_be_an_int(value):
    rejects("max_draft_len", GenerationRequest([1, 2], 4, max_draft_len=value))


def test_seed_bounds():
    for good in (0, 2**64 - 1):
        check(GenerationRequest([1, 2], 4, seed=good))
    for bad in (-1, 2**64):
        rejects("random_seed", GenerationRequest([1, 2], 4, seed=bad))


def test_arm_speculation_length_bounds():
    from banditspec.config import ArmSpec, parse_arm

    assert parse_arm("vanilla", 4, ["pld"]) == ArmSpec("", 0)
    assert parse_arm("pld", 4, ["pld"]) == ArmSpec("pld", 4)
    assert parse_arm("pld@1", 4, ["pld"]) == ArmSpec("pld", 1)
    assert parse_arm("pld@4", 4, ["pld"]) == ArmSpec("pld", 4)
    for bad in ("pld@0", "pld@5", "pld@-1"):
        with pytest.raises(BanditSpecValidationError, match=r"^arms: .*must be in 1\.\.max_draft_len=4"):
            parse_arm(bad, 4, ["pld"])
