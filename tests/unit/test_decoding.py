"""The decoding loop against a mock target that counts its calls."""

from __future__ import annotations

import numpy as np
import pytest

from banditspec.config import GenerationRequest, Limits
from banditspec.decoder import SpeculativeDecoder
from banditspec.decoding import generate, run_to_completion
from banditspec.drafters.base import Draft
from banditspec.errors import BanditSpecValidationError
from tests.mock_engine import MockEngine


class ScriptedSession:
    """Proposes with a function of the context; records what it observed."""

    def __init__(self, prompt, propose_fn):
        self.context = list(prompt)
        self.propose_fn = propose_fn
        self.closed = None

    def propose(self, max_len):
        ids = self.propose_fn(self.context, max_len)
        return Draft(token_ids=np.asarray(ids, dtype=np.int32))

    def observe(self, new_tokens, hidden_states=None):
        self.context.extend(int(t) for t in new_tokens)

    def close(self, finished):
        self.closed = finished


class ScriptedDrafter:
    def __init__(self, name, propose_fn):
        self.name = name
        self.propose_fn = propose_fn
        self.sessions = []

    def start(self, prompt_ids):
        session = ScriptedSession(prompt_ids, self.propose_fn)
        self.sessions.append(session)
        return session


def oracle(engine, length_cap=None):
    """Always right: proposes exactly what the target would say."""

    def propose(context, max_len):
        seq, out = list(context), []
        for _ in range(max_len if length_cap is None else min(max_len, length_cap)):
            token = engine.target(seq)
            out.append(token)
            seq.append(token)
        return out

    return propose


def always_wrong(engine):
    def propose(context, max_len):
        seq, out = list(context), []
        for _ in range(max_len):
            token = (engine.target(seq) + 1) % engine.vocab_size or 1
            out.append(token)
            seq.append(token)
        return out

    return propose


def raising(context, max_len):
    raise RuntimeError("drafter bug")


def make_decoder(engine, **drafters):
    drafters = {name: ScriptedDrafter(name, fn) for name, fn in drafters.items()}
    return SpeculativeDecoder.for_engine(engine, drafters), drafters


PROMPT = [5, 9, 13, 4]


@pytest.mark.parametrize("policy", ["vanilla", "ucbspec", "exp3spec", "uniform", "fixed:right", "fixed:wrong"])
@pytest.mark.parametrize("max_draft_len", [1, 4, 8])
def test_every_policy_is_lossless(policy, max_draft_len):
    engine = MockEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine), wrong=always_wrong(engine))
    req = GenerationRequest(PROMPT, max_tokens=57, policy=policy, max_draft_len=max_draft_len, seed=3)
    result = run_to_completion(engine, decoder.start(req))
    assert result.token_ids == engine.vanilla(PROMPT, 57)
    assert result.finish_reason == "length"


def test_always_right_takes_fewer_calls_and_never_overshoots():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine))
    req = GenerationRequest(PROMPT, max_tokens=23, policy="fixed:right", max_draft_len=4)
    result = run_to_completion(engine, decoder.start(req))
    assert result.token_ids == engine.vanilla(PROMPT, 23)
    assert len(result.token_ids) == 23
    # 5 tokens per call (4 accepted + 1); the last call's draft is shortened to fit max_tokens.
    assert engine.calls == 5
    assert result.stats.accepted[:4] == [4, 4, 4, 4]
    assert result.stats.drafted[-1] == 2


def test_always_wrong_still_one_token_per_step():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, wrong=always_wrong(engine))
    req = GenerationRequest(PROMPT, max_tokens=30, policy="fixed:wrong", max_draft_len=4)
    result = run_to_completion(engine, decoder.start(req))
    assert result.token_ids == engine.vanilla(PROMPT, 30)
    assert engine.calls == 30
    assert set(result.stats.accepted) == {0}


def test_gamma_zero_vanilla_never_drafts():
    engine = MockEngine()
    decoder, drafters = make_decoder(engine, right=oracle(engine))
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 12, policy="vanilla")))
    assert engine.verified_draft_tokens == 0
    assert result.stats.arms == ["vanilla"] * 12
    assert drafters["right"].sessions == []


def test_eos_inside_an_accepted_draft_cuts_there():
    engine = MockEngine(eos_after=len(PROMPT) + 6)
    decoder, _ = make_decoder(engine, right=oracle(engine))
    req = GenerationRequest(PROMPT, max_tokens=40, policy="fixed:right", max_draft_len=4)
    result = run_to_completion(engine, decoder.start(req))
    assert result.token_ids == engine.vanilla(PROMPT, 40)
    assert len(result.token_ids) == 6
    assert result.finish_reason == "eos"


