"""The controller a decoding session asks each step, one shape for every policy.

A session holds one :class:`StepController`. Each step it offers the controller the
:class:`Round` (the arms still served, how long a draft may be, where it would start) and
the request's drafters; the controller answers with the :class:`Chosen` arm and its draft
(no arm: plain decoding). Once the target has verified, the session tells it the
:class:`StepOutcome` (:meth:`StepController.learn`, on the request's thread) and later has it
score what the target's tokens say about every proposal (:meth:`StepController.score`,
which a bookkeeper may run in the background while the next step verifies, when the
controller ``learns_later``).

* :class:`ArmPolicyController`: the paper's policies (UCBSpec, EXP3Spec, fixed, uniform,
  vanilla) over a fixed list of (drafter, gamma) arms, rewarded per step.
* :class:`CostAwareController`: ``costaware``, which chooses the drafter and gamma each round
  from every cheap drafter's proposal and the cost model (:mod:`.costaware_rounds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from banditspec.bandits.base import Policy
from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import CostAwarePolicy
from banditspec.bandits.registry import COSTAWARE
from banditspec.config import VANILLA_ARM, ArmSpec, arm_text
from banditspec.decoding.costaware_rounds import CostAwareRounds, ProposalSource
from banditspec.decoding.rewards import Reward
from banditspec.drafters.base import Draft


@dataclass(frozen=True)
class Round:
    """What a controller chooses from this step.

    available: the indices of the arms still served (the session's own list: a drafter that
    fails while proposing leaves it at once); limit: the most tokens a draft may hold now (the
    request's end, the server-wide gamma cap); end_limit: the most the request's end alone
    allows; position: where the draft's first token would go (tokens so far)."""

    arms: Sequence[ArmSpec]
    available: list[int]
    limit: int
    end_limit: int
    position: int


@dataclass(frozen=True)
class Chosen:
    """The step's arm (an index into the round's arms; None: plain decoding) and its draft;
    ``truncated``: the draft was cut short by the request's end, so it says little about the arm."""

    arm: int | None = None
    draft: Draft = field(default_factory=Draft)
    truncated: bool = False


@dataclass(frozen=True)
class StepOutcome:
    """What the target made of a step: ``accepted`` draft tokens of ``gamma``, ``produced``
    tokens in all, in ``seconds`` (the whole step); ``first_step``: it also prefilled the prompt."""

    chosen: Chosen
    gamma: int
    accepted: int
    produced: int
    seconds: float
    first_step: bool


class StepController(Protocol):
    learns_later: bool  # its learning from a step (score) may run after the step, on a bookkeeper

    def choose(self, round: Round, drafters: ProposalSource) -> Chosen: ...

    def arm_name(self, arms: Sequence[ArmSpec], chosen: Chosen, gamma: int) -> str:
        """The step's arm as speculation_stats reports it."""
        ...

    def learn(self, outcome: StepOutcome) -> None:
        """The step's reward, on the request's thread, before the next choice."""
        ...

    def note_firsts(self, sequence: Sequence[int]) -> None:
        """The part of :meth:`score` the next choice needs at once, when the scoring waits."""
        ...

    def score(self, sequence: Sequence[int], final: bool) -> None:
        """What the target's tokens so far (``sequence``: prompt + generated) say about the
        proposals still open; ``final``: the request has ended."""
        ...

    def stats(self) -> dict[str, Any] | None:
        """The controller's own view for speculation_stats (None: nothing beyond the arms)."""
        ...


class ArmPolicyController:
    """A policy over fixed arms (the paper's Algorithm 3): it selects an arm, the arm's drafter
    proposes up to the arm's gamma, and the step's reward updates the policy."""

    learns_later = False

    def __init__(self, policy: Policy, reward: Reward):
        self.policy = policy
        self.reward = reward

    def choose(self, round: Round, drafters: ProposalSource) -> Chosen:
        while round.available and round.limit > 0:
            index = self.policy.select(round.available)
            arm = round.arms[index]
            if not arm.drafter:
                return Chosen(index)  # the vanilla arm: plain decoding, rewarded as an arm
            # Cut short by the request's end (max_tokens/context) says little about the arm:
            # no reward. Cut by the server-wide gamma cap, it is the arm as served: rewarded.
            draft = drafters.propose(arm.drafter, min(arm.gamma, round.limit))
            if draft is not None:
                return Chosen(index, draft, round.end_limit < arm.gamma)
            # the drafter failed and was dropped (it left round.available): choose again
        return Chosen()

    def arm_name(self, arms: Sequence[ArmSpec], chosen: Chosen, gamma: int) -> str:
        return arms[chosen.arm].name if chosen.arm is not None else VANILLA_ARM

    def learn(self, outcome: StepOutcome) -> None:
        # A drafter that proposes fewer tokens than it may (no match) is rewarded as it did.
        # The first step's time includes the prefill: the throughput reward skips it.
        chosen = outcome.chosen
        if chosen.arm is None or chosen.truncated or (outcome.first_step and self.reward.name == "throughput"):
            return
        self.policy.update(chosen.arm, self.reward(outcome.accepted, outcome.seconds, outcome.produced))

    def note_firsts(self, sequence: Sequence[int]) -> None:
        return None

    def score(self, sequence: Sequence[int], final: bool) -> None:
        return None

    def stats(self) -> dict[str, Any] | None:
        return None


class CostAwareController:
    """``costaware``: the drafter and gamma of each round, from the round's proposals and the
    cost model; it learns from every proposal's outcome (full information), not a reward."""

    learns_later = True

    def __init__(self, policy: CostAwarePolicy, cost_model: CostModel, rounds: CostAwareRounds):
        self.policy = policy
        self.rounds = rounds
        self._cost_model = cost_model

    def choose(self, round: Round, drafters: ProposalSource) -> Chosen:
        index, draft = self.rounds.choose(round.arms, round.available, round.limit, round.position, drafters)
        return Chosen(index, draft)

    def arm_name(self, arms: Sequence[ArmSpec], chosen: Chosen, gamma: int) -> str:
        return arm_text(arms[chosen.arm].drafter, gamma) if chosen.arm is not None and gamma else VANILLA_ARM

    def learn(self, outcome: StepOutcome) -> None:
        return None  # its learning is the scoring of every proposal (score)

    def note_firsts(self, sequence: Sequence[int]) -> None:
        self.rounds.note_firsts(sequence)

    def score(self, sequence: Sequence[int], final: bool) -> None:
        self.rounds.score(sequence, final=final)
        self._cost_model.refresh()  # the refit (every few steps), here rather than in the next choice

    def stats(self) -> dict[str, Any] | None:
        return {"policy": COSTAWARE, "cost_model": self._cost_model.as_dict()}
