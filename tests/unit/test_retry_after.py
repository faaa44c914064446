"""The retry hint a retryable server-side error carries: one writer, one reader."""

import pytest
from banditspec.errors import model_down, parse_retry_after, retry_after_message


@pytest.mark.parametrize("seconds", [1, 2, 20, 3600])
def test_a_formatted_hint_parses_back(seconds: int) -> None:
    msg = retry_after_message("banditspec: target unavailable", seconds)
    assert msg == f"banditspec: target unavailable (retry after {seconds} s)"
    assert parse_retry_after(msg) == seconds


def test_the_hint_is_at_least_one_second() -> None:
    assert parse_retry_after(retry_after_message("queue full", 0)) == 1
    assert parse_retry_after(retry_after_message("queue full", -5)) == 1


@pytest.mark.parametrize("msg", [
    "", "plain failure", "retry after 5 s", "(retry after x s)", "(retry after 0 s)",
    "(retry after 5 s) then more", "(retry after -3 s)", "(retry after 2.5 s)",
])
def test_messages_without_a_valid_hint_give_none(msg: str) -> None:
    assert parse_retry_after(msg) is None


def test_trailing_whitespace_and_outer_text_are_tolerated() -> None:
    assert parse_retry_after("in model 'banditspec': queue full (retry after 3 s)\n") == 3


@pytest.mark.parametrize("msg, down", [
    ("target engine failed: target: Stub process 'target_0_0' is not healthy.", True),
    ("Request for unknown model: 'banditspec' has no available versions", True),
    ("target engine failed: no_such_model: Model no_such_model - ... Model 'no_such_model' is not ready.", True),
    ("target engine failed: target: Server not ready", True),
    ("target engine failed: target: the context of 80 tokens is exceeded", False),
    ("max_tokens: must be >= 1", False),
])
def test_triton_words_for_a_down_model(msg: str, down: bool) -> None:
    assert model_down(msg) is down
