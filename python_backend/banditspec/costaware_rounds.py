"""One request's rounds under the ``costaware`` controller (:mod:`banditspec.bandits.costaware`):
which drafters propose, what the controller chooses among them, and the full-information
scoring of every proposal once the target's tokens at its positions are known.

Cheap drafters (PLD, suffix, REST) all propose every round; a costly drafter (Eagle, a
draft engine) proposes only when chosen, its time is measured into the server-wide cost
model, and a decline (an empty proposal) is scored as a first token not accepted, after
which the round takes the best cheap proposal."""

from __future__ import annotations

from typing import Callable, Sequence

from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import Candidate, CostAwarePolicy, context_bucket
from banditspec.config import ArmSpec
from banditspec.drafters.base import Draft, Drafter

# (drafter, context bucket, position of its first token, tokens, positions scored so far)
OpenProposal = tuple[str, int, int, list[int], int]


def is_costly(drafter: Drafter) -> bool:
    """A drafter whose proposal costs a model call (Eagle, a draft engine): it proposes only
    when chosen and learns from bandit feedback; the others propose every round."""
    return bool(getattr(drafter, "needs_hidden_states", False) or getattr(drafter, "costly", False))


def _cut(draft: Draft, gamma: int) -> Draft:
    return Draft(draft.token_ids[:gamma], None if draft.probs is None else draft.probs[:gamma])


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
               drafter_of: Callable[[str], Drafter | None],
               propose: Callable[[ArmSpec, int], Draft | None]) -> tuple[int | None, Draft]:
        """The round's (arm index, draft); (None, empty) = plain decoding. ``available``: the
        arms still served (a drafter that fails while proposing leaves it); ``position``:
        where the draft's first token would go; ``propose(arm, gamma)``: a proposal, or None
        when the drafter failed (and was dropped)."""
        controller = self.controller
        if limit <= 0:
            return None, Draft()
        candidates, drafts, costly = [], {}, []
        draft_costs = self._cost_model.draft_costs()  # server-wide: (per call, per token)
        for index in list(available):
            arm = arms[index]
            drafter = drafter_of(arm.drafter)
            if index not in available or drafter is None:
                continue
            cap = min(arm.gamma, limit)
            if is_costly(drafter):
                per_call, per_token = draft_costs.get(arm.drafter, (0.0, 0.0))  # untried: optimistic
                costly.append(Candidate(arm.drafter, cap, 0, True, per_call, per_token))
                continue
            draft = propose(arm, cap)
            if draft is not None and len(draft) > 0:
                drafts[index] = draft
        firsts = [int(d.token_ids[0]) for d in drafts.values()]
        for index, draft in drafts.items():
            agreed = firsts.count(int(draft.token_ids[0])) > 1
            last_hit = self._last_first.get(arms[index].drafter, (0, None))[1]
            bucket = context_bucket(draft.match_len, agreed, last_hit)
            drafter_name = arms[index].drafter
            self._open.append((drafter_name, bucket, position, draft.token_ids.tolist(), 0))
            candidates.append(Candidate(drafter_name, len(draft), bucket))
        candidates += costly
        choice = controller.choose(candidates, limit, position)
        if choice.drafter is None:
            return None, Draft()
        index = next(i for i in available if arms[i].drafter == choice.drafter)
        if index in drafts:
            return index, _cut(drafts[index], choice.gamma)
        began = self._clock()
        draft = propose(arms[index], choice.gamma)
        produced = 0 if draft is None else len(draft)
        if draft is not None:
            self._cost_model.observe_draft(choice.drafter, produced, self._clock() - began)
        if draft is not None and produced == 0:
            # The costly drafter declined (Eagle below its confidence cut-off): an outcome of
            # choosing it, scored as a first token not accepted, so that its estimate says how
            # often choosing it yields a token (not only how good its non-empty drafts are);
            # unscored, a drafter that mostly declines kept being chosen and every such round
            # decoded plainly. The round then takes the best cheap proposal.
            controller.record(choice.drafter, 0, 1, 0, 1)
        if draft is None or produced == 0:
            fallback = controller.choose([c for c in candidates if not c.costly], limit, position)
            if fallback.drafter is None:
                return None, Draft()
            index = next(i for i in available if arms[i].drafter == fallback.drafter)
            return index, _cut(drafts[index], fallback.gamma)
        self._open.append((choice.drafter, 0, position, draft.token_ids.tolist(), 0))
        return index, draft

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
