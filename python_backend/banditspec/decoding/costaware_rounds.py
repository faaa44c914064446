"""One request's rounds under the ``costaware`` controller (:mod:`banditspec.bandits.costaware`):
which drafters propose, what the controller chooses among them, and the full-information
scoring of every proposal once the target's tokens at its positions are known.

Cheap drafters (PLD, suffix) propose every round; a lazy cheap drafter (REST, whose lookup
costs several times theirs) proposes when its most favourable context could beat what the
others offer (a bound, like a preview's below); a costly drafter (Eagle, a
draft engine) proposes only when chosen, and its time is measured into the server-wide cost
model. A costly drafter that previews (``previews``: Eagle in process) shows every round
the first token it would draft and its confidence: that confidence is its context, a round
where it would decline does not offer it, and its first token is scored every round as a
cheap drafter's proposal is (full information on the first position; deeper positions
are learned when it is pulled, one token beyond the chosen length while they are little
known). A costly drafter without previews is chosen blind: a decline (an empty proposal)
is scored as a first token not accepted, and the round takes the best cheap proposal. A
blind drafter's ``hint`` (Eagle's first-token probe: the calibrated chance that a pull now
starts with an accepted token, from the target's latest features, no call) prices its first
position, blended with what pulls at the hint's level yielded (no optimism:
``CostAwarePolicy._hinted_first``); the level (``hint_level``) is the context its pulls are
learned in; below ``HINT_FLOOR`` it is not offered that round."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import (
    HINT_FLOOR,
    Candidate,
    Choice,
    CostAwarePolicy,
    buckets_after,
    confidence_level,
    context_bucket,
    hint_level,
)
from banditspec.config import ArmSpec
from banditspec.drafters.base import Draft, Drafter, Preview

# (drafter, context bucket, position of its first token, tokens, positions scored so far)
OpenProposal = tuple[str, int, int, list[int], int]


class ProposalSource(Protocol):
    """A request's drafters as a controller asks them (:class:`~banditspec.decoding.drafting.RequestDrafters`).
    A drafter that fails in any of these is dropped from the request and answers None."""

    def drafter(self, name: str) -> Drafter | None: ...

    def propose(self, name: str, max_len: int) -> Draft | None: ...

    def preview(self, name: str) -> Preview | None: ...

    def hint(self, name: str) -> float | None: ...


# While a previewing drafter's outcomes at the position after the chosen length number
# fewer than this (request + server), a pull drafts one token more than is verified; the
# extra token is scored once the target has spoken, so the deeper hazards get learned
# (otherwise a length chosen short on the prior stays short). Costs one head step.
EXPLORE_DEEPER_BELOW = 16.0


def _cut(draft: Draft, gamma: int) -> Draft:
    return Draft(draft.token_ids[:gamma], None if draft.probs is None else draft.probs[:gamma])


@dataclass
class _Round:
    """One round's state while :meth:`CostAwareRounds.choose` works through it."""

    arms: Sequence[ArmSpec]
    available: list[int]  # the session's own list: a drafter that fails leaves it at once
    limit: int
    position: int
    drafters: ProposalSource
    drafts: dict[int, Draft] = field(default_factory=dict)  # arm index -> its cheap proposal
    costly: list[Candidate] = field(default_factory=list)  # costly drafters pulled blind
    previewing: list[tuple[int, Candidate]] = field(default_factory=list)  # previewing drafters
    lazy: list[tuple[int, int]] = field(default_factory=list)  # (arm index, cap) of lazy cheap drafters
    candidates: list[Candidate] = field(default_factory=list)  # what the controller chooses among
    eager: list[Candidate] = field(default_factory=list)  # the candidates already priced
    floor: Choice | None = None  # the best eager proposal (the lazy drafters' bar)
    start: Choice | None = None  # the best already priced, the final choice goes on from it
    seen: dict[int, tuple[Preview, Candidate]] = field(default_factory=dict)  # arm index -> (preview, candidate)

    def propose(self, index: int, cap: int) -> None:
        """Arm ``index``'s drafter proposes up to ``cap`` tokens; a non-empty draft is kept."""
        draft = self.drafters.propose(self.arms[index].drafter, cap)
        if draft is not None and len(draft) > 0:
            self.drafts[index] = draft


