"""The decoding loop against a mock target that counts its calls."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.config import DEFAULT_MAX_DRAFT_LEN as L
from banditspec.config import GenerationRequest, Limits
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import generate, run_to_completion
from banditspec.drafters.base import Draft, DrafterTraits
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
    traits = DrafterTraits()

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


def test_the_first_calls_cached_prompt_tokens_reach_the_stats():
    class Caching(MockEngine):  # says it found all but the last input token cached, every call
        def verify(self, requests):
            results = super().verify(requests)
            for request, result in zip(requests, results):
                result.cached_tokens = len(request.input_ids) - 1
            return results

    engine = Caching()
    decoder, _ = make_decoder(engine, right=oracle(engine))
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 12, policy="fixed:right")))
    assert result.stats.cached_prompt_tokens == len(PROMPT) - 1  # the first call's, not a later one's
    assert result.stats.as_dict()["cached_prompt_tokens"] == len(PROMPT) - 1
    plain = MockEngine()  # an engine that does not say: no field
    decoder, _ = make_decoder(plain, right=oracle(plain))
    silent = run_to_completion(plain, decoder.start(GenerationRequest(PROMPT, 12, policy="fixed:right")))
    assert silent.stats.cached_prompt_tokens is None and "cached_prompt_tokens" not in silent.stats.as_dict()


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
    assert f"bad@{L}" in result.stats.dropped_arms
    assert f"bad@{L}" not in result.stats.arms


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
    assert arms.count(f"right@{L}") > 3 * arms.count(f"wrong@{L}")


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


# ---------------------------------------------------------------- pins from the mutation run


class RecordingEngine(MockEngine):
    """A MockEngine that keeps every VerifyRequest it was sent."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.requests = []

    def verify(self, requests):
        self.requests.extend(requests)
        return super().verify(requests)


@pytest.mark.parametrize("max_tokens", range(1, 21))
@pytest.mark.parametrize("max_context", [30, 37, 512])
def test_an_always_right_draft_is_as_long_as_the_arm_and_the_requests_end_allow(max_tokens, max_context):
    """Each step's draft: L = 8 tokens, cut to what the request still may generate (the step
    also emits the target's own token) and to what fits in the context."""
    engine = RecordingEngine(max_context=max_context)
    decoder, _ = make_decoder(engine, right=oracle(engine))
    prompt = list(range(1, 21))  # 20 tokens
    result = run_to_completion(engine, decoder.start(GenerationRequest(prompt, max_tokens=min(max_tokens, max_context - 20),
                                                                       policy="fixed:right", max_draft_len=8)))
    limit = min(max_tokens, max_context - 20)
    assert result.token_ids == engine.vanilla(prompt, limit)
    for request in engine.requests:
        generated = len(request.input_ids) - len(prompt)
        allowed = min(8, limit - generated - 1, max_context - len(request.input_ids) - 1)
        assert len(request.draft_ids) == max(0, allowed)


def test_an_accepted_eos_may_end_the_output_without_a_token_of_the_targets_own():
    """The target (like TensorRT-LLM) stops at an accepted EOS: the draft t1 t2 EOS comes back as
    exactly those 3 tokens, 3 accepted, no bonus token; the request ends at EOS."""
    engine = MockEngine(eos_after=len(PROMPT) + 2)
    decoder, _ = make_decoder(engine, right=oracle(engine))
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 40, policy="fixed:right")))
    assert result.token_ids == engine.vanilla(PROMPT, 40) and len(result.token_ids) == 2
    assert result.finish_reason == "eos" and result.stats.accepted == [3]


class NoBonusEngine(MockEngine):
    """A broken target: returns the accepted draft tokens without its own next token."""

    def verify(self, requests):
        results = super().verify(requests)
        return [type(r)(r.output_ids[: r.num_accepted] if r.num_accepted else r.output_ids, r.num_accepted)
                for r in results]


def test_an_engine_that_returns_no_token_of_its_own_is_refused():
    engine = NoBonusEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine))
    session = decoder.start(GenerationRequest(PROMPT, 20, policy="fixed:right"))
    with pytest.raises(RuntimeError, match=f"engine returned {L} tokens with {L} accepted of {L}"):
        run_to_completion(engine, session)


class HiddenStateEngine(RecordingEngine):
    """Returns hidden states as the contract says: one row per position hidden_from ..
    len(input_ids) - 1 + num_accepted (here the row is the position itself)."""

    provides_hidden_states = True

    def verify(self, requests):
        results = super().verify(requests)
        out = []
        for request, result in zip(requests, results):
            rows = None
            if request.hidden_from >= 0:
                last = len(request.input_ids) - 1 + result.num_accepted
                rows = np.arange(request.hidden_from, last + 1, dtype=np.float32).reshape(-1, 1)
            out.append(type(result)(result.output_ids, result.num_accepted, hidden_states=rows))
        return out


