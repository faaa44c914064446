"""The BanditSpec decoding loop (the paper's Algorithm 3) as a sans-I/O session.

A :class:`DecodingSession` never calls the engine itself. Each step the caller asks it
for the next :class:`VerifyRequest` (the session chooses an arm with its policy and has
that arm's drafter propose), runs the engine however it likes, alone or batched with
other sessions, and hands the :class:`VerifyResult` back to :meth:`DecodingSession.apply`,
which appends the accepted tokens, rewards the policy and returns a :class:`StepEvent`
with the tokens that are now safe to stream. :func:`generate` is the simplest driver.

A request owns everything it changes: its policy, its reward state, its drafter
sessions and its trace. The :class:`SpeculativeDecoder` only holds what is shared and
read-only per step (drafters, limits, engine facts).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Generator, Mapping, Sequence

import numpy as np

from banditspec.bandits.base import Policy
from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import Candidate, CostAwarePolicy, SharedAcceptance, context_bucket
from banditspec.bandits.registry import COSTAWARE, ResolvedPolicy, build_policy, resolve_policy
from banditspec.gamma_controller.budget import SpeculationBudget, UnlimitedBudget
from banditspec.config import (
    VANILLA_ARM,
    ArmSpec,
    GenerationRequest,
    Limits,
    validate_request,
)
from banditspec.drafters.base import Draft, Drafter, DraftSession
from banditspec.drafters.deadline import ProposeTimeout, ProposeWorker
from banditspec.engine.contract import Engine, VerifyRequest, VerifyResult
from banditspec.errors import BanditSpecValidationError
from banditspec.rewards import make_reward

log = logging.getLogger(__name__)

FINISH_EOS, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED = "eos", "stop", "length", "cancelled"


@dataclass
class StepEvent:
    """What one step produced.

    new_token_ids: tokens now safe to emit (a tail that could still become a stop word
                   is held back until it is decided)
    """

    arm: str
    drafted: int
    accepted: int
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    step_seconds: float


@dataclass
class SpeculationStats:
    arms: list[str] = field(default_factory=list)  # arm per step
    drafted: list[int] = field(default_factory=list)  # draft length per step
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per step
    step_seconds: list[float] = field(default_factory=list)
    dropped_arms: dict[str, str] = field(default_factory=dict)  # arm -> reason
    generated_tokens: int = 0
    controller: dict | None = None  # costaware: the cost model the request decided with
    # KV-cache blocks the target reused / allocated (engines that report it: TensorRT-LLM)
    kv_cache_reused_blocks: int | None = None
    kv_cache_alloc_new_blocks: int | None = None

    @property
    def steps(self) -> int:
        return len(self.arms)

    @property
    def mean_accepted_tokens(self) -> float:
        """Tokens per target call (accepted draft tokens + the target's own), the usual MAT."""
        return self.generated_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        elapsed = sum(self.step_seconds)
        per_arm: dict[str, dict] = {}
        for arm, drafted, accepted in zip(self.arms, self.drafted, self.accepted):
            entry = per_arm.setdefault(arm, {"pulls": 0, "drafted": 0, "accepted": 0})
            entry["pulls"] += 1
            entry["drafted"] += drafted
            entry["accepted"] += accepted
        return {
            "steps": self.steps,
            "generated_tokens": self.generated_tokens,
            "arms": list(self.arms),
            "drafted": list(self.drafted),
            "accepted": list(self.accepted),
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "tokens_per_second": round(self.generated_tokens / elapsed, 3) if elapsed > 0 else 0.0,
            "per_arm": per_arm,
            "dropped_arms": dict(self.dropped_arms),
            **({"controller": self.controller} if self.controller is not None else {}),
            **({"kv_cache_reused_blocks": self.kv_cache_reused_blocks,
                "kv_cache_alloc_new_blocks": self.kv_cache_alloc_new_blocks}
               if self.kv_cache_reused_blocks is not None else {}),
        }


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only; EOS and stop words excluded
    finish_reason: str
    stats: SpeculationStats


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
        clock=time.perf_counter,
    ):
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
        self.clock = clock

    @classmethod
    def for_engine(cls, engine: Engine, drafters: Mapping[str, Drafter], **kwargs) -> "SpeculativeDecoder":
        usable = {
            name: d
            for name, d in drafters.items()
            if engine.provides_hidden_states or not getattr(d, "needs_hidden_states", False)
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

    def start(self, request: GenerationRequest) -> "DecodingSession":
        validate_request(request, max_context=self.max_context, vocab_size=self.vocab_size, limits=self.limits)
        return DecodingSession(self, request, self.resolve_arms(request))


class DecodingSession:
    """One request's decoding state; see the module docstring for the step protocol."""

    def __init__(self, decoder: SpeculativeDecoder, request: GenerationRequest, resolved: ResolvedPolicy):
        self._decoder = decoder
        self._request = request
        self.arms = arms = resolved.arms
        self._prompt = [int(t) for t in request.prompt_ids]
        self._sequence = list(self._prompt)  # prompt + generated (before stop-word cuts)
        self._generated: list[int] = []
        self._emitted = 0
        self._stop_sequences = [list(map(int, s)) for s in request.stop_sequences]
        self._clock = decoder.clock
        self._cost_model = decoder.cost_model
        chosen = build_policy(
            resolved,
            max_draft_len=request.max_draft_len,
            seed=request.seed,
            reward=request.reward,
            cost_model=decoder.cost_model,
            shared_acceptance=decoder.shared_acceptance,
        )
        # costaware chooses (drafter, gamma) itself; the others choose an arm index
        self.controller: CostAwarePolicy | None = chosen if isinstance(chosen, CostAwarePolicy) else None
        self.policy: Policy | None = None if isinstance(chosen, CostAwarePolicy) else chosen
        self._reward = make_reward(request.reward, decoder.cost_model, request.max_draft_len)
        # Full information: proposals not fully scored, (drafter, bucket, start, tokens,
        # positions scored so far); outcomes are recorded as the target's tokens arrive.
        self._open_proposals: list[tuple[str, int, int, list[int], int]] = []
        self._verify_started = 0.0
        self._available = list(range(len(arms)))
        self.stats = SpeculationStats()
        self.finished = False
        self.finish_reason: str | None = None
        # (arm index, draft length, draft cut short by max_tokens/context, start time)
        self._pending: tuple[int | None, int, bool, float] | None = None
        self._sessions: dict[str, DraftSession] = {}
        # drafters proposed on the calling thread, without the deadline thread (see _call_propose)
        self._inline = {name for name, d in decoder.drafters.items() if getattr(d, "runs_inline", False)}
        self._worker: ProposeWorker | None = None  # created at the first proposal
        used = {a.drafter for a in arms if a.drafter}
        for name in used:
            try:
                self._sessions[name] = decoder.drafters[name].start(self._prompt)
            except Exception as exc:  # a broken drafter costs its arms, not the request
                self._drop_drafter(name, f"start failed: {type(exc).__name__}")
        self._needs_hidden = decoder.provides_hidden_states and any(
            getattr(decoder.drafters[n], "needs_hidden_states", False) for n in self._sessions
        )
        self._hidden_from = 0
        # The target states the feature-hungry drafter reads (EAGLE-3: decoder-layer outputs)
        self._hidden_layers: tuple[int, ...] = ()
        if self._needs_hidden:
            self._hidden_layers = next(
                (tuple(getattr(decoder.drafters[n], "feature_layers", ())) for n in self._sessions
                 if getattr(decoder.drafters[n], "needs_hidden_states", False)), ())

    # -- the step protocol -------------------------------------------------------------
    def next_verify(self) -> VerifyRequest:
        """Choose an arm, draft, and return the verification call for this step."""
        if self.finished:
            raise RuntimeError("the session has finished")
        start = self._clock()
        remaining = self._request.max_tokens - len(self._generated)
        room = self._decoder.max_context - len(self._sequence) - 1
        end_limit = max(0, min(remaining - 1, room))  # what the request's end allows
        limit = max(0, min(end_limit, self._decoder.budget.gamma_cap()))
        arm_index, draft = None, Draft()
        truncated = False
        if self.controller is not None:
            arm_index, draft = self._choose_costaware(limit)
        while self.policy is not None and self._available and limit > 0:
            arm_index = self.policy.select(self._available)
            arm = self.arms[arm_index]
            if not arm.drafter:
                break
            # Cut short by the request's end (max_tokens/context) says little about the arm:
            # no reward. Cut by the server-wide gamma cap, it is the arm as served: rewarded.
            truncated = end_limit < arm.gamma
            proposed = self._propose(arm, min(arm.gamma, limit))
            if proposed is not None:
                draft = proposed
                break
            arm_index, draft = None, Draft()  # the drafter failed and was dropped: choose again
        gamma = len(draft)
        self._pending = (arm_index, gamma, truncated, start)
        self._verify_started = self._clock()
        hidden_from = -1
        if self._needs_hidden:
            hidden_from = self._hidden_from
        return VerifyRequest(
            input_ids=np.asarray(self._sequence, dtype=np.int32),
            draft_ids=draft.token_ids.astype(np.int32, copy=False),
            draft_probs=draft.probs,
            temperature=float(self._request.temperature),
            seed=int(self._request.seed),
            end_id=self._decoder.eos_id,
            hidden_from=hidden_from,
            hidden_layers=self._hidden_layers if hidden_from >= 0 else (),
        )

    def _choose_costaware(self, limit: int) -> tuple[int | None, Draft]:
        """Cheap drafters all propose (full information); the controller picks (drafter,
        gamma) by expected tokens per second; a costly drafter proposes only if picked."""
        controller = self.controller
        assert controller is not None
        if limit <= 0:
            return None, Draft()
        candidates, drafts, costly = [], {}, []
        position = len(self._sequence)
        draft_costs = self._cost_model.draft_costs()  # server-wide: (per call, per token)
        for index in list(self._available):
            arm = self.arms[index]
            drafter = self._decoder.drafters.get(arm.drafter)
            if index not in self._available or drafter is None:
                continue
            cap = min(arm.gamma, limit)
            if _is_costly(drafter):
                per_call, per_token = draft_costs.get(arm.drafter, (0.0, 0.0))  # untried: optimistic
                costly.append(Candidate(arm.drafter, cap, 0, True, per_call, per_token))
                continue
            draft = self._propose(arm, cap)
            if draft is not None and len(draft) > 0:
                drafts[index] = draft
        firsts = [int(d.token_ids[0]) for d in drafts.values()]
        for index, draft in drafts.items():
            agreed = firsts.count(int(draft.token_ids[0])) > 1
            bucket = context_bucket(draft.match_len, agreed)
            drafter_name = self.arms[index].drafter
            self._open_proposals.append((drafter_name, bucket, position, draft.token_ids.tolist(), 0))
            candidates.append(Candidate(drafter_name, len(draft), bucket))
        candidates += costly
        choice = controller.choose(candidates, limit)
        if choice.drafter is None:
            return None, Draft()
        index = next(i for i in self._available if self.arms[i].drafter == choice.drafter)
        if index in drafts:
            draft = drafts[index]
            return index, Draft(draft.token_ids[: choice.gamma], None if draft.probs is None else draft.probs[: choice.gamma])
        began = self._clock()
        draft = self._propose(self.arms[index], choice.gamma)
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
            fallback = controller.choose([c for c in candidates if not c.costly], limit)
            if fallback.drafter is None:
                return None, Draft()
            index = next(i for i in self._available if self.arms[i].drafter == fallback.drafter)
            cheap = drafts[index]
            return index, Draft(cheap.token_ids[: fallback.gamma], None if cheap.probs is None else cheap.probs[: fallback.gamma])
        self._open_proposals.append((choice.drafter, 0, position, draft.token_ids.tolist(), 0))
        return index, draft

    def _score_proposals(self, final: bool = False) -> None:
        """Score each open proposal once the target's tokens at its positions are known."""
        if self.controller is None or not self._open_proposals:
            return
        sequence, still_open = self._sequence, []
        for drafter, bucket, start, tokens, done in self._open_proposals:
            known = len(sequence) - start
            matched = 0
            while matched < min(known, len(tokens)) and sequence[start + matched] == tokens[matched]:
                matched += 1
            done = self.controller.record(drafter, bucket, len(tokens), matched, known, done)
            resolved = matched < min(known, len(tokens)) or matched == len(tokens)
            if not resolved and not final:
                still_open.append((drafter, bucket, start, tokens, done))
        self._open_proposals = still_open

    def apply(self, result: VerifyResult) -> StepEvent:
        """Take the target's verdict for the pending step; returns what to stream."""
        if self._pending is None:
            raise RuntimeError("apply() without a pending next_verify()")
        arm_index, gamma, truncated, start = self._pending
        verify_seconds = self._clock() - self._verify_started
        first_step = not self.stats.steps
        self._pending = None
        output = [int(t) for t in np.asarray(result.output_ids).reshape(-1)]
        accepted = int(result.num_accepted)
        # TensorRT-LLM keeps generating after a rejection until request_output_len = gamma + 1:
        # tokens past accepted + 1 are the target's own (plain decoding), kept like the rest.
        # The reward and stats.accepted count only the accepted draft tokens. (That output
        # starts with the accepted draft tokens is the engine's side of the contract.) An
        # accepted EOS may end the output without a token of the target's own.
        ends_at_eos = len(output) == accepted > 0 and output[-1] == self._decoder.eos_id
        if not 0 <= accepted <= gamma or not (accepted + 1 <= len(output) or ends_at_eos) or len(output) > gamma + 1:
            raise RuntimeError(f"engine returned {len(output)} tokens with {accepted} accepted of {gamma}")
        self._hidden_from = len(self._sequence) + len(output) - 1
        for session_name, session in list(self._sessions.items()):
            try:
                session.observe(output, result.hidden_states)
            except Exception as exc:
                self._drop_drafter(session_name, f"observe failed: {type(exc).__name__}")
        self._append(output)
        for name in ("kv_cache_reused_blocks", "kv_cache_alloc_new_blocks"):
            value = getattr(result, name, None)
            if value is not None:
                setattr(self.stats, name, (getattr(self.stats, name) or 0) + int(value))
        elapsed = self._clock() - start
        self._decoder.budget.record_step(gamma, len(output), elapsed)
        if not first_step:  # the first step also prefills the prompt: not a round's cost
            self._cost_model.observe(1 + gamma, verify_seconds)
            self._cost_model.observe_overhead(max(0.0, elapsed - verify_seconds))
        self._score_proposals(final=self.finished)
        if self.controller is not None:
            arm_name = f"{self.arms[arm_index].drafter}@{gamma}" if arm_index is not None and gamma else VANILLA_ARM
        else:
            arm_name = self.arms[arm_index].name if arm_index is not None else VANILLA_ARM
        # A step whose draft was cut short by max_tokens/context says little about the arm;
        # a drafter that proposes fewer tokens than it may (no match) is rewarded as it did.
        # The first step's time includes the prefill: the throughput reward skips it.
        if self.policy is not None and arm_index is not None and not truncated:
            if not (first_step and self._reward.name == "throughput"):
                self.policy.update(arm_index, self._reward(accepted, elapsed))
        self.stats.arms.append(arm_name)
        self.stats.drafted.append(gamma)
        self.stats.accepted.append(accepted)
        self.stats.step_seconds.append(elapsed)
        self.stats.generated_tokens = len(self._generated)
        return StepEvent(
            arm=arm_name,
            drafted=gamma,
            accepted=accepted,
            new_token_ids=self._take_emittable(),
            finished=self.finished,
            finish_reason=self.finish_reason,
            step_seconds=elapsed,
        )

    def cancel(self) -> None:
        if not self.finished:
            self._finish(FINISH_CANCELLED)

    def controller_stats(self) -> dict | None:
        """The costaware controller's view (cost model, acceptance), for speculation_stats."""
        if self.controller is None:
            return None
        return {"policy": COSTAWARE, "cost_model": self._cost_model.as_dict()}

    def result(self) -> GenerationResult:
        return GenerationResult(list(self._generated), self.finish_reason or "", self.stats)

    # -- internals ---------------------------------------------------------------------
    def _propose(self, arm: ArmSpec, max_len: int) -> Draft | None:
        session = self._sessions.get(arm.drafter)
        if session is None:
            self._drop_drafter(arm.drafter, "unavailable")
            return None
        began = time.perf_counter()
        try:
            draft = self._call_propose(session, max_len, arm.drafter in self._inline)
            ids = np.asarray(draft.token_ids, dtype=np.int64).reshape(-1)[:max_len]
            if ids.size and (ids.min() < 0 or ids.max() >= self._decoder.vocab_size):
                raise ValueError("draft token id out of range")
            probs = draft.probs[: ids.size] if draft.probs is not None else None
        except ProposeTimeout:
            log.warning("drafter %s missed its %.3f s deadline", arm.drafter, self._decoder.drafter_deadline_s)
            self._worker = None  # its thread is stuck in propose(); the next proposal gets a new one
            self._drop_drafter(arm.drafter, "deadline exceeded")
            return None
        except Exception as exc:
            log.warning("drafter %s failed: %s", arm.drafter, exc)
            self._drop_drafter(arm.drafter, f"propose failed: {type(exc).__name__}")
            return None
        deadline = self._decoder.drafter_deadline_s
        if deadline is not None and time.perf_counter() - began > deadline:
            # Lossless either way: this draft is still verified, but the arm is too slow to keep.
            self._drop_drafter(arm.drafter, "deadline exceeded")
        return Draft(token_ids=ids.astype(np.int32), probs=probs)

    def _call_propose(self, session: DraftSession, max_len: int, inline: bool = False) -> Draft:
        """``session.propose(max_len)``, bounded by the decoder's deadline when it has one.
        ``inline``: a drafter that cannot hang (``runs_inline``: the built-in lookups, an
        in-memory index, microseconds in ``banditspec bench-drafters``; the in-process Eagle
        head, bounded compute, no I/O) is called directly: the hand-off to the deadline thread
        cost ~2 ms per call here (thread wake-up), more than a lookup, and costaware asks every
        cheap drafter at every step. Too slow a call still drops the drafter (see _propose)."""
        deadline = self._decoder.drafter_deadline_s
        if deadline is None or inline:
            return session.propose(max_len)
        if self._worker is None:
            self._worker = ProposeWorker()
            weakref.finalize(self, self._worker.stop)  # a session dropped unfinished frees its thread
        return self._worker.call(session.propose, max_len, timeout=deadline)

    def _drop_drafter(self, drafter: str, reason: str) -> None:
        session = self._sessions.pop(drafter, None)
        if session is not None:
            try:
                session.close(finished=False)
            except Exception:
                pass
        for i, arm in enumerate(self.arms):
            if arm.drafter == drafter and i in self._available:
                self._available.remove(i)
                self.stats.dropped_arms[arm.name] = reason

    def _append(self, output: list[int]) -> None:
        eos = self._decoder.eos_id
        for token in output:
            if token == eos:
                self._finish(FINISH_EOS)
                return
            self._sequence.append(token)
            self._generated.append(token)
            cut = self._stop_match()
            if cut is not None:
                del self._generated[cut:]
                self._finish(FINISH_STOP)
                return
            if len(self._generated) >= self._request.max_tokens:
                self._finish(FINISH_LENGTH)
                return

    def _stop_match(self) -> int | None:
        """Start index (in generated) of a stop sequence ending at the last token, if any."""
        gen = self._generated
        for seq in self._stop_sequences:
            n = len(seq)
            if len(gen) >= n and gen[-n:] == seq:
                return len(gen) - n
        return None

    def _held_back(self) -> int:
        """How many trailing generated tokens might still be the start of a stop sequence."""
        gen, longest = self._generated, 0
        for seq in self._stop_sequences:
            for k in range(min(len(seq) - 1, len(gen)), longest, -1):
                if gen[-k:] == seq[:k]:
                    longest = k
                    break
        return longest

    def _take_emittable(self) -> list[int]:
        end = len(self._generated) if self.finished else len(self._generated) - self._held_back()
        new = self._generated[self._emitted:end] if end > self._emitted else []
        self._emitted = max(self._emitted, end)
        return new

    def _finish(self, reason: str) -> None:
        self.finished = True
        self.finish_reason = reason
        self.stats.controller = self.controller_stats()
        for session in self._sessions.values():
            try:
                session.close(finished=reason != FINISH_CANCELLED)
            except Exception:
                pass
        self._sessions.clear()
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


def _is_costly(drafter: Drafter) -> bool:
    """A drafter whose proposal costs a model call (Eagle, a draft engine): it proposes only
    when chosen and learns from bandit feedback; the others propose every round."""
    return bool(getattr(drafter, "needs_hidden_states", False) or getattr(drafter, "costly", False))


def generate(engine: Engine, session: DecodingSession) -> Generator[StepEvent, None, None]:
    """Drive one session against an engine, one verification call per step."""
    try:
        while not session.finished:
            request = session.next_verify()
            (result,) = engine.verify([request])
            yield session.apply(result)
    finally:
        if not session.finished:
            session.cancel()


def run_to_completion(engine: Engine, session: DecodingSession) -> GenerationResult:
    for _ in generate(engine, session):
        pass
    return session.result()
