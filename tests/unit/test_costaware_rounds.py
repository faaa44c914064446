"""banditspec.decoding.costaware_rounds: one request's rounds under the costaware controller, driven
directly (no decoder): which drafters propose, under which context each proposal is learned,
how a costly drafter's pulls and declines are scored, and when a proposal stops being scored.

A round here: ``choose`` at the sequence's end, then the target's tokens are appended to the
sequence by hand and ``score`` is called, as the decoding session does after each step."""

from __future__ import annotations

import numpy as np
from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import (
    HINT_FLOOR,
    Candidate,
    CostAwarePolicy,
    confidence_level,
    context_bucket,
    hint_level,
)
from banditspec.config import ArmSpec
from banditspec.decoding.costaware_rounds import EXPLORE_DEEPER_BELOW, CostAwareRounds
from banditspec.drafters.base import Draft, DrafterTraits, Preview
from banditspec.evaluation.replay import VirtualClock

FLAT = [1.0 + 0.02 * i for i in range(5)]  # verify cost of k tokens / cost of one (L = 4)
STEEP = [1.0, 1.6, 2.0, 2.4, 2.8]


class Cheap:
    """A drafter that proposes every round (PLD, suffix, REST)."""

    traits = DrafterTraits()


class Costly:
    """A drafter that proposes only when chosen (Eagle, a draft engine)."""

    traits = DrafterTraits(costly=True)


class Previewing(Costly):
    """A costly drafter that previews its first token (Eagle in process)."""

    traits = DrafterTraits(costly=True, previews=True)


class Harness:
    """proposals: drafter name -> f(sequence, max_len) -> token ids (or None: the drafter failed);
    previews: drafter name -> f(sequence) -> Preview | None, for previewing drafters;
    hints: drafter name -> f(sequence) -> float | None, for blind costly drafters with a hint."""

    def __init__(self, drafters: dict, proposals: dict, curve=FLAT, max_len: int = 4, previews: dict | None = None,
                 hints: dict | None = None):
        self.drafters = drafters
        self.proposals = proposals
        self.previews = previews or {}
        self.hints = hints or {}
        self.previewed: list[str] = []  # drafter of each preview asked for
        self.controller = CostAwarePolicy(list(drafters), max_len, CostModel.fixed(curve), None)
        self.rounds = CostAwareRounds(self.controller, self.controller.cost_model, VirtualClock())
        self.arms = [ArmSpec(name, max_len) for name in drafters]
        self.available = list(range(len(self.arms)))
        self.calls: list[tuple[str, int]] = []  # (drafter, max_len) of each proposal asked for
        self.candidates: list[list] = []  # what the controller was offered, per choose
        self.recorded = 0  # controller.record calls (one per open proposal scored)
        choose, record = self.controller.choose, self.controller.record

        self.contexts: list[int | None] = []  # the context each choice was priced at

        def spy_choose(candidates, cap, context=None, start=None, priced=0):
            self.candidates.append(list(candidates))
            self.contexts.append(context)
            return choose(candidates, cap, context, start, priced)

        def spy_record(*args):
            self.recorded += 1
            return record(*args)

        self.controller.choose, self.controller.record = spy_choose, spy_record

    # the request's drafters as the rounds ask them (banditspec.decoding.costaware_rounds.ProposalSource)
    def drafter(self, name):
        return self.drafters.get(name)

    def propose(self, name, max_len):
        self.calls.append((name, max_len))
        ids = self.proposals[name](self.sequence, max_len)
        return None if ids is None else Draft(token_ids=np.asarray(ids, dtype=np.int32)[:max_len])

    def preview(self, name):
        self.previewed.append(name)
        return self.previews[name](self.sequence)

    def hint(self, name):
        return self.hints[name](self.sequence) if name in self.hints else None

    def choose(self, sequence, limit=4):
        self.sequence = list(sequence)
        return self.rounds.choose(self.arms, self.available, limit, len(sequence), self)


