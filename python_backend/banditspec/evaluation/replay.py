"""Exact offline evaluation of speculation policies from recorded traces.

Greedy decoding is deterministic: the target's output for a prompt does not depend on
which drafts were verified, and neither does a cheap drafter's proposal at a position
(it reads only prompt + output so far). So one recording per prompt, the target's
greedy tokens plus, at EVERY position, each cheap drafter's proposal of L tokens, lets
any policy be replayed exactly: target calls, tokens fed, drafted and accepted tokens,
and time through a cost model of the platform.

The replay drives the real decoding loop (:class:`~banditspec.decoding.session.DecodingSession`
with the real policies) against :class:`ReplayEngine` and :class:`ReplayDrafter`
stand-ins and a virtual clock that advances by the platform's cost of each round, so
what is measured is the shipped code's behaviour, not a re-implementation of it.

A costly drafter (Eagle) is replayed too when recorded (:func:`record_costly_proposals`:
its proposal and its preview at every position, from the target's states at every
position, computed once): it previews every round the controller asks (each preview
advances the clock by its cost) and proposes only when chosen (each call advances the
clock by its drafting cost, per call plus per drafted token). Not covered: sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from banditspec.bandits.cost_model import CostModel, calibration_plan
from banditspec.config import VANILLA_ARM, arm_drafter
from banditspec.drafters.base import Draft, Drafter, DrafterTraits, Preview, PreviewingSession
from banditspec.drafters.registry import DRAFTER_NAMES, drafter_class
from banditspec.engine.contract import VerifyRequest, VerifyResult


@dataclass
class Trace:
    """One prompt's recording.

    target:    the target's greedy tokens after the prompt (EOS included when it ended so)
    proposals: drafter -> per position i (0 .. len(target) - 1) the proposal made after i
               generated tokens, up to L tokens
    match_len: drafter -> per position the proposal's match length (the drafter's confidence)
    previews:  costly drafter -> per position its preview [token, confidence, cut-off], or
               None where it had none (drafters.base.Preview)
    """

    kind: str
    prompt_ids: list[int]
    target: list[int]
    proposals: dict[str, list[list[int]]] = field(default_factory=dict)
    match_len: dict[str, list[int]] = field(default_factory=dict)
    previews: dict[str, list[list[float] | None]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "prompt_ids": self.prompt_ids, "target": self.target,
                "proposals": self.proposals, "match_len": self.match_len, "previews": self.previews}

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        return cls(d["kind"], list(d["prompt_ids"]), list(d["target"]), dict(d["proposals"]), dict(d["match_len"]),
                   dict(d.get("previews", {})))


def record_proposals(trace: Trace, drafters: dict, max_len: int) -> Trace:
    """Fill ``trace.proposals`` by walking each drafter along the target's tokens.

    Drafters that keep global state (the suffix tree's past outputs) learn from the
    request when it ends, as in serving: record prompts in serving order."""
    for name, drafter in drafters.items():
        session = drafter.start(trace.prompt_ids)
        proposals, matches = [], []
        for token in trace.target:
            draft = session.propose(max_len)
            proposals.append([int(t) for t in draft.token_ids])
            matches.append(int(getattr(draft, "match_len", 0)))
            session.observe([token])
        session.close(finished=True)
        trace.proposals[name], trace.match_len[name] = proposals, matches
    return trace


def record_costly_proposals(trace: Trace, name: str, drafter: Drafter, features: np.ndarray, max_len: int) -> Trace:
    """Fill ``trace.proposals[name]`` for a drafter that reads the target's states (Eagle).

    features: float32 [len(prompt) + len(target) - 1, F], the target's states at every
    position of prompt + target but the last (row p produced token p + 1). The session is
    fed as decoding feeds it: the first step's token with the prompt's rows, then one
    token and its row per step; at each position it proposes up to ``max_len`` tokens
    (empty where it declines, and at position 0, before any state has come)."""
    prompt = len(trace.prompt_ids)
    if len(features) != prompt + len(trace.target) - 1:
        raise ValueError(f"{len(features)} feature rows for {prompt} prompt and {len(trace.target)} target tokens")
    session = drafter.start(trace.prompt_ids)
    proposals, previews = [], []
    for i, token in enumerate(trace.target):
        seen = cast(PreviewingSession, session).preview() if callable(getattr(session, "preview", None)) else None
        previews.append(None if seen is None else [int(seen.token), float(seen.confidence), float(seen.cut_off)])
        proposals.append([int(t) for t in session.propose(max_len).token_ids])
        rows = features[:prompt] if i == 0 else features[prompt + i - 1 : prompt + i]
        session.observe([token], rows)
    session.close(finished=True)
    trace.proposals[name], trace.match_len[name] = proposals, [0] * len(proposals)
    if any(p is not None for p in previews):
        trace.previews[name] = previews
    return trace


def _key(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """A prompt's token ids as a dictionary key (bytes of int64: ~100x faster to build
    from an array than a tuple of ints, which was most of a replay's time)."""
    return np.asarray(token_ids, dtype=np.int64).tobytes()


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ReplayEngine:
    """Verifies drafts against the recorded greedy tokens; each call advances the clock
    by the platform's cost of a round feeding 1 + gamma tokens after the request's context
    (prefill: by the prompt's tokens at the one-token rate ``prefill_per_token`` x cost(1))."""

    provides_hidden_states = False

    def __init__(self, traces: Sequence[Trace], platform: CostModel, clock: VirtualClock, *,
                 eos_id: int, vocab_size: int = 1 << 20, max_context: int = 1 << 20,
                 prefill_per_token: float = 0.02):
        self._by_prompt = {_key(t.prompt_ids): t for t in traces}
        self._lengths = sorted({len(t.prompt_ids) for t in traces}, reverse=True)
        self._platform = platform
        self._curve = platform.curve()
        self._curves: dict[int, np.ndarray] = {}  # context -> the platform's curve there
        self._clock = clock
        self.eos_id, self.vocab_size, self.max_context = eos_id, vocab_size, max_context
        self._prefill = prefill_per_token
        self._seen: set[int] = set()  # id() of the traces whose prompt was prefilled
        self.calls = 0
        self.tokens_fed = 0

    def prefill_seconds(self, trace: Trace) -> float:
        """What a request's first call adds for its prompt (excluded from decode time)."""
        return self._prefill * len(trace.prompt_ids) * self._curve[1]

    def trace_for(self, input_ids: np.ndarray) -> tuple[Trace, int]:
        """The trace whose prompt ``input_ids`` begins with (the longest such prompt), and
        how far past its prompt they go."""
        ids = np.asarray(input_ids, dtype=np.int64)
        for length in self._lengths:
            if length > len(ids):
                continue
            trace = self._by_prompt.get(_key(ids[:length]))
            if trace is not None:
                return trace, len(ids) - length
        raise KeyError("no trace for this prompt")

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        results = []
        for request in requests:
            trace, position = self.trace_for(np.asarray(request.input_ids))
            draft = [int(t) for t in np.asarray(request.draft_ids).reshape(-1)]
            target = trace.target
            accepted = 0
            while accepted < len(draft) and position + accepted < len(target) and draft[accepted] == target[position + accepted]:
                accepted += 1
            if position + accepted >= len(target):
                raise RuntimeError("the replay ran past the recorded output (max_tokens must not exceed it)")
            output = draft[:accepted] + [target[position + accepted]]
            k = min(1 + len(draft), len(self._curve) - 1)
            context = len(request.input_ids)
            curve = self._curves.get(context)
            if curve is None:
                curve = self._curves[context] = self._platform.curve(context)
            seconds = curve[k]
            key = id(trace)
            if key not in self._seen:  # first call of a request: the prompt's prefill
                self._seen.add(key)
                seconds += self.prefill_seconds(trace)
            self._clock.advance(seconds)
            self.calls += 1
            self.tokens_fed += 1 + len(draft)
            results.append(VerifyResult(np.asarray(output, dtype=np.int32), accepted))
        return results


class ReplayDrafter:
    """A drafter that proposes what the real one proposed at this position.

    ``draft_seconds`` = (per call, per drafted token): what a proposal costs on the clock;
    a costly drafter (Eagle) also declares itself so (``costly``), so that the controller
    calls it only when it chooses it. A decline still costs a call and one token (the head
    ran once to decide it). With ``preview_seconds`` (not None), a costly drafter whose
    previews were recorded in every trace previews (``previews``), each preview costing that
    (serving's ``eagle`` drafter with previews on). A built-in drafter that serving asks
    lazily (``proposes_lazily``: REST) is asked lazily here too."""

    def __init__(self, name: str, traces: Sequence[Trace], clock: VirtualClock, propose_seconds: float = 0.0,
                 *, costly: bool = False, draft_seconds: tuple[float, float] = (0.0, 0.0),
                 preview_seconds: float | None = None):
        self.name = name
        served: DrafterTraits | None = drafter_class(name).traits if name in DRAFTER_NAMES else None
        self.traits = DrafterTraits(
            costly=costly,
            proposes_lazily=served is not None and served.proposes_lazily,
            previews=(costly and preview_seconds is not None and bool(traces) and all(name in t.previews for t in traces)))
        self._by_prompt = {_key(t.prompt_ids): t for t in traces}
        self._clock = clock
        self._propose_seconds = propose_seconds
        self._draft_seconds = draft_seconds
        self._preview_seconds = preview_seconds or 0.0

    def start(self, prompt_ids: Sequence[int]) -> _ReplaySession:
        return _ReplaySession(self, self._by_prompt[_key(prompt_ids)])


class _ReplaySession:
    def __init__(self, drafter: ReplayDrafter, trace: Trace):
        self._drafter, self._trace, self._position = drafter, trace, 0

    def propose(self, max_len: int) -> Draft:
        drafter = self._drafter
        proposals = self._trace.proposals[drafter.name]
        tokens = proposals[self._position][:max_len] if self._position < len(proposals) else []
        seconds = drafter._propose_seconds
        if drafter.traits.costly:
            per_call, per_token = drafter._draft_seconds
            seconds += per_call + per_token * max(1, len(tokens))
        drafter._clock.advance(seconds)
        if self._position >= len(proposals):
            return Draft()
        return Draft(np.asarray(tokens, dtype=np.int32), None, self._trace.match_len[self._drafter.name][self._position])

    def preview(self) -> Preview | None:
        drafter = self._drafter
        recorded = self._trace.previews.get(drafter.name, [])
        drafter._clock.advance(drafter._preview_seconds)
        entry = recorded[self._position] if self._position < len(recorded) else None
        if entry is None:
            return None
        token, confidence, cut_off = entry
        return Preview(int(token), float(confidence), float(cut_off))

    def observe(self, new_tokens: Sequence[int], hidden_states: np.ndarray | None = None) -> None:
        self._position += len(new_tokens)

    def close(self, finished: bool) -> None:
        return None


def per_step_oracle_seconds(trace: Trace, platform: CostModel | np.ndarray, max_len: int, drafters: Sequence[str],
                            n: int | None = None, draft_seconds: dict[str, tuple[float, float]] | None = None) -> float:
    """The fastest way to produce the first ``n`` target tokens in hindsight: the best
    choice (plain, or a drafter and gamma) at every step, by dynamic programming over
    positions; decode cost only (no prefill). A step at position i drafting gamma tokens
    of which a are accepted produces a + 1 tokens and costs curve[1 + gamma] at that
    step's context (``platform``: a cost model, or one curve for every context; plus, for
    a drafter in ``draft_seconds``, its per-call and per-token drafting cost)."""
    draft_seconds = draft_seconds or {}
    n = len(trace.target) if n is None else n
    best = np.full(n + 1, np.inf)
    best[n] = 0.0
    for i in range(n - 1, -1, -1):
        curve = platform.curve(len(trace.prompt_ids) + i) if isinstance(platform, CostModel) else platform
        value = curve[1] + best[i + 1]
        for name in drafters:
            proposal = trace.proposals[name][i]
            per_call, per_token = draft_seconds.get(name, (0.0, 0.0))
            accepted, matching = 0, True
            for gamma in range(1, min(len(proposal), max_len, n - 1 - i) + 1):
                if matching and proposal[gamma - 1] == trace.target[i + gamma - 1]:
                    accepted = gamma
                else:
                    matching = False
                value = min(value, curve[1 + gamma] + per_call + per_token * gamma + best[i + accepted + 1])
        best[i] = value
    return float(best[0])


def calibrate_from(model: CostModel, platform: CostModel, reps: int = 3, max_tokens: int = 9) -> None:
    """Seed ``model`` as serving seeds it when the target loads (``calibrate_cost_model``,
    :func:`~banditspec.bandits.cost_model.calibration_plan`), with the platform's costs."""
    for context, ks in calibration_plan(min(max_tokens, model.max_tokens, platform.max_tokens)):
        curve = platform.curve(context + 1)
        for _ in range(reps):
            for k in ks:
                model.observe(k, float(curve[k]), context + 1)
    model.calibrated = True


def replay_policy(traces: Sequence[Trace], policy: str, arms: Sequence[str], platform: CostModel, *,
                  max_draft_len: int, eos_id: int, cost_model: CostModel | None = None,
                  costly: dict[str, tuple[float, float]] | None = None,
                  preview_seconds: dict[str, float] | None = None, objective: str = "ratio",
                  bookkeeping: str = "now") -> dict:
    """Run ``policy`` over the traces in order (one server: shared statistics carry over);
    returns per-trace decode seconds (prefill excluded), steps, tokens and identity.
    ``cost_model``: the controller's own model (default: a fresh one), calibrated from the
    platform as serving calibrates it when the target loads, then learning online.
    ``costly``: drafter -> (per call, per drafted token) in seconds, for the drafters that
    propose only when chosen (Eagle); ``preview_seconds``: drafter -> seconds per preview,
    for the costly drafters replayed with previews on (when recorded); ``objective``:
    costaware's (bandits.costaware); ``bookkeeping``: when a step's learning runs
    (banditspec.decoding.bookkeeping; "background" is replayed as "deferred", its choices)."""
    costly, preview_seconds = costly or {}, preview_seconds or {}
    from banditspec.config import GenerationRequest, Limits
    from banditspec.decoding.decoder import SpeculativeDecoder
    from banditspec.decoding.session import run_to_completion

    clock = VirtualClock()
    engine = ReplayEngine(traces, platform, clock, eos_id=eos_id)
    drafter_names = sorted({arm_drafter(a) for a in arms if a != VANILLA_ARM})
    drafters = {d: ReplayDrafter(d, traces, clock, costly=d in costly, draft_seconds=costly.get(d, (0.0, 0.0)),
                                 preview_seconds=preview_seconds.get(d))
                for d in drafter_names}
    decoder = SpeculativeDecoder(
        drafters=drafters, vocab_size=engine.vocab_size, max_context=engine.max_context, eos_id=eos_id,
        default_arms=list(arms), limits=Limits(max_tokens=1 << 20, max_prompt_tokens=1 << 20),
        drafter_deadline_s=None, clock=clock, cost_model=cost_model, costaware_objective=objective,
        bookkeeping="deferred" if bookkeeping == "background" else bookkeeping,
    )
    calibrate_from(decoder.cost_model, platform)
    rows = []
    for trace in traces:
        ends_with_eos = bool(trace.target) and trace.target[-1] == eos_id
        max_tokens = len(trace.target) - (1 if ends_with_eos else 0)
        if max_tokens < 1:
            continue
        request = GenerationRequest(prompt_ids=trace.prompt_ids, max_tokens=max_tokens, policy=policy,
                                    max_draft_len=max_draft_len)
        session = decoder.start(request)
        start = clock.now
        prefill = engine.prefill_seconds(trace)
        result = run_to_completion(engine, session)
        expected = trace.target[:max_tokens]
        rows.append({
            "kind": trace.kind,
            "seconds": clock.now - start - prefill,
            "tokens": len(result.token_ids),
            "steps": result.stats.steps,
            "identical": result.token_ids == expected,
            "arms": list(result.stats.arms),
            "drafted": list(result.stats.drafted),
            "accepted": list(result.stats.accepted),
            "step_seconds": list(result.stats.step_seconds),
        })
    return {"rows": rows, "cost_model": decoder.cost_model.as_dict()}