class CostAwareRounds:
    """clock: the decoder's clock (drafting time is measured with it)."""

    def __init__(self, controller: CostAwarePolicy, cost_model: CostModel, clock: Callable[[], float]):
        self.controller = controller
        self._cost_model = cost_model
        self._clock = clock
        self._open: list[OpenProposal] = []
        # drafter -> (position, first token right?) of its latest proposal whose first token is decided
        self._last_first: dict[str, tuple[int, bool | None]] = {}

    def choose(self, arms: Sequence[ArmSpec], available: list[int], limit: int, position: int,
               drafters: ProposalSource) -> tuple[int | None, Draft]:
        """The round's (arm index, draft); (None, empty) = plain decoding. ``available``: the
        arms still served (a drafter that fails while proposing leaves it); ``position``:
        where the draft's first token would go; ``drafters``: the request's drafters, asked
        for a proposal, a previewing drafter's first token or a blind costly drafter's hint
        (its chance of a first token accepted)."""
        if limit <= 0:
            return None, Draft()
        batch = self._cost_model.batch  # the other sequences' share of the step (None: alone)
        self.controller.price_load(None if batch is None else batch.load())
        state = _Round(arms, available, limit, position, drafters)
        self._ask_eager(state)
        self._ask_lazy(state)
        self._offer_proposals(state)
        self._ask_previews(state)
        state.candidates += state.costly
        choice = self.controller.choose(state.candidates, limit, position, state.start, len(state.eager))
        chosen = None if choice.drafter is None else next(i for i in available if arms[i].drafter == choice.drafter)
        for index, (first, candidate) in state.seen.items():
            if index != chosen:  # its first token is scored as if it had been offered
                self._open.append((candidate.drafter, candidate.bucket, position, [first.token], 0))
        if chosen is None or choice.drafter is None:
            return None, Draft()
        if chosen in state.drafts:
            return chosen, _cut(state.drafts[chosen], choice.gamma)
        return self._pull(state, chosen, choice)

    def _ask_eager(self, state: _Round) -> None:
        """Sort the round's drafters: a costly one becomes a candidate to pull (blind, with its
        hint as context) or to preview; a lazy cheap one waits; every other cheap one proposes."""
        draft_costs = self._cost_model.draft_costs()  # server-wide: (per call, per token)
        available, drafters = state.available, state.drafters
        for index in list(available):
            arm = state.arms[index]
            drafter = drafters.drafter(arm.drafter)
            if index not in available or drafter is None:
                continue
            cap = min(arm.gamma, state.limit)
            traits = drafter.traits
            if traits.drafts_when_chosen:
                per_call, per_token = draft_costs.get(arm.drafter, (0.0, 0.0))  # untried: optimistic
                candidate = Candidate(arm.drafter, cap, 0, True, per_call, per_token)
                if traits.previews:
                    state.previewing.append((index, replace(candidate, previewed=True)))
                    continue
                chance = drafters.hint(arm.drafter)
                if index not in available:
                    continue  # its hint failed: the drafter was dropped
                if chance is not None:
                    if chance < HINT_FLOOR:
                        continue  # a pull would (almost) surely miss, or it cannot draft now
                    candidate = replace(candidate, bucket=context_bucket(hint_level(chance)), first_hazard=chance)
                state.costly.append(candidate)
                continue
            if traits.proposes_lazily:
                state.lazy.append((index, cap))
                continue
            state.propose(index, cap)

    def _ask_lazy(self, state: _Round) -> None:
        """A lazy cheap drafter proposes only when, in its most favourable context, it could beat
        the best of the eager proposals (the floor); the final choice goes on from that floor
        when the lazy proposals left the eager ones' contexts as they were."""
        if not state.lazy:
            return
        arms, drafts = state.arms, state.drafts
        state.eager = [Candidate(arms[i].drafter, len(d), self._bucket(arms[i].drafter, d, drafts)) for i, d in drafts.items()]
        state.floor = self.controller.best(state.eager, state.limit, state.position)
        for index, cap in state.lazy:
            name = arms[index].drafter
            known = buckets_after(self._last_first.get(name, (0, None))[1])
            bound = self.controller.utility_bound(Candidate(name, cap), state.limit, state.position, known)
            if index in state.available and bound > state.floor.value:
                state.propose(index, cap)

    def _offer_proposals(self, state: _Round) -> None:
        """Every cheap proposal becomes a candidate in its context, and is opened for scoring."""
        for index, draft in state.drafts.items():
            drafter_name = state.arms[index].drafter
            bucket = self._bucket(drafter_name, draft, state.drafts)
            self._open.append((drafter_name, bucket, state.position, draft.token_ids.tolist(), 0))
            state.candidates.append(Candidate(drafter_name, len(draft), bucket))
        if state.floor is not None and state.candidates[: len(state.eager)] == state.eager:
            state.start = state.floor

    def _ask_previews(self, state: _Round) -> None:
        """A preview costs a head call: asked only when the drafter, in its most favourable
        context, could beat what the cheap proposals already offer."""
        if not state.previewing:
            return
        controller, limit, position = self.controller, state.limit, state.position
        firsts = [int(d.token_ids[0]) for d in state.drafts.values()]
        start = state.start = controller.best(state.candidates, limit, position, state.start, len(state.eager))
        state.eager = list(state.candidates)
        for index, candidate in state.previewing:
            if index not in state.available or controller.utility_bound(candidate, limit, position) <= start.value:
                continue
            first = state.drafters.preview(state.arms[index].drafter)
            if first is None or first.declines or index not in state.available:
                continue
            last_hit = self._last_first.get(candidate.drafter, (0, None))[1]
            bucket = context_bucket(confidence_level(first.confidence), first.token in firsts, last_hit)
            state.seen[index] = (first, replace(candidate, bucket=bucket))
            state.candidates.append(state.seen[index][1])

    def _pull(self, state: _Round, chosen: int, choice: Choice) -> tuple[int | None, Draft]:
        """Draft with the chosen costly drafter; when it fails or declines, the round takes the
        best cheap proposal."""
        controller = self.controller
        name, length = choice.drafter, choice.gamma
        assert name is not None
        if chosen in state.seen:
            bucket = state.seen[chosen][1].bucket
            if length < state.seen[chosen][1].max_gamma and controller.seen(name, bucket, length) < EXPLORE_DEEPER_BELOW:
                length += 1
        else:
            bucket = next(c.bucket for c in state.costly if c.drafter == name)  # its hint's context (0: none)
        began = self._clock()
        draft = state.drafters.propose(name, length)
        produced = 0 if draft is None else len(draft)
        if draft is not None:
            self._cost_model.observe_draft(name, produced, self._clock() - began)
        if draft is not None and produced == 0:
            # The costly drafter declined (Eagle below its confidence cut-off): an outcome of
            # choosing it, scored as a first token not accepted, so that its estimate says how
            # often choosing it yields a token (not only how good its non-empty drafts are);
            # unscored, a drafter that mostly declines kept being chosen and every such round
            # decoded plainly. The round then takes the best cheap proposal.
            controller.record(name, bucket, 1, 0, 1)
        if draft is None or produced == 0:
            fallback = controller.choose([c for c in state.candidates if not c.costly], state.limit, state.position)
            if fallback.drafter is None:
                return None, Draft()
            index = next(i for i in state.available if state.arms[i].drafter == fallback.drafter)
            return index, _cut(state.drafts[index], fallback.gamma)
        self._open.append((name, bucket, state.position, draft.token_ids.tolist(), 0))
        return chosen, _cut(draft, choice.gamma)

    def _bucket(self, drafter: str, draft: Draft, drafts: dict[int, Draft]) -> int:
        """The context of ``drafter``'s proposal ``draft`` among the round's ``drafts``."""
        first = int(draft.token_ids[0])
        agreed = sum(int(d.token_ids[0]) == first for d in drafts.values()) > 1
        return context_bucket(draft.match_len, agreed, self._last_first.get(drafter, (0, None))[1])

    def note_firsts(self, sequence: Sequence[int]) -> None:
        """What :meth:`score` concludes about each drafter's latest decided first token
        (the next round's context), alone: when the scoring itself is deferred
        (banditspec.decoding.bookkeeping), the next round still knows whether each drafter was just
        right."""
        known = len(sequence)
        for drafter, _, start, tokens, _ in self._open:
            if start < known and tokens and start >= self._last_first.get(drafter, (-1, False))[0]:
                self._last_first[drafter] = (start, sequence[start] == tokens[0])

    def score(self, sequence: Sequence[int], final: bool = False) -> None:
        """Score each open proposal against the tokens known so far (``sequence``: prompt +
        generated); a proposal stays open until its outcome is decided, or ``final``."""
        still_open = []
        for drafter, bucket, start, tokens, done in self._open:
            known = len(sequence) - start
            matched = 0
            while matched < min(known, len(tokens)) and sequence[start + matched] == tokens[matched]:
                matched += 1
            done = self.controller.record(drafter, bucket, len(tokens), matched, known, done)
            if known >= 1 and tokens and start >= self._last_first.get(drafter, (-1, False))[0]:
                self._last_first[drafter] = (start, matched >= 1)
            resolved = matched < min(known, len(tokens)) or matched == len(tokens)
            if not resolved and not final:
                still_open.append((drafter, bucket, start, tokens, done))
        self._open = still_open
