"""The shared half of decoding: one :class:`SpeculativeDecoder` per process holds the
drafters, limits, the target's facts and the server-wide statistics (cost model, drafter
acceptance); :meth:`SpeculativeDecoder.start` opens a :class:`~banditspec.decoding.session.DecodingSession`
per request."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import OBJECTIVES, SharedAcceptance
from banditspec.bandits.registry import ResolvedPolicy, resolve_policy
from banditspec.config import GenerationRequest, Limits, validate_request
from banditspec.decoding.bookkeeping import make_bookkeeper
from banditspec.decoding.session import DecodingSession
from banditspec.drafters.base import Drafter
from banditspec.engine.contract import Engine
from banditspec.errors import BanditSpecValidationError
from banditspec.gamma_controller.budget import SpeculationBudget, UnlimitedBudget


class SpeculativeDecoder:
    """Shared, per-process: drafters, limits and the target's facts. Thread-safe:
    it holds no per-request state; :meth:`start` builds a new session per request."""

    def __init__(
        self,
        *,
        drafters: Mapping[str, Drafter],
        vocab_size: int,
        max_context: int,
        eos_id: int,
        provides_hidden_states: bool = False,
        default_arms: Sequence[str] | None = None,
        limits: Limits = Limits(),
        drafter_deadline_s: float | None = 0.5,
        budget: SpeculationBudget | None = None,
        cost_model: CostModel | None = None,
        shared_acceptance: SharedAcceptance | None = None,
        clock: Callable[[], float] = time.perf_counter,
        costaware_objective: str = "ratio",
        bookkeeping: str = "now",
    ) -> None:
        self.drafters = dict(drafters)
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.eos_id = eos_id
        self.provides_hidden_states = provides_hidden_states
        self.default_arms = list(default_arms) if default_arms else list(self.drafters)
        self.limits = limits
        if drafter_deadline_s is not None and not drafter_deadline_s > 0:
            raise BanditSpecValidationError("drafter_deadline_s", f"must be > 0 or None, got {drafter_deadline_s!r}")
        # None: proposals run inline on the caller's thread (no deadline can be enforced).
        self.drafter_deadline_s = drafter_deadline_s
        self.budget: SpeculationBudget = budget or UnlimitedBudget()
        # Server-wide, shared by every request: the platform's round costs and the drafters'
        # acceptance statistics (the costaware policy's warm start). Sized for L <= limits.
        top = limits.max_draft_len
        self.cost_model = cost_model or CostModel(top + 1)
        self.shared_acceptance = shared_acceptance or SharedAcceptance(top)
        # what costaware maximises (bandits.costaware: "ratio", or "rate")
        if costaware_objective not in OBJECTIVES:
            raise BanditSpecValidationError("costaware_objective", f"must be one of {OBJECTIVES}, got {costaware_objective!r}")
        self.costaware_objective = costaware_objective
        # when a costaware step's learning runs (banditspec.decoding.bookkeeping): "now" (within the
        # step), "deferred" (after the next choice, same thread) or "background" (a thread,
        # while the target verifies the next round)
        self.bookkeeper = make_bookkeeper(bookkeeping)
        self.clock = clock

    @classmethod
    def for_engine(cls, engine: Engine, drafters: Mapping[str, Drafter], **kwargs: Any) -> SpeculativeDecoder:
        usable = {
            name: d
            for name, d in drafters.items()
            if engine.provides_hidden_states or not d.traits.needs_hidden_states
        }
        return cls(
            drafters=usable,
            vocab_size=engine.vocab_size,
            max_context=engine.max_context,
            eos_id=engine.eos_id,
            provides_hidden_states=engine.provides_hidden_states,
            **kwargs,
        )

    def resolve_arms(self, request: GenerationRequest) -> ResolvedPolicy:
        """The request's policy kind and the arms it runs over (bandits.registry)."""
        arm_names = list(request.arms) if request.arms is not None else self.default_arms
        return resolve_policy(
            request.policy, arm_names, max_draft_len=request.max_draft_len, known_drafters=list(self.drafters)
        )

    def state_readers(self, names: Iterable[str]) -> tuple[list[Drafter], tuple[int, ...]]:
        """The drafters among ``names`` that read the target's states (Eagle), when the
        target provides them, and the decoder layers they read (() = the last hidden state;
        EAGLE-3: decoder-layer outputs): what a decoding step asks the target for."""
        if not self.provides_hidden_states:
            return [], ()
        readers = [self.drafters[n] for n in names if self.drafters[n].traits.needs_hidden_states]
        return readers, readers[0].traits.feature_layers if readers else ()

    def start(self, request: GenerationRequest) -> DecodingSession:
        validate_request(request, max_context=self.max_context, vocab_size=self.vocab_size, limits=self.limits)
        return DecodingSession(self, request, self.resolve_arms(request))