def test_no_room_for_a_draft_asks_no_drafter():
    """At a request's last token (limit 0) the round decodes plainly without asking anyone."""
    h = Harness({"a": Cheap(), "e": Costly()}, {"a": lambda s, n: [1] * n, "e": lambda s, n: [1] * n})
    index, draft = h.choose([5, 6, 7], limit=0)
    assert index is None and len(draft) == 0
    assert h.calls == [] and h.controller.rounds == 0


def test_agreement_is_on_the_next_token_only():
    """Two drafters agree when their first tokens are equal, whatever follows: both proposals
    are learned under the 'agreed' context, a third with another first token is not."""
    h = Harness({"a": Cheap(), "b": Cheap(), "c": Cheap()},
                {"a": lambda s, n: [7, 8, 20], "b": lambda s, n: [7, 9, 21], "c": lambda s, n: [3, 9, 20]})
    h.choose([5, 6])
    buckets = {c.drafter: c.bucket for c in h.candidates[0]}
    assert buckets == {"a": context_bucket(0, agreed=True), "b": context_bucket(0, agreed=True),
                       "c": context_bucket(0, agreed=False)}
    assert h.contexts == [2]  # the round is priced at its context: the tokens before it


def test_full_information_scoring_with_a_real_vocabularys_token_ids():
    """Every cheap proposal is scored against the target's tokens once known, with token ids as
    large as a real vocabulary's (49152): 2 of 3 right -> positions 1-3 offered, 1-2 accepted."""
    h = Harness({"a": Cheap()}, {"a": lambda s, n: [40001, 40002, 40003]})
    prompt = [30000, 30001, 30002]
    h.choose(prompt, limit=3)
    h.rounds.score(prompt + [int("40001"), int("40002"), int("45000")])
    bucket = context_bucket(0)
    assert h.controller.local["a"].offered[bucket].tolist() == [1, 1, 1, 0]
    assert h.controller.local["a"].accepted[bucket].tolist() == [1, 1, 0, 0]


def test_a_decided_proposal_is_scored_no_more():
    """Each round's proposal is recorded until its outcome is decided (here: at once, its first
    token is wrong), then dropped: ten rounds, ten records (not 1 + 2 + ... + 10)."""
    h = Harness({"a": Cheap()}, {"a": lambda s, n: [99] * n})
    sequence = [5, 6]
    for _ in range(10):
        h.choose(sequence)
        sequence.append(1)  # the target's token: never 99
        h.rounds.score(sequence)
    assert h.recorded == 10
    assert h.controller.local["a"].offered[:, 0].sum() == 10


def test_a_costly_drafter_that_is_always_wrong_is_tried_then_rarely_re_explored():
    """Its pulls are learned under the context it is chosen under (first position), so its
    optimism fades: over 40 rounds with a steep verify curve it is pulled only a few times."""
    h = Harness({"e": Costly()}, {"e": lambda s, n: [99] * n}, curve=STEEP)
    sequence, pulled = [5, 6], 0
    for _ in range(40):
        index, draft = h.choose(sequence)
        pulled += index is not None
        sequence.append(1)  # the target's token: the draft (99 ...) is wrong at its first token
        h.rounds.score(sequence)
    assert 1 <= pulled <= 6
    assert h.controller.local["e"].offered[0, 0] == pulled and h.controller.local["e"].accepted.sum() == 0


def test_a_costly_drafters_decline_is_scored_as_a_first_token_not_accepted():
    h = Harness({"e": Costly()}, {"e": lambda s, n: []})
    index, draft = h.choose([5, 6])
    assert index is None and len(draft) == 0  # no cheap proposal to fall back on: plain
    local = h.controller.local["e"]
    assert local.offered[0, 0] == 1 and local.offered.sum() == 1 and local.accepted.sum() == 0


