"""The BanditSpec decoding loop (the paper's Algorithm 3) as a sans-I/O session.

A :class:`DecodingSession` never calls the engine itself. Each step the caller asks it
for the next :class:`VerifyRequest` (the session chooses an arm with its policy and has
that arm's drafter propose), runs the engine however it likes, alone or batched with
other sessions, and hands the :class:`VerifyResult` back to :meth:`DecodingSession.apply`,
which appends the accepted tokens, rewards the policy and returns a
:class:`~banditspec.decoding.results.StepEvent` with the tokens that are now safe to stream.
:func:`generate` is the simplest driver.

A request owns everything it changes: its policy, its reward state, its drafter
sessions (:class:`~banditspec.decoding.drafting.RequestDrafters`) and its trace. What is shared
across requests (drafters, limits, engine facts, server-wide statistics) is the
:class:`~banditspec.decoding.decoder.SpeculativeDecoder` that starts it (seen here through
:class:`DecoderView`). What chooses each step and learns from it is the session's one
:class:`~banditspec.decoding.controllers.StepController`; the result types are in
:mod:`banditspec.decoding.results`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Protocol

import numpy as np

from banditspec.bandits.cost_model import CostModel
from banditspec.bandits.costaware import CostAwarePolicy, SharedAcceptance
from banditspec.bandits.registry import ResolvedPolicy, build_policy
from banditspec.config import GenerationRequest
from banditspec.decoding.bookkeeping import Bookkeeper
from banditspec.decoding.controllers import (
    ArmPolicyController,
    Chosen,
    CostAwareController,
    Round,
    StepController,
    StepOutcome,
)
from banditspec.decoding.costaware_rounds import CostAwareRounds
from banditspec.decoding.drafting import RequestDrafters
from banditspec.decoding.results import (
    FINISH_CANCELLED,
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationResult,
    SpeculationStats,
    StepEvent,
)
from banditspec.decoding.rewards import make_reward
from banditspec.drafters.base import Drafter, first_feature
from banditspec.engine.contract import Engine, VerifyRequest, VerifyResult
from banditspec.gamma_controller.budget import SpeculationBudget


class DecoderView(Protocol):
    """What a session reads from the decoder that started it (banditspec.decoding.decoder)."""

    drafters: dict[str, Drafter]
    vocab_size: int
    max_context: int
    eos_id: int
    provides_hidden_states: bool
    drafter_deadline_s: float | None
    budget: SpeculationBudget
    cost_model: CostModel
    shared_acceptance: SharedAcceptance
    costaware_objective: str
    bookkeeper: Bookkeeper | None
    clock: Callable[[], float]

    def state_readers(self, names: Iterable[str]) -> tuple[list[Drafter], tuple[int, ...]]: ...


class DecodingSession:
    """One request's decoding state; see the module docstring for the step protocol."""

    def __init__(self, decoder: DecoderView, request: GenerationRequest, resolved: ResolvedPolicy):
        self._decoder = decoder
        self._request = request
        self.arms = arms = resolved.arms
        self._prompt = [int(t) for t in request.prompt_ids]
        self._sequence = list(self._prompt)  # prompt + generated (before stop-word cuts)
        self._generated: list[int] = []
        self._emitted = 0
        self._stop_sequences = [list(map(int, s)) for s in request.stop_sequences]
        self._bad_words = tuple(tuple(int(t) for t in w) for w in request.bad_words)
        self._clock = decoder.clock
        self._cost_model = decoder.cost_model
        chosen = build_policy(
            resolved,
            max_draft_len=request.max_draft_len,
            seed=request.seed,
            reward=request.reward,
            cost_model=decoder.cost_model,
            shared_acceptance=decoder.shared_acceptance,
            costaware_objective=decoder.costaware_objective,
            temperature=float(request.temperature),
        )
        # costaware chooses (drafter, gamma) itself; the others choose an arm index
        self.controller: StepController
        if isinstance(chosen, CostAwarePolicy):
            rounds = CostAwareRounds(chosen, decoder.cost_model, decoder.clock)
            self.controller = CostAwareController(chosen, decoder.cost_model, rounds)
        else:
            self.controller = ArmPolicyController(
                chosen, make_reward(request.reward, decoder.cost_model, request.max_draft_len))
        self._verify_started = 0.0
        self._available = list(range(len(arms)))
        self.stats = SpeculationStats(seed=int(request.seed))
        self.finished = False
        self.finish_reason: str | None = None
        # (the step's choice, draft length, start time)
        self._pending: tuple[Chosen, int, float] | None = None
        # The controller's learning from the last step, when deferred (bookkeeping.py):
        # (step index, gamma, verify seconds, step seconds, context, first step?, extra tokens,
        # seconds of the extra tokens' decoding), run by settle()
        self._bookkeeper = decoder.bookkeeper if self.controller.learns_later else None
        self._unsettled: tuple[int, int, float, float, int, bool, int, float | None] | None = None
        self._settle_lock = threading.Lock()
        self._bookkeeping_error: Exception | None = None
        used = sorted({a.drafter for a in arms if a.drafter})
        self._drafters = RequestDrafters(decoder.drafters, used, self._prompt, vocab_size=decoder.vocab_size,
                                         deadline_s=decoder.drafter_deadline_s, on_drop=self._drop_arms)
        # The target states the feature-hungry drafters read (EAGLE-3: decoder-layer outputs)
        hungry, self._hidden_layers = decoder.state_readers(self._drafters.names())
        self._needs_hidden = bool(hungry)
        self._hidden_from = 0
        if self._needs_hidden:
            # A head with a window on the prompt reads only its latest positions: the first
            # step asks for those states alone (and a cached prefix is reused up to them).
            windows: list[int] = [w for d in hungry if (w := d.traits.prompt_window) is not None]
            if len(windows) == len(hungry):
                self._hidden_from = first_feature(len(self._prompt), max(windows))

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
        chosen = self.controller.choose(Round(self.arms, self._available, limit, end_limit, len(self._sequence)),
                                        self._drafters)
        draft = chosen.draft
        gamma = len(draft)
        self._pending = (chosen, gamma, start)
        hidden_from = -1
        if self._needs_hidden:
            hidden_from = self._hidden_from
        if self._unsettled is not None and self._bookkeeper is not None:
            # the last step's learning, while the target verifies (that step's only: a job
            # that runs late, after apply() did it, must not settle a newer step early)
            self._bookkeeper.submit(functools.partial(self.settle, self._unsettled[0]))
        self._verify_started = self._clock()  # after the hand-off (a deferred bookkeeper learns within it)
        return VerifyRequest(
            input_ids=np.asarray(self._sequence, dtype=np.int32),
            draft_ids=draft.token_ids.astype(np.int32, copy=False),
            draft_probs=draft.probs,
            temperature=float(self._request.temperature),
            seed=int(self._request.seed),
            end_id=self._decoder.eos_id,
            hidden_from=hidden_from,
            hidden_layers=self._hidden_layers if hidden_from >= 0 else (),
            bad_words=self._bad_words,
        )

    def apply(self, result: VerifyResult) -> StepEvent:
        """Take the target's verdict for the pending step; returns what to stream."""
        if self._pending is None:
            raise RuntimeError("apply() without a pending next_verify()")
        # The target call's time, read before anything of the controller's own: waiting for
        # the last step's learning (a background bookkeeper may still be running it) is not
        # the target's cost, and the cost model learns the verify curve from this figure.
        verify_seconds = self._clock() - self._verify_started
        self._settled()  # the step before this one (normally done by the bookkeeper by now)
        chosen, gamma, start = self._pending
        context = len(self._sequence)  # tokens before the round's (what the call attends to)
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
        self._drafters.observe(output, result.hidden_states)
        self._append(output)
        if first_step and result.cached_tokens is not None:
            self.stats.cached_prompt_tokens = min(int(result.cached_tokens), len(self._prompt))
        for name in ("kv_cache_reused_blocks", "kv_cache_alloc_new_blocks"):
            value = getattr(result, name, None)
            if value is not None:
                setattr(self.stats, name, (getattr(self.stats, name) or 0) + int(value))
        elapsed = self._clock() - start
        self._decoder.budget.record_step(gamma, len(output), elapsed)
        # Tokens past accepted + 1 came from plain steps after the verify pass; the cost model
        # learns the verify pass alone (the engine's own timing separates them), else nothing.
        extra = max(0, len(output) - accepted - 1)
        decode_on = getattr(result, "decode_on_seconds", None) if extra else 0.0
        self._unsettled = (len(self.stats.arms), gamma, verify_seconds, elapsed, context, first_step, extra, decode_on)
        if self._bookkeeper is not None and not self.finished:
            self.controller.note_firsts(self._sequence)  # the next round's context, now; its learning, later
        else:
            self._settled()
        arm_name = self.controller.arm_name(self.arms, chosen, gamma)
        self.controller.learn(StepOutcome(chosen, gamma, accepted, len(output), elapsed, first_step))
        self.stats.arms.append(arm_name)
        self.stats.drafted.append(gamma)
        self.stats.accepted.append(accepted)
        self.stats.step_seconds.append(elapsed)
        self.stats.verify_seconds.append(verify_seconds)
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
            self.settle()
            self._finish(FINISH_CANCELLED)

    def settle(self, step: int | None = None) -> None:
        """The last step's bookkeeping (:mod:`banditspec.decoding.bookkeeping`), if it is still to do
        (``step``: only if the last step is that one, counted from 0); callable from any
        thread, runs once. An error in it is raised by the next :meth:`apply`."""
        with self._settle_lock:
            pending = self._unsettled
            if pending is None or (step is not None and pending[0] != step):
                return
            self._unsettled = None
            try:
                self._bookkeep(*pending[1:])
            except Exception as exc:
                self._bookkeeping_error = exc

    def _settled(self) -> None:
        """Settle here and now, raising what went wrong in it (or in the bookkeeper's run)."""
        self.settle()
        error, self._bookkeeping_error = self._bookkeeping_error, None
        if error is not None:
            raise error

    def _bookkeep(self, gamma: int, verify_seconds: float, elapsed: float, context: int, first_step: bool,
                  extra: int = 0, decode_on: float | None = 0.0) -> None:
        if not first_step and decode_on is not None:  # the first step also prefills the prompt
            verify_pass = verify_seconds - decode_on
            if verify_pass > 0:
                self._cost_model.observe(1 + gamma, verify_pass, context)
                if extra:
                    self._cost_model.observe(1, decode_on / extra, context + gamma + 1)
            self._cost_model.observe_overhead(max(0.0, elapsed - verify_seconds))
        self.controller.score(self._sequence, final=self.finished)

    def result(self) -> GenerationResult:
        return GenerationResult(list(self._generated), self.finish_reason or "", self.stats)

    # -- internals ---------------------------------------------------------------------
    def _drop_arms(self, drafter: str, reason: str) -> None:
        """``drafter`` failed (or is unavailable): its arms leave this request."""
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
        self.stats.controller = self.controller.stats()
        self._drafters.close(finished=reason != FINISH_CANCELLED)


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
