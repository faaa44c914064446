"""The retry hint a retryable server-side error carries: one writer, one reader."""

import pytest

from banditspec.errors import parse_retry_after, retry_after_message


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