def test_the_context_is_the_outcome_of_the_drafters_latest_proposal_by_position():
    """'Whether the drafter's previous proposal had its first token right' is that of its
    latest proposal (by position) whose first token is decided: an older proposal decided
    later does not overwrite it."""
    plans = iter([[1, 2, 3, 4], [9, 9, 9, 9], [], [5, 5, 5, 5]])
    h = Harness({"a": Cheap()}, {"a": lambda s, n: next(plans)})
    sequence = [50, 51]
    h.choose(sequence)  # round 1 at position 2: proposes 1 2 3 4
    assert h.candidates[-1][0].bucket == context_bucket(0, last_hit=None)
    sequence += [1, 2]  # the target said 1 2: right so far, still open
    h.rounds.score(sequence)
    h.choose(sequence)  # round 2 at position 4: proposes 9 ..., its context: round 1 was right
    assert h.candidates[-1][0].bucket == context_bucket(0, last_hit=True)
    sequence += [3]  # round 2's proposal is wrong at once; round 1's still right
    h.rounds.score(sequence)
    h.choose(sequence)  # round 3: no proposal (no match)
    sequence += [4]  # round 1's proposal now decided too, right to its end, but it is older
    h.rounds.score(sequence)
    h.choose(sequence)  # round 4: the latest decided first token is round 2's, wrong
    assert h.candidates[-1][0].bucket == context_bucket(0, last_hit=False)


# --- a blind costly drafter with a hint (Eagle's first-token probe) ------------------------
def last_offer(h: Harness, drafter: str = "e"):
    """The latest candidate of ``drafter`` the controller was offered (a decline's fallback
    choice is offered the cheap candidates only)."""
    return [c for offered in h.candidates for c in offered if c.drafter == drafter][-1]


def test_a_hint_below_the_floor_keeps_the_drafter_out_of_the_round():
    """A hint under HINT_FLOOR (0.0: the session cannot draft now) means no candidate and no call."""
    for chance in (0.0, HINT_FLOOR / 2):
        h = Harness({"e": Costly()}, {"e": lambda s, n: [1] * n}, hints={"e": lambda s, c=chance: c})
        index, draft = h.choose([5, 6])
        assert index is None and len(draft) == 0
        assert h.calls == [] and h.candidates[-1] == [] and h.controller.local["e"].offered.sum() == 0


def test_a_hint_is_the_first_positions_hazard_and_its_level_the_context():
    """The candidate's first position is priced at the hint itself (no optimism, whatever its
    counts say) and its level is the context a pull is scored in, not the hint-less one."""
    chances = iter([0.9, 0.15])
    h = Harness({"e": Costly()}, {"e": lambda s, n: []}, curve=STEEP, hints={"e": lambda s: next(chances)})
    index, _ = h.choose([5, 6])  # a likely hit: pulled, declines
    assert [drafter for drafter, _ in h.calls] == ["e"] and index is None
    high = context_bucket(hint_level(0.9))
    assert high != 0 and last_offer(h).bucket == high and last_offer(h).first_hazard == 0.9
    local = h.controller.local["e"]
    assert local.offered[high, 0] == 1 and local.offered.sum() == 1 and local.accepted.sum() == 0
    h.choose([5, 6, 7])  # an unlikely one: offered in its level, not pulled, though never tried there
    assert last_offer(h).bucket == context_bucket(hint_level(0.15)) != high and len(h.calls) == 1


def test_the_hint_prices_the_first_position_as_it_stands():
    """Same counts, different hints: the utility of a pull follows the hint, not the counts."""
    policy = CostAwarePolicy(["e"], 4, CostModel.fixed(STEEP), None)
    sure = Candidate("e", 4, context_bucket(3), costly=True, first_hazard=0.95)
    unsure = Candidate("e", 4, context_bucket(3), costly=True, first_hazard=0.05)
    assert policy.best([sure], 4).drafter == "e" and policy.best([unsure], 4).drafter is None
    assert policy.best([sure], 4).expected_tokens > 1.9


