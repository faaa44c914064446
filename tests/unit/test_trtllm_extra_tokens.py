"""The decoding loop takes a verify answer as TensorRT-LLM returns it.

A TensorRT-LLM target asked for ``request_output_len = gamma + 1`` tokens with ``gamma`` draft
tokens does not stop after the correction token: it keeps decoding plain tokens until it has
``gamma + 1`` (or meets EOS). So after a rejection at position ``a`` the answer holds
``a`` accepted draft tokens, the correction, and up to ``gamma - a`` more target tokens.
:class:`TrtllmLikeEngine` models that on top of the closed-form mock target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from banditspec.config import GenerationRequest
from banditspec.decoding.decoder import SpeculativeDecoder
from banditspec.decoding.session import run_to_completion
from banditspec.engine.contract import VerifyRequest, VerifyResult

from tests.mock_engine import MockEngine
from tests.unit.test_decoding import PROMPT, ScriptedDrafter, always_wrong, oracle


class TrtllmLikeEngine(MockEngine):
    """Verification, then plain decoding up to gamma + 1 tokens in all (EOS ends it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.extra_tokens = 0  # tokens returned past accepted + 1

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        results = []
        for req, first in zip(requests, super().verify(requests)):
            out = [int(t) for t in first.output_ids]
            seq = [int(t) for t in req.input_ids] + out
            wanted = len(req.draft_ids) + 1
            while len(out) < wanted and out[-1] != req.end_id:
                token = self.target(seq)
                out.append(token)
                seq.append(token)
            self.extra_tokens += len(out) - (first.num_accepted + 1)
            results.append(VerifyResult(np.asarray(out, dtype=np.int32), first.num_accepted))
        return results


def half_right(engine):
    """Right for the first half of the draft, wrong after: partial rejections every step."""
    right, wrong = oracle(engine), always_wrong(engine)

    def propose(context, max_len):
        keep = max_len // 2
        head = right(context, keep)
        return head + wrong(list(context) + head, max_len - keep)

    return propose


def decoder_for(engine):
    drafters = {
        "right": ScriptedDrafter("right", oracle(engine)),
        "wrong": ScriptedDrafter("wrong", always_wrong(engine)),
        "half": ScriptedDrafter("half", half_right(engine)),
    }
    return SpeculativeDecoder.for_engine(engine, drafters)


@pytest.mark.parametrize("policy", ["ucbspec", "exp3spec", "fixed:wrong", "fixed:half", "fixed:right", "vanilla"])
@pytest.mark.parametrize("max_draft_len", [1, 4, 7])
def test_extra_target_tokens_are_kept_and_output_equals_plain_decoding(policy, max_draft_len):
    engine = TrtllmLikeEngine()
    request = GenerationRequest(PROMPT, max_tokens=61, policy=policy, max_draft_len=max_draft_len, seed=5)
    result = run_to_completion(engine, decoder_for(engine).start(request))
    assert result.token_ids == engine.vanilla(PROMPT, 61)
    assert result.finish_reason == "length"
    stats = result.stats
    # accepted counts draft tokens only; the extra tokens are generated tokens, not accepted ones
    assert all(0 <= a <= d for a, d in zip(stats.accepted, stats.drafted))
    assert stats.generated_tokens == 61
    if policy in ("fixed:wrong", "fixed:half") and max_draft_len > 1:
        assert engine.extra_tokens > 0, "the engine under test must really return extra tokens"
        assert sum(stats.accepted) + stats.steps < 61, "extra tokens made fewer steps necessary"


def test_extra_tokens_never_overshoot_max_tokens_or_pass_eos():
    engine = TrtllmLikeEngine(eos_after=len(PROMPT) + 23)
    request = GenerationRequest(PROMPT, max_tokens=40, policy="fixed:wrong", max_draft_len=6)
    result = run_to_completion(engine, decoder_for(engine).start(request))
    assert result.token_ids == engine.vanilla(PROMPT, 40)
    assert result.finish_reason == "eos" and len(result.token_ids) == 23
    for budget in (1, 2, 5, 13):
        engine = TrtllmLikeEngine()
        request = GenerationRequest(PROMPT, max_tokens=budget, policy="fixed:wrong", max_draft_len=6)
        result = run_to_completion(engine, decoder_for(engine).start(request))
        assert result.token_ids == engine.vanilla(PROMPT, budget)


class OverlongEngine(MockEngine):
    """Returns gamma + 2 tokens: more than TensorRT-LLM ever may."""

    def verify(self, requests):
        out = []
        for req, first in zip(requests, super().verify(requests)):
            seq = [int(t) for t in req.input_ids] + [int(t) for t in first.output_ids]
            tokens = list(first.output_ids)
            while len(tokens) < len(req.draft_ids) + 2:
                tokens.append(self.target(seq))
                seq.append(tokens[-1])
            out.append(VerifyResult(np.asarray(tokens, dtype=np.int32), first.num_accepted))
        return out


def test_more_than_gamma_plus_one_tokens_is_an_engine_fault():
    engine = OverlongEngine()
    request = GenerationRequest(PROMPT, max_tokens=30, policy="fixed:wrong", max_draft_len=3)
    with pytest.raises(RuntimeError, match="engine returned 5 tokens"):
        run_to_completion(engine, decoder_for(engine).start(request))


def test_the_throughput_reward_counts_the_extra_tokens_and_the_accepted_reward_does_not():
    from banditspec.bandits.cost_model import CostModel
    from banditspec.decoding.rewards import AcceptedLengthReward, ThroughputReward

    cost = CostModel(5)
    plain = cost.verify_seconds(1)
    reward = ThroughputReward(cost, 4)
    # a rejection at position 1 of 4; the engine decoded on to 5 tokens in 3 plain steps' time
    assert reward(1, 4 * plain, tokens=5) == pytest.approx(5 / 4)
    assert reward(1, 4 * plain) == pytest.approx(2 / 4)  # a target that stops at the correction
    assert AcceptedLengthReward()(1, 4 * plain, tokens=5) == 2.0


def test_the_cost_model_learns_the_verify_pass_apart_from_the_decode_on():
    """The engine's first/last token times separate the verify pass from the plain steps
    after it; without them the step teaches the verify curve nothing."""
    import numpy as np
    from banditspec.engine.tensor_codec import decode_result

    answer = {
        "output_ids": np.array([[[7, 8, 9, 10, 11]]], dtype=np.int32),
        "sequence_length": np.array([[5]], dtype=np.int32),
        "kv_cache_reused_blocks": np.array([[2]], dtype=np.int32),
        "kv_cache_alloc_new_blocks": np.array([[1]], dtype=np.int32),
        "first_token_time_ns": np.array([[1_000_000_000]], dtype=np.int64),
        "last_token_time_ns": np.array([[1_030_000_000]], dtype=np.int64),
    }
    result = decode_result(answer, np.array([7, 99, 98, 97], dtype=np.int32))
    assert result.num_accepted == 1 and result.decode_on_seconds == pytest.approx(0.030)
    del answer["last_token_time_ns"]
    assert decode_result(answer, np.array([7, 99, 98, 97], dtype=np.int32)).decode_on_seconds is None

    class Recorder:
        def __init__(self):
            self.calls = []

        def observe(self, tokens, seconds, context=None):
            self.calls.append((tokens, round(seconds, 6), context))

        def observe_overhead(self, seconds):
            pass

    from banditspec.bandits.vanilla import VanillaPolicy
    from banditspec.decoding.controllers import ArmPolicyController
    from banditspec.decoding.rewards import make_reward
    from banditspec.decoding.session import DecodingSession

    session = DecodingSession.__new__(DecodingSession)
    session._cost_model, session._sequence, session.finished = Recorder(), [], False
    session.controller = ArmPolicyController(VanillaPolicy(), make_reward("accepted"))  # learns nothing later
    session._bookkeep(4, 0.050, 0.060, 100, False, 3, 0.030)
    assert session._cost_model.calls == [(5, 0.020, 100), (1, 0.010, 105)]
    session._cost_model.calls.clear()
    session._bookkeep(4, 0.050, 0.060, 100, False, 3, None)  # no timing: learn nothing
    assert session._cost_model.calls == []
    session._bookkeep(4, 0.050, 0.060, 100, False)  # no extra tokens: the whole call is the verify pass
    assert session._cost_model.calls == [(5, 0.050, 100)]