def test_stop_word_across_steps_is_cut_and_never_streamed():
    engine = MockEngine()
    expected = engine.vanilla(PROMPT, 40)
    stop = expected[10:13]
    decoder, _ = make_decoder(engine, wrong=always_wrong(engine))
    session = decoder.start(GenerationRequest(PROMPT, 40, policy="fixed:wrong", stop_sequences=[stop]))
    streamed = [t for event in generate(engine, session) for t in event.new_token_ids]
    assert streamed == expected[:10]
    assert session.result().token_ids == expected[:10]
    assert session.finish_reason == "stop"


def test_streamed_tokens_equal_the_result():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine, length_cap=2), wrong=always_wrong(engine))
    session = decoder.start(GenerationRequest(PROMPT, 50, policy="ucbspec", seed=1))
    events = list(generate(engine, session))
    assert len(events) > 1
    assert [t for e in events for t in e.new_token_ids] == session.result().token_ids


def test_a_raising_drafter_is_dropped_and_the_request_finishes():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, bad=raising, right=oracle(engine))
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 30, policy="ucbspec")))
    assert result.token_ids == engine.vanilla(PROMPT, 30)
    assert "bad@4" in result.stats.dropped_arms
    assert "bad@4" not in result.stats.arms


def test_all_drafters_failing_falls_back_to_plain_decoding():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, bad=raising)
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 10, policy="fixed:bad")))
    assert result.token_ids == engine.vanilla(PROMPT, 10)
    assert result.stats.arms == ["vanilla"] * 10


def test_draft_never_overflows_the_context():
    engine = MockEngine(max_context=40)
    decoder, _ = make_decoder(engine, right=oracle(engine))
    req = GenerationRequest(PROMPT, max_tokens=36, policy="fixed:right", max_draft_len=8)
    result = run_to_completion(engine, decoder.start(req))  # MockEngine asserts on overflow
    assert result.token_ids == engine.vanilla(PROMPT, 36)


def test_ucbspec_learns_the_good_arm():
    engine = MockEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine), wrong=always_wrong(engine))
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 300, policy="ucbspec")))
    arms = result.stats.arms
    assert arms.count("right@4") > 3 * arms.count("wrong@4")


def test_cancel_stops_and_closes_drafter_sessions():
    engine = MockEngine()
    decoder, drafters = make_decoder(engine, right=oracle(engine, length_cap=1))
    session = decoder.start(GenerationRequest(PROMPT, 100, policy="fixed:right"))
    stream = generate(engine, session)
    next(stream)
    stream.close()
    assert session.finished and session.finish_reason == "cancelled"
    assert drafters["right"].sessions[0].closed is False
    assert engine.calls == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(prompt_ids=[]), "text_input"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(max_tokens=10**6), "max_tokens"),
        (dict(max_tokens=510), "max_tokens"),  # prompt + max_tokens > context 512
        (dict(policy="greedy-ish"), "policy"),
        (dict(arms=["nope"]), "arms"),
        (dict(arms=["right@9"], max_draft_len=4), "arms"),
        (dict(arms=["right@0"]), "arms"),
        (dict(arms=[]), "arms"),
        (dict(max_draft_len=0), "max_draft_len"),
        (dict(max_draft_len=99), "max_draft_len"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(prompt_ids=[1, 2, 10**6]), "text_input"),
        (dict(policy="fixed:unknown"), "arms"),
    ],
)
def test_bad_input_names_the_field(kwargs, field):
    engine = MockEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine))
    base = dict(prompt_ids=PROMPT, max_tokens=10)
    base.update(kwargs)
    with pytest.raises(BanditSpecValidationError) as info:
        decoder.start(GenerationRequest(**base))
    assert info.value.field == field
    assert str(info.value).startswith(field)


def test_limits_are_configuration():
    engine = MockEngine()
    drafters = {"right": ScriptedDrafter("right", oracle(engine))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters, limits=Limits(max_tokens=8, max_prompt_tokens=3))
    with pytest.raises(BanditSpecValidationError, match="^max_tokens"):
        decoder.start(GenerationRequest([1, 2], 9))
    with pytest.raises(BanditSpecValidationError, match="^text_input"):
        decoder.start(GenerationRequest([1, 2, 3, 4], 5))


def test_a_server_wide_budget_caps_gamma_and_sees_every_step():
    class Budget:
        def __init__(self):
            self.cap, self.steps = 1, []

        def gamma_cap(self):
            return self.cap

        def record_step(self, gamma, tokens, seconds):
            self.steps.append((gamma, tokens))

    engine = MockEngine()
    budget = Budget()
    drafters = {"right": ScriptedDrafter("right", oracle(engine))}
    decoder = SpeculativeDecoder.for_engine(engine, drafters, budget=budget)
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 20, policy="fixed:right")))
    assert result.token_ids == engine.vanilla(PROMPT, 20)
    assert max(result.stats.drafted) == 1 and len(budget.steps) == result.stats.steps
    budget.cap = 0
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 20, policy="fixed:right")))
    assert result.token_ids == engine.vanilla(PROMPT, 20) and max(result.stats.drafted) == 0