def test_a_pulled_hinted_drafters_draft_is_scored_in_its_hints_level():
    h = Harness({"e": Costly()}, {"e": lambda s, n: [target_token(len(s)), 999, 999, 999][:n]},
                hints={"e": lambda s: 0.7})
    index, draft = h.choose([5, 6])
    assert index == 0 and len(draft) >= 2
    h.rounds.score([5, 6, target_token(2), 3])  # first token right, second wrong
    bucket = context_bucket(hint_level(0.7))
    local = h.controller.local["e"]
    assert local.offered[bucket, :2].tolist() == [1, 1] and local.accepted[bucket, :2].tolist() == [1, 0]
    assert local.offered[0].sum() == 0


def test_a_drafter_dropped_while_giving_its_hint_is_not_offered():
    """A failing hint drops the drafter (RequestDrafters.hint: None, its arms leave ``available``):
    the round goes on without it instead of choosing an arm no longer served."""
    h = Harness({"e": Costly()}, {"e": lambda s, n: [1] * n}, curve=STEEP)

    def failing(sequence):
        h.available.remove(0)
        return None

    h.hints = {"e": failing}
    index, draft = h.choose([5, 6])
    assert index is None and len(draft) == 0 and h.calls == [] and h.candidates[-1] == []


def test_without_a_hint_a_blind_drafter_keeps_the_plain_context():
    h = Harness({"e": Costly()}, {"e": lambda s, n: []}, hints={"e": lambda s: None})
    h.choose([5, 6])
    assert last_offer(h).bucket == 0 and h.controller.local["e"].offered[0, 0] == 1


# --- a costly drafter that previews its first token (Eagle in process) --------------------
def target_token(position: int) -> int:
    """The scripted target's token at ``position``."""
    return 100 + position % 7


def right_preview(confidence: float, cut_off: float = 0.4):
    return lambda sequence: Preview(target_token(len(sequence)), confidence, cut_off)


def test_a_preview_is_scored_every_round_it_is_not_pulled():
    """Full information on the first position: a previewing drafter's first token is learned
    at every round it is asked for, under its confidence level, without ever being pulled (a
    steep verify curve: the prior alone does not justify a pull); once its evidence says it
    cannot win even in its best context, it is no longer asked (a preview costs a head call)."""
    h = Harness({"e": Previewing()}, {"e": lambda s, n: [999] * n}, curve=STEEP,
                previews={"e": lambda s: Preview(999, 0.9, 0.4)})  # confident, always wrong
    sequence = [5, 6]
    for _ in range(12):
        h.choose(sequence)
        sequence.append(target_token(len(sequence)))
        h.rounds.score(sequence)
    local = h.controller.local["e"]
    asked = len(h.previewed)
    assert 3 <= asked < 12 and h.previewed == ["e"] * asked
    assert local.offered[:, 0].sum() == asked and local.accepted.sum() == 0  # one outcome per preview
    assert local.offered[context_bucket(confidence_level(0.9), agreed=False, last_hit=False), 0] == asked - 1
    assert h.calls == []


def test_a_preview_that_would_decline_is_not_offered_and_costs_no_proposal():
    h = Harness({"e": Previewing()}, {"e": lambda s, n: [1] * n}, previews={"e": lambda s: Preview(7, 0.2, 0.4)})
    index, draft = h.choose([5, 6])
    assert index is None and len(draft) == 0
    assert h.calls == [] and h.previewed == ["e"]
    assert [c.drafter for c in h.candidates[-1]] == []  # not a candidate at all
    assert h.controller.local["e"].offered.sum() == 0  # nothing learned from a preview not offered