class FeatureSession(ScriptedSession):
    def __init__(self, prompt, propose_fn, seen):
        super().__init__(prompt, propose_fn)
        self.seen = seen

    def observe(self, new_tokens, hidden_states=None):
        super().observe(new_tokens, hidden_states)
        self.seen.extend(int(p) for p in hidden_states.reshape(-1))


class FeatureDrafter(ScriptedDrafter):
    """An Eagle-like drafter: needs the target's hidden states at every position, once each."""

    traits = DrafterTraits(needs_hidden_states=True)

    def __init__(self, name, propose_fn):
        super().__init__(name, propose_fn)
        self.seen: list[int] = []

    def start(self, prompt_ids):
        session = FeatureSession(prompt_ids, self.propose_fn, self.seen)
        self.sessions.append(session)
        return session


@pytest.mark.parametrize("length_cap", [0, 1, 3])
def test_a_feature_drafter_gets_each_positions_hidden_state_once(length_cap):
    """hidden_from asks for the states the drafter lacks: the prompt's at the first step, then
    from the last token appended (the target's own token, never fed to it before)."""
    engine = HiddenStateEngine()
    drafter = FeatureDrafter("eagle", oracle(engine, length_cap=length_cap))
    decoder = SpeculativeDecoder.for_engine(engine, {"eagle": drafter})
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 17, policy="fixed:eagle")))
    assert result.token_ids == engine.vanilla(PROMPT, 17)
    assert engine.requests[0].hidden_from == 0
    assert all(r.hidden_from == len(r.input_ids) - 1 for r in engine.requests[1:])
    # every position whose state was computed, in order, each once (the last token's is never needed)
    assert drafter.seen == list(range(len(PROMPT) + 17 - 1))


def test_a_feature_drafter_with_a_prompt_window_is_sent_the_windows_states_only():
    """A drafter that reads only the prompt's last w positions (Eagle's prompt_window): the
    first step asks the target for the states from position len(prompt) - w on, so that
    neither the target nor a BLS call carries the rest; then every position once, as before."""
    engine = HiddenStateEngine()
    drafter = FeatureDrafter("eagle", oracle(engine, length_cap=2))
    drafter.traits = DrafterTraits(needs_hidden_states=True, prompt_window=3)
    decoder = SpeculativeDecoder.for_engine(engine, {"eagle": drafter})
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 17, policy="fixed:eagle")))
    assert result.token_ids == engine.vanilla(PROMPT, 17)
    assert engine.requests[0].hidden_from == len(PROMPT) - 3
    assert drafter.seen == list(range(len(PROMPT) - 3, len(PROMPT) + 17 - 1))


def test_the_cost_model_learns_the_tokens_each_round_fed():
    """Every round but the first (it also prefilled the prompt) is one observation of the
    verify cost at k = 1 + gamma, the tokens the target was fed."""
    from collections import Counter

    from banditspec.bandits.cost_model import CostModel

    engine = RecordingEngine()
    decoder, _ = make_decoder(engine, right=oracle(engine))
    decoder.cost_model = CostModel(9)
    result = run_to_completion(engine, decoder.start(GenerationRequest(PROMPT, 40, policy="fixed:right", max_draft_len=3)))
    fed = Counter(1 + len(r.draft_ids) for r in engine.requests[1:])
    observations = decoder.cost_model.as_dict()["observations"]
    assert sum(fed.values()) == result.stats.steps - 1 and fed[4] >= 5
    assert observations == [fed.get(k, 0) for k in range(1, 10)]


def test_a_step_streams_every_token_that_cannot_start_a_stop_word():
    """Tokens are held back only while they may be the start of a stop word: with a stop word
    that never begins, each step streams all of its tokens at once."""
    engine = MockEngine()
    expected = engine.vanilla(PROMPT, 30)
    absent = next(t for t in range(1, engine.vocab_size) if t not in expected)
    decoder, _ = make_decoder(engine, right=oracle(engine, length_cap=2))
    session = decoder.start(GenerationRequest(PROMPT, 30, policy="fixed:right", stop_sequences=[[absent, absent]]))
    events = list(generate(engine, session))
    assert all(len(e.new_token_ids) == e.accepted + 1 for e in events[:-1])
    assert [t for e in events for t in e.new_token_ids] == expected
