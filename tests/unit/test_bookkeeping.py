"""When costaware's learning from a step runs (banditspec.decoding.bookkeeping): within the step, after
the next choice, or on a background thread while the target verifies."""

from __future__ import annotations

import threading

import pytest
from banditspec.config import GenerationRequest
from banditspec.decoding.bookkeeping import BackgroundBookkeeper, DeferredBookkeeper, make_bookkeeper
from banditspec.decoding.session import run_to_completion
from banditspec.errors import BanditSpecValidationError

from tests.unit.test_costaware import FLAT, PROMPT, STEEP, timed_decoder
from tests.unit.test_decoding import always_wrong, oracle


def test_the_modes_and_a_bad_one_names_the_field():
    assert make_bookkeeper("now") is None
    assert isinstance(make_bookkeeper("deferred"), DeferredBookkeeper)
    background = make_bookkeeper("background")
    assert isinstance(background, BackgroundBookkeeper)
    background.close(timeout=5)
    with pytest.raises(BanditSpecValidationError, match="bookkeeping"):
        make_bookkeeper("later")


def test_the_background_thread_runs_the_jobs_in_order_off_the_callers_thread_and_survives_a_failure():
    keeper = BackgroundBookkeeper()
    seen: list[tuple[int, str]] = []

    def job(i):
        def run():
            if i == 2:
                raise RuntimeError("a job that fails")
            seen.append((i, threading.current_thread().name))
        return run

    for i in range(5):
        keeper.submit(job(i))
    keeper.close(timeout=5)
    assert [i for i, _ in seen] == [0, 1, 3, 4]
    assert all(name == "banditspec-bookkeeping" for _, name in seen)


def _offered(session, drafter: str) -> float:
    return float(session.controller.policy.local[drafter].offered.sum())


@pytest.mark.parametrize("mode", ["now", "deferred"])
def test_deferred_learning_waits_for_the_next_choice_but_the_context_is_current(mode):
    decoder, engine = timed_decoder(FLAT, bookkeeping=mode, right=oracle, wrong=always_wrong)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=20, arms=["wrong", "right"], max_draft_len=4))
    request = session.next_verify()
    (result,) = engine.verify([request])
    session.apply(result)
    position = len(PROMPT)  # both drafters proposed at the first step, for this position
    # the next round's context: whether each drafter's latest first token was right, either way
    assert session.controller.rounds._last_first["right"] == (position, True)
    assert session.controller.rounds._last_first["wrong"] == (position, False)
    if mode == "now":
        assert _offered(session, "right") > 0 and _offered(session, "wrong") > 0
    else:  # the step's outcomes are learned once the next round is chosen, not before
        assert _offered(session, "right") == 0 and _offered(session, "wrong") == 0
        session.next_verify()
        assert _offered(session, "right") > 0 and _offered(session, "wrong") > 0


class LateBookkeeper:
    """Runs each job one submission late: after the next apply() has already done that
    step's learning itself and the step after it is pending (a background thread that fell
    behind, made deterministic)."""

    def __init__(self):
        self.queued = None

    def submit(self, job):
        if self.queued is not None:
            self.queued()
        self.queued = job


def _choices(mode: str, relative) -> tuple[list[list[str]], list[list[int]]]:
    decoder, engine = timed_decoder(relative, bookkeeping="deferred" if mode == "late" else mode, right=oracle,
                                    wrong=always_wrong)
    if mode == "late":
        decoder.bookkeeper = LateBookkeeper()
    arms, outputs = [], []
    for max_tokens in (40, 25, 60):
        request = GenerationRequest(prompt_ids=PROMPT, max_tokens=max_tokens, arms=["wrong", "right"], max_draft_len=4)
        session = decoder.start(request)
        result = run_to_completion(engine, session)
        assert result.token_ids == engine.engine.vanilla(PROMPT, max_tokens)  # lossless
        assert session._unsettled is None  # the last step was learned before the request ended
        arms.append(list(result.stats.arms))
        outputs.append(result.token_ids)
    if decoder.bookkeeper is not None and hasattr(decoder.bookkeeper, "close"):
        decoder.bookkeeper.close(timeout=5)
    return arms, outputs


@pytest.mark.parametrize("relative", [STEEP, FLAT], ids=["steep", "flat"])
def test_background_learning_makes_the_deferred_choices_deterministically(relative):
    """The background thread changes when the learning runs, never what is chosen: the
    choices are those of the deferred mode, request after request (shared statistics and
    cost model carried over)."""
    deferred = _choices("deferred", relative)
    for _ in range(3):
        assert _choices("background", relative) == deferred
    # a job that runs after its step was already learned does nothing (it must not learn the
    # step after it before that step's next round is chosen)
    assert _choices("late", relative) == deferred


@pytest.mark.parametrize("mode", ["now", "background"])
def test_an_error_in_the_learning_fails_the_request_it_belongs_to(mode):
    decoder, engine = timed_decoder(FLAT, bookkeeping=mode, right=oracle)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=30, arms=["right"], max_draft_len=4))
    calls = 0
    score = session.controller.rounds.score

    def failing(sequence, final=False):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("scoring bug")
        score(sequence, final)

    session.controller.rounds.score = failing
    with pytest.raises(ValueError, match="scoring bug"):
        run_to_completion(engine, session)
    assert session.finished  # cancelled: its drafters closed


def test_a_steps_verify_time_is_the_target_calls_not_the_last_steps_learning():
    """A deferred bookkeeper runs the last step's learning when the next round hands it off
    (a background one may still be running it when the target answers): that time is the
    controller's, so neither the step's verify figure (the bench's, the
    Prometheus one) nor the cost model's observation of the verify curve may include it."""
    decoder, engine = timed_decoder(FLAT, bookkeeping="deferred", right=oracle)
    session = decoder.start(GenerationRequest(prompt_ids=PROMPT, max_tokens=30, arms=["right"], max_draft_len=4))
    score = session.controller.rounds.score

    def slow(sequence, final=False):
        engine.clock.advance(1.0)  # learning that takes a second of the controller's time
        score(sequence, final)

    session.controller.rounds.score = slow
    result = run_to_completion(engine, session)
    assert result.token_ids == engine.engine.vanilla(PROMPT, 30)
    verify = result.stats.verify_seconds
    assert len(verify) > 3 and max(verify[1:]) < 0.5  # the target's calls: ~0.05 s each
    assert sum(result.stats.step_seconds) > len(verify) - 2  # the learning's seconds are the steps'