def test_a_pulled_previewing_drafter_drafts_one_token_more_while_deeper_positions_are_unknown():
    """The verified draft is the chosen length; the proposal asked for is one longer while the
    position after it has few outcomes, and that extra token is scored once the target speaks."""
    h = Harness({"e": Previewing()}, {"e": lambda s, n: [target_token(len(s) + i) for i in range(n)]},
                previews={"e": right_preview(0.95)})
    sequence = [5, 6]
    for _ in range(60):
        index, draft = h.choose(sequence)
        if index is not None:
            asked = h.calls[-1][1]
            assert asked in (len(draft), len(draft) + 1) and asked >= len(draft)
        sequence += [target_token(len(sequence) + i) for i in range(len(draft) + 1)]
        h.rounds.score(sequence)
    lengths = [n for _, n in h.calls]
    assert any(n > 1 for n in lengths)  # the deeper positions were learned: the length grew
    assert h.calls[-1][1] == 4  # ... to the cap
    local = h.controller.local["e"]
    assert local.offered[:, 3].sum() >= EXPLORE_DEEPER_BELOW / 2  # outcomes at the 4th position, all right
    assert (local.accepted == local.offered).all()


def test_a_preview_is_not_asked_when_the_drafter_cannot_win():
    """A preview costs a head call: when even the drafter's most favourable context cannot beat
    the cheap proposal on offer, it is not asked for (its utility bound is below the floor)."""
    h = Harness({"a": Cheap(), "e": Previewing()},
                {"a": lambda s, n: [target_token(len(s) + i) for i in range(n)], "e": lambda s, n: [0] * n},
                curve=STEEP, previews={"e": lambda s: Preview(999, 0.9, 0.4)})
    sequence = [5, 6]
    for _ in range(30):
        h.choose(sequence)
        sequence += [target_token(len(sequence) + i) for i in range(5)]
        h.rounds.score(sequence)
    assert 1 <= len(h.previewed) < 15  # asked while unknown, then no longer
    controller = h.controller
    candidate = next(c for c in h.candidates[-1] if c.drafter == "a")
    floor = controller.best([candidate], 4, len(sequence)).utility
    from banditspec.bandits.costaware import Candidate
    assert controller.utility_bound(Candidate("e", 4, 0, True, previewed=True), 4, len(sequence)) <= floor


class Lazy:
    """A cheap drafter whose lookup is dearer than the others' (REST): asked only when it could win."""

    traits = DrafterTraits(proposes_lazily=True)


def test_a_lazy_drafter_is_not_asked_when_it_cannot_beat_the_proposals_on_offer():
    """A drafter that is always right keeps the bar high: a lazy drafter that has always been
    wrong stops being asked (its best possible utility is below the floor) and its would-be
    proposals are no longer scored; a lazy drafter that is right is asked every round."""
    right = {"a": lambda s, n: [target_token(len(s) + i) for i in range(n)]}
    wrong = Harness({"a": Cheap(), "r": Lazy()}, {**right, "r": lambda s, n: [0] * n}, curve=STEEP)
    useful = Harness({"a": Cheap(), "r": Lazy()}, {**right, "r": lambda s, n: [target_token(len(s))] * n},
                     curve=STEEP)
    for h in (wrong, useful):
        sequence = [5, 6]
        for _ in range(30):
            h.choose(sequence)
            sequence += [target_token(len(sequence) + i) for i in range(5)]
            h.rounds.score(sequence)
    asked_wrong = sum(d == "r" for d, _ in wrong.calls)
    assert 1 <= asked_wrong < 15  # asked while unknown, then no longer
    assert wrong.controller.local["r"].offered[:, 0].sum() == asked_wrong  # scored only when asked
    assert sum(d == "a" for d, _ in wrong.calls) == 30  # the others are asked every round
    assert sum(d == "r" for d, _ in useful.calls) == 30  # first token right: it could win, so it is asked


def test_a_lazy_drafter_is_asked_when_no_other_proposes():
    """With nothing else on offer the floor is plain decoding: a lazy drafter is asked."""
    h = Harness({"a": Cheap(), "r": Lazy()}, {"a": lambda s, n: [], "r": lambda s, n: [0] * n})
    h.choose([5, 6])
    assert [d for d, _ in h.calls] == ["a", "r"]
