"""The replay evaluator's core (banditspec.evaluation.replay): recording proposals, replaying the real
decoding loop against a recording with a virtual clock, the per-step oracle, and a costly
drafter (Eagle) that proposes only when chosen and costs time per call and per token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from banditspec.bandits.cost_model import CostModel
from banditspec.drafters.base import Draft, DrafterTraits, Preview
from banditspec.evaluation.replay import (
    Trace,
    per_step_oracle_seconds,
    record_costly_proposals,
    record_proposals,
    replay_policy,
)

from tests.mock_engine import MockEngine
from tests.unit.test_decoding import ScriptedDrafter, always_wrong, oracle

EOS = 0
CURVE = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6] + [2.8 + 0.2 * i for i in range(8)]
ONE = 0.05  # seconds of a one-token verify


def traces_for(prompts, tokens=24, **drafter_fns):
    engine = MockEngine(vocab_size=50, eos_id=EOS)
    drafters = {name: ScriptedDrafter(name, fn(engine)) for name, fn in drafter_fns.items()}
    traces = [record_proposals(Trace("code", list(p), engine.vanilla(p, tokens)), drafters, 8) for p in prompts]
    return traces, engine


PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [11, 12, 13, 14, 15]]


def test_a_recording_holds_each_drafters_proposal_at_every_position():
    traces, engine = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    for trace in traces:
        assert len(trace.proposals["right"]) == len(trace.target) == 24
        for i, proposal in enumerate(trace.proposals["right"]):
            assert len(proposal) == 8
            expected = engine.vanilla(trace.prompt_ids + trace.target[:i], 8)
            assert proposal == expected  # what the target says next, from position i
        assert all(p[0] != t for p, t in zip(trace.proposals["wrong"], trace.target))


@pytest.mark.parametrize("policy", ["vanilla", "fixed:right@4", "fixed:wrong@2", "costaware", "ucbspec"])
def test_a_replay_is_lossless_and_charges_each_round_by_the_cost_curve(policy):
    traces, _ = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    platform = CostModel.fixed(CURVE, ONE)
    result = replay_policy(traces, policy, ["right", "wrong"], platform, max_draft_len=4, eos_id=EOS)
    for row in result["rows"]:
        assert row["identical"] and row["tokens"] == 24
        fed = [1 + d for d in row["drafted"]]
        # decode time: every round at the curve's cost of the tokens it fed (the prefill left out)
        assert row["seconds"] == pytest.approx(sum(ONE * CURVE[k - 1] for k in fed))


def test_fixed_arms_replay_their_recorded_acceptance():
    traces, _ = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    platform = CostModel.fixed(CURVE, ONE)
    right = replay_policy(traces, "fixed:right@4", ["right"], platform, max_draft_len=4, eos_id=EOS)["rows"]
    wrong = replay_policy(traces, "fixed:wrong@4", ["wrong"], platform, max_draft_len=4, eos_id=EOS)["rows"]
    # always right: 5 tokens a round (the last round is cut by max_tokens); always wrong: 1
    assert [r["steps"] for r in right] == [5, 5, 5] and all(a in (0, 4) or i == 4 for r in right for i, a in enumerate(r["accepted"]))
    assert [r["steps"] for r in wrong] == [24, 24, 24] and all(a == 0 for r in wrong for a in r["accepted"])


def test_the_per_step_oracle_finds_the_cheapest_path_in_hindsight():
    trace = Trace("code", [1, 2], [5, 6, 7, 8], {"d": [[5, 6, 9], [6, 7, 8], [7, 8], [8]]}, {"d": [0, 0, 0, 0]})
    curve = np.array([0.0, 1.0, 1.1, 1.2, 1.3])
    # by hand: from position 1, d@2 (6, 7 right, + 8) costs 1.2 and ends it; so plain at 0 then that: 2.2.
    # From 0, d@2 (5, 6 + 7) costs 1.2 and leaves 8: + 1.0 = 2.2; d@3 fails at its third token: 1.3 + 1.0.
    # (the last token can never be drafted: a round always ends with the target's own token)
    assert per_step_oracle_seconds(trace, curve, 4, ["d"]) == pytest.approx(2.2)
    # a drafting cost per call and per token changes the choice
    assert per_step_oracle_seconds(trace, curve, 4, ["d"], draft_seconds={"d": (5.0, 0.0)}) == pytest.approx(4.0)


def test_a_surface_platform_charges_each_round_at_its_context():
    """On a platform whose verify cost grows with context (the CPU engine's), each round is
    charged at the request's context then, and so is the per-step oracle's every step."""
    traces, _ = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    table = {c: {k: ONE * CURVE[k - 1] + 1e-4 * c for k in range(1, len(CURVE) + 1)} for c in (0, 1000)}
    platform = CostModel.from_table(table)
    result = replay_policy(traces, "fixed:right@4", ["right"], platform, max_draft_len=4, eos_id=EOS)
    for trace, row in zip(traces, result["rows"]):
        context, expected = len(trace.prompt_ids), 0.0
        for drafted, accepted in zip(row["drafted"], row["accepted"]):
            expected += ONE * CURVE[drafted] + 1e-4 * context
            context += accepted + 1
        assert row["identical"] and row["seconds"] == pytest.approx(expected)
    trace = Trace("code", [1, 2], [5, 6, 7, 8], {"d": [[9], [9], [9], [9]]}, {"d": [0, 0, 0, 0]})
    flat = CostModel.from_table({0: {1: 1.0, 2: 2.0}, 1000: {1: 2.0, 2: 3.0}})  # + 1 ms a context token
    # never right: plain decoding at contexts 2, 3, 4, 5
    assert per_step_oracle_seconds(trace, flat, 4, ["d"]) == pytest.approx(sum(1.0 + c / 1000 for c in (2, 3, 4, 5)))


class FeatureSession:
    """A drafter session that needs the target's states: it proposes the token after the
    last one observed only when it has a state row for every position but the last."""

    def __init__(self, prompt, log):
        self.tokens, self.rows, self.log = list(prompt), 0, log

    def propose(self, max_len):
        if self.rows != len(self.tokens) - 1:
            return Draft()
        return Draft(token_ids=np.asarray([self.tokens[-1] + 1] * max_len, dtype=np.int32))

    def observe(self, new_tokens, hidden_states=None):
        self.log.append((list(new_tokens), None if hidden_states is None else hidden_states[:, 0].tolist()))
        self.tokens.extend(new_tokens)
        self.rows += 0 if hidden_states is None else len(hidden_states)

    def preview(self):
        if self.rows != len(self.tokens) - 1:
            return None
        return Preview(self.tokens[-1] + 1, 0.5 + 0.01 * len(self.tokens), 0.4)

    def close(self, finished):
        pass


class FeatureDrafter:
    traits = DrafterTraits()

    def __init__(self):
        self.log = []

    def start(self, prompt_ids):
        return FeatureSession(prompt_ids, self.log)


def test_a_costly_drafter_is_recorded_from_the_states_decoding_would_give_it():
    trace = Trace("chat", [1, 2, 3], [4, 5, 6])
    features = np.arange(5, dtype=np.float32).reshape(5, 1)  # positions 0..4 of 1 2 3 4 5 (6 is last)
    drafter = FeatureDrafter()
    record_costly_proposals(trace, "eagle", drafter, features, 2)
    # first step: the prompt's rows (0, 1, 2: row 2 produced token 4), then one row per token
    assert drafter.log == [([4], [0.0, 1.0, 2.0]), ([5], [3.0]), ([6], [4.0])]
    assert trace.proposals["eagle"] == [[], [5, 5], [6, 6]]  # nothing before the first state came
    assert trace.previews["eagle"] == [None, [5, 0.54, 0.4], [6, 0.55, 0.4]]  # asked before each proposal
    assert Trace.from_dict(json.loads(json.dumps(trace.as_dict()))).previews == trace.previews
    with pytest.raises(ValueError):
        record_costly_proposals(trace, "eagle", drafter, features[:4], 2)


def test_a_costly_drafter_is_called_only_when_chosen_and_costs_per_call_and_token():
    traces, engine = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    for trace in traces:  # "eagle" here: right at every position, declining at every third
        trace.proposals["eagle"] = [[] if i % 3 == 0 else p[:4] for i, p in enumerate(trace.proposals["right"])]
        trace.match_len["eagle"] = [0] * len(trace.target)
    platform = CostModel.fixed(CURVE, ONE)
    call, token = 0.004, 0.002
    free = replay_policy(traces, "fixed:eagle@4", ["eagle"], platform, max_draft_len=4, eos_id=EOS)["rows"]
    paid = replay_policy(traces, "fixed:eagle@4", ["eagle"], platform, max_draft_len=4, eos_id=EOS,
                         costly={"eagle": (call, token)})["rows"]
    for a, b in zip(free, paid):
        assert a["identical"] and b["identical"] and a["drafted"] == b["drafted"]
        # each round asked eagle once; a decline (drafted 0) costs a call and one token
        drafted_cost = sum(call + token * max(1, d) for d in b["drafted"])
        assert b["seconds"] - a["seconds"] == pytest.approx(drafted_cost)
        assert 0 in b["drafted"] and 4 in b["drafted"]
    # costaware learns from it by bandit feedback only: lossless, and it still drafts with it
    adaptive = replay_policy(traces, "costaware", ["eagle", "wrong"], platform, max_draft_len=4, eos_id=EOS,
                             costly={"eagle": (call, token)})["rows"]
    assert all(r["identical"] for r in adaptive)
    assert any(arm.startswith("eagle@") for r in adaptive for arm in r["arms"])


def test_a_previewing_costly_drafter_is_replayed_with_its_recorded_previews_at_their_cost(monkeypatch):
    """With a preview cost, the recorded previews are served every round the controller asks
    (each advancing the clock by that cost), and a round whose preview would decline never
    pulls the drafter. Without one, it is replayed blind (serving's default) and pulls decline."""
    import banditspec.evaluation.replay as replay

    traces, engine = traces_for(PROMPTS, right=oracle, wrong=always_wrong)
    for trace in traces:  # right where confident (0.9), declining at every third position (0.1)
        trace.proposals["eagle"] = [[] if i % 3 == 0 else p[:4] for i, p in enumerate(trace.proposals["right"])]
        trace.match_len["eagle"] = [0] * len(trace.target)
        trace.previews["eagle"] = [[p[0] if p else 0, 0.1 if i % 3 == 0 else 0.9, 0.4]
                                   for i, p in enumerate(trace.proposals["right"])]
    pulls: list[int] = []  # tokens each eagle proposal gave
    propose = replay._ReplaySession.propose

    def counted(self, max_len):
        draft = propose(self, max_len)
        if self._drafter.name == "eagle":
            pulls.append(len(draft))
        return draft

    monkeypatch.setattr(replay._ReplaySession, "propose", counted)
    platform = CostModel.fixed(CURVE, ONE)

    def run(preview_seconds):
        pulls.clear()
        rows = replay_policy(traces, "costaware", ["eagle", "wrong"], platform, max_draft_len=4, eos_id=EOS,
                             costly={"eagle": (0.004, 0.002)}, preview_seconds=preview_seconds)["rows"]
        assert all(r["identical"] for r in rows)
        return rows, list(pulls)

    blind, blind_pulls = run(None)
    seen, seen_pulls = run({"eagle": 0.001})
    assert 0 in blind_pulls  # blind: some pulls declined
    assert seen_pulls and 0 not in seen_pulls  # previewed: a pull never declines
    # each preview advances the clock by its cost and serves the recorded preview of its position
    clock = replay.VirtualClock()
    drafter = replay.ReplayDrafter("eagle", traces, clock, costly=True, preview_seconds=0.001)
    assert drafter.traits.previews and not replay.ReplayDrafter("eagle", traces, clock, costly=True).traits.previews
    session = drafter.start(traces[0].prompt_ids)
    session.observe(traces[0].target[:1])
    first = session.preview()
    assert clock.now == pytest.approx(0.001)
    assert (first.token, first.confidence, first.declines) == (traces[0].previews["eagle"][1][0], 0.9, False)


def test_replayed_drafters_are_asked_as_serving_asks_them():
    """REST proposes lazily in serving (costaware asks it only when it could win): its replayed
    stand-in does too, and the other built-in and unknown drafters do not."""
    from banditspec.drafters.registry import drafter_class
    from banditspec.evaluation import replay

    assert drafter_class("rest").traits.proposes_lazily
    clock = replay.VirtualClock()
    lazy = {name: replay.ReplayDrafter(name, [], clock).traits.proposes_lazily for name in ("pld", "suffix", "rest", "x")}
    assert lazy == {"pld": False, "suffix": False, "rest": True, "x": False}


def test_the_replay_cli_skips_each_workloads_first_prompts_for_a_held_out_set():
    """--skip N --prompts M: prompts N .. N + M - 1 of each workload, interleaved; none of
    the first N (what --prompts N tuned on)."""
    import argparse

    from banditspec.errors import BanditSpecValidationError
    from banditspec_client.replay import _prompts

    def args(**kw):
        return argparse.Namespace(prompts_file=None, workloads="code,chat", **kw)

    tuned = _prompts(args(prompts=3, skip=0))
    held = _prompts(args(prompts=2, skip=3))
    both = _prompts(args(prompts=5, skip=0))
    assert [k for k, _ in held] == ["code", "chat", "code", "chat"]
    assert not {t for _, t in held} & {t for _, t in tuned}
    assert [t for _, t in held] == [t for _, t in both[6:]]
    with pytest.raises(BanditSpecValidationError, match="skip"):
        _prompts(args(prompts=2, skip=-1))
