"""``costaware``: the default controller. Cost-aware, full-information, warm-started.

Each round it chooses a drafter AND a speculation length gamma (0 = plain decoding). A round
drafting gamma tokens with drafter d yields and costs

    E(d, gamma) = 1 + sum_{j <= gamma} P_d(accepted >= j | context)  tokens
    C(d, gamma) = cost(1 + gamma, d)  seconds

(the verify-cost curve of :class:`~banditspec.bandits.cost_model.CostModel` plus the drafting
cost of costly drafters: Eagle, per call plus per drafted token, measured server-wide by
the same model). The default objective (``"ratio"``) maximises the round's expected tokens
per second, U = E / C. The alternative (``"rate"``) maximises ``E - rate * C``, ``rate``
being the throughput the controller achieves (this request's expected tokens per second
of its rounds so far, seeded with the server's, :class:`SharedAcceptance`,
``RATE_PRIOR_ROUNDS`` one-token rounds' worth; plain decoding's 1 / cost(1) on a cold
server): over many rounds throughput is sum E / sum C, which a round serves best that way
(Dinkelbach; a round better than usual drafts further than its own ratio says, a worse one
stops sooner). Replayed (120 tuning and 120 held-out prompts, mixed) the two came out within
-0.3 % .. +0.4 % of each other on every cost model, so the default stays the simpler ratio;
``banditspec replay`` reports both. Plain decoding (E = 1, C = cost(1)) is always a
candidate, so when no draft is expected to pay, it decodes.

Acceptance model: per (drafter, context) a discrete hazard h_j = P(token j accepted |
tokens 1..j-1 accepted, the draft offered j tokens), j = 1..L, estimated from decayed
counts with a Beta prior; P(accepted >= j) = prod_{i <= j} h_i. The context is the
drafter's own confidence: the length of the match its proposal came from (PLD n-gram,
suffix depth, REST match), in buckets; whether another drafter agrees on the next token;
and whether the drafter's previous proposal had its first token right.

Information: cheap drafters (PLD, suffix) propose every round whether chosen or not, REST
whenever it could beat them (:mod:`banditspec.decoding.costaware_rounds`); once the target's tokens
at those positions are known, each proposal's would-be accepted length is scored (full
information). Costly drafters (Eagle, a draft engine)
learn only when pulled, with an optimism bonus on the first position (sized by the
server's evidence) so that an untried one gets tried.

Memory: a server-wide :class:`SharedAcceptance` (decayed, thread-safe) receives every
observation and seeds each new request, capped at ``prior_weight`` pseudo-observations
per position, so that a request starts warm and still adapts to its own evidence. Its
counts are kept per sampling regime (:func:`regime_of`: greedy, or sampled in a temperature
band): greedy verification accepts a drafted token only when it is the target's argmax,
sampling with probability p(token), so one regime's evidence would misprice the other's
drafts. A request learns from, and is seeded by, its own regime only.

Under load (other sequences' steps batched with this one's: :class:`~banditspec.bandits.cost_model.BatchCost`)
a round's cost is the batched step's, T(1 + gamma), and the choice maximises the step's
goodput (E_o + E) / T, E_o the tokens the other sequences yield: a request pays for what
its rows add to everyone's step. When the step is compute-bound (T grows with every row)
a drafted token pays only if it is accepted more often than the step's tokens per row,
so a saturated server drafts less and less, down to plain decoding. Where the target pads
its passes (BatchCost.padded: every sequence computes the longest one's rows) the draft
length is the pass's, not the sequence's: a draft up to the others' longest is free, and one
beyond it makes every sequence compute the extra rows. Each request then chooses as if the
others drafted as it does, E / T: with E_o fixed, no sequence would ever lengthen the pass
alone (its extra tokens are a small share of the pass's), though all of them lengthening it
together can pay. Pricing the rows below the others' longest too (every sequence padded to k,
whatever the others draft) made the passes shorter and the server slower at 4 and 16 streams
(docs/benchmarks/concurrency.md): a draft into rows the pass computes anyway is a free chance.
Alone, the choice is the single-sequence one above, unchanged.

Decisions are a deterministic function of (statistics, cost-model snapshot): no RNG.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from banditspec.bandits.cost_model import BatchLoad, CostModel

PLAIN = None  # the choice "no drafter, gamma 0"
MATCH_BUCKETS = 4  # match length 0 (unknown), 1, 2, >= 3
# x whether another drafter proposes the same next token x how the drafter's own previous
# proposal in this request did (none yet / first token wrong / first token right)
CONTEXT_BUCKETS = 6 * MATCH_BUCKETS


# A costly drafter's preview confidence (the head's probability of its first token) in
# levels that take the match length's place in the context: < 0.55, < 0.7, < 0.85, >= 0.85.
CONFIDENCE_LEVELS = (0.55, 0.7, 0.85)


def confidence_level(confidence: float) -> int:
    """0 .. MATCH_BUCKETS - 1: a drafter's probability of its first token, bucketed."""
    return sum(confidence >= edge for edge in CONFIDENCE_LEVELS)


# A blind costly drafter's hint (drafters.base: Eagle's first-token probe, P(a pull now starts
# with an accepted token), calibrated) prices the first position (Candidate.first_hazard, no
# optimism), blended with its level's outcomes; the level is the context of the pull's outcomes.
# The edges split the probe's held-out positions into levels of clearly different hit rates,
# none nearly empty (the calibration table fit_probe.py writes into the head's JSON).
HINT_LEVELS = (0.1, 0.2, 0.4)
# The objectives (module docstring): "ratio" maximises each round's E / C, "rate" E - rate * C.
OBJECTIVES = ("ratio", "rate")
# What the server's rate is worth in a request's rate, in one-token rounds (their seconds).
RATE_PRIOR_ROUNDS = 10.0
# Per round: how fast the server's rate forgets (~1000 rounds of memory).
RATE_DECAY = 0.999
# How many outcomes the hint is worth against its level's own (CostAwarePolicy._hinted_first).
HINT_WEIGHT = 5.0
# Below this a hint says the pull would (almost) surely miss: the drafter is not offered (a
# session that cannot draft at all says 0.0). On the held-out positions: 14 % of them, hits 3.5 %.
HINT_FLOOR = 0.03


# Sampling regimes (SharedAcceptance's keys): greedy, and sampled in temperature bands with
# these upper edges (the last band is open).
GREEDY = "greedy"
TEMPERATURE_BANDS = (0.5, 0.9)


def regime_of(temperature: float) -> str:
    """The sampling regime of a request at ``temperature``: "greedy" (0), else the band,
    e.g. "t<=0.5", "t<=0.9", "t>0.9"."""
    if not temperature > 0.0:
        return GREEDY
    for edge in TEMPERATURE_BANDS:
        if temperature <= edge:
            return f"t<={edge:g}"
    return f"t>{TEMPERATURE_BANDS[-1]:g}"


def hint_level(hint: float) -> int:
    """0 .. MATCH_BUCKETS - 1: a blind costly drafter's hint, bucketed."""
    return sum(hint >= edge for edge in HINT_LEVELS)


def context_bucket(match_len: int, agreed: bool = False, last_hit: bool | None = None) -> int:
    """The context of a proposal: its match length (bucketed); whether another cheap
    drafter, from its own evidence, proposes the same next token; and whether this
    drafter's previous proposal had its first token accepted (None: no previous one yet).
    Copying comes in runs: a drafter that was just right tends to stay right."""
    bucket = max(0, min(int(match_len), MATCH_BUCKETS - 1)) + (MATCH_BUCKETS if agreed else 0)
    return buckets_after(last_hit).start + bucket


def buckets_after(last_hit: bool | None) -> slice:
    """The context buckets of a proposal whose drafter's previous proposal did ``last_hit``
    (the part of its context known before it proposes)."""
    start = 0 if last_hit is None else 2 * MATCH_BUCKETS * (2 if last_hit else 1)
    return slice(start, start + 2 * MATCH_BUCKETS)  # match length x agreement within it


class HazardCounts:
    """Decayed counts per context and position: offered[c, j], accepted[c, j], j = 0..L-1."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.offered = np.zeros((CONTEXT_BUCKETS, max_len))
        self.accepted = np.zeros((CONTEXT_BUCKETS, max_len))

    def record(self, bucket: int, proposed: int, accepted: int, known: int, decay: float = 1.0,
               already: int = 0) -> int:
        """A proposal of ``proposed`` tokens whose first ``accepted`` matched the target, with
        ``known`` target tokens after it known so far (the rest is censored). Positions
        before ``already`` were recorded before (outcomes arrive as the target speaks).
        Returns the number of positions with an outcome now."""
        last = min(proposed, accepted + 1, known, self.max_len)  # positions with an outcome
        if last <= already:
            return max(last, already)
        if decay != 1.0:
            self.offered *= decay
            self.accepted *= decay
        self.offered[bucket, already:last] += 1.0
        if accepted > already:
            self.accepted[bucket, already : min(accepted, last)] += 1.0
        return last

    def copy(self) -> HazardCounts:
        out = HazardCounts(self.max_len)
        out.offered, out.accepted = self.offered.copy(), self.accepted.copy()
        return out


class SharedAcceptance:
    """Server-wide acceptance counts per (drafter, sampling regime) (bounded: drafters x
    regimes x buckets x L floats), decayed by ``decay`` per observation of the same key,
    thread-safe."""

    def __init__(self, max_len: int, decay: float = 0.998):
        self.max_len = max_len
        self.decay = decay
        self._counts: dict[tuple[str, str], HazardCounts] = {}
        self._lock = threading.Lock()
        self._rate_tokens = 0.0  # decayed expected tokens and seconds of every request's rounds
        self._rate_seconds = 0.0

    def record_round(self, expected_tokens: float, seconds: float) -> None:
        """A round chosen by some request: its expected tokens and its cost (seconds)."""
        with self._lock:
            self._rate_tokens = self._rate_tokens * RATE_DECAY + expected_tokens
            self._rate_seconds = self._rate_seconds * RATE_DECAY + seconds

    def rate(self) -> float | None:
        """The server's expected tokens per second of its rounds (None: no round yet)."""
        with self._lock:
            return self._rate_tokens / self._rate_seconds if self._rate_seconds > 0 else None

    def record(self, drafter: str, bucket: int, proposed: int, accepted: int, known: int, already: int = 0,
               regime: str = GREEDY) -> None:
        with self._lock:
            counts = self._counts.get((drafter, regime))
            if counts is None:
                counts = self._counts[(drafter, regime)] = HazardCounts(self.max_len)
            counts.record(bucket, proposed, accepted, known, self.decay, already)

    def snapshot(self, drafter: str, regime: str = GREEDY) -> HazardCounts | None:
        with self._lock:
            counts = self._counts.get((drafter, regime))
            return None if counts is None else counts.copy()

    def regimes(self) -> list[str]:
        """The regimes with counts, sorted."""
        with self._lock:
            return sorted({regime for _, regime in self._counts})

    def as_dict(self, regime: str = GREEDY) -> dict:
        """{drafter: offered and acceptance rate per position} in ``regime``."""
        with self._lock:
            return {
                name: {
                    "offered": np.round(c.offered.sum(axis=0), 2).tolist(),
                    "accept_rate": np.round(c.accepted.sum(axis=0) / np.maximum(c.offered.sum(axis=0), 1e-9), 3).tolist(),
                }
                for (name, key), c in self._counts.items() if key == regime
            }


@dataclass(frozen=True)
class Candidate:
    """A drafter the round may use: how many tokens it can offer and its confidence."""

    drafter: str
    max_gamma: int  # cheap drafter: its proposal's length; costly drafter: the cap
    bucket: int = 0
    costly: bool = False
    draft_seconds_per_call: float = 0.0  # what proposing costs (costly drafters; cheap ones
    draft_seconds_per_token: float = 0.0  # propose every round anyway, a sunk cost)
    previewed: bool = False  # a costly drafter whose first token is scored every round (no optimism needed)
    first_hazard: float | None = None  # a blind costly drafter's hint: P(first token accepted) (see _hinted_first)


@dataclass(frozen=True)
class Choice:
    drafter: str | None  # None: plain decoding
    gamma: int
    expected_tokens: float
    utility: float  # expected tokens per second of this round (E / C)
    seconds: float = 0.0  # what the round costs (C)
    value: float = 0.0  # what the objective maximises: E - rate * C ("rate"), E / C ("ratio")


class CostAwarePolicy:
    """One request's controller (see the module docstring)."""

    name = "costaware"

    def __init__(
        self,
        drafters: list[str],
        max_len: int,
        cost_model: CostModel,
        shared: SharedAcceptance | None = None,
        *,
        prior_accept: float = 0.5,
        prior_reject: float = 1.5,
        prior_weight: float = 5.0,
        optimism: float = 0.5,
        objective: str = "ratio",
        regime: str = GREEDY,
    ):
        """regime: the request's sampling regime (:func:`regime_of`), the server's counts it
        reads and adds to."""
        if max_len < 1:
            raise ValueError("max_len must be >= 1")
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        # objective "rate": the request's chosen rounds so far, expected tokens and seconds (the
        # rate's evidence), and the server's rate when the request began (a snapshot: reproducible)
        self._round_tokens = 0.0
        self._round_seconds = 0.0
        self._server_rate = shared.rate() if shared is not None and objective == "rate" else None
        self.drafters = list(drafters)
        self.max_len = max_len
        self.cost_model = cost_model
        self.shared = shared
        self.regime = regime
        # the load the round's step joins (price_load), and the batched step's costs by
        # context under it
        self._load: BatchLoad | None = None
        self._loaded: dict[int | None, list[float]] = {}
        self._a0, self._b0 = prior_accept, prior_reject
        self._optimism = optimism
        self.local = {d: HazardCounts(max_len) for d in drafters}
        # Warm start: the server's counts, scaled down to at most prior_weight per position.
        self.prior: dict[str, HazardCounts] = {}
        self.evidence: dict[str, np.ndarray] = {}  # uncapped server counts: how sure the server is
        for d in drafters:
            snap = shared.snapshot(d, regime) if shared is not None else None
            if snap is None:
                continue
            width = min(max_len, snap.max_len)
            self.evidence[d] = np.zeros((CONTEXT_BUCKETS, max_len))
            self.evidence[d][:, :width] = snap.offered[:, :width]
            prior = HazardCounts(max_len)
            scale = np.minimum(1.0, prior_weight / np.maximum(snap.offered[:, :width], 1e-9))
            prior.offered[:, :width] = snap.offered[:, :width] * scale
            prior.accepted[:, :width] = snap.accepted[:, :width] * scale
            self.prior[d] = prior
        self.rounds = 0
        # drafter -> {bucket: its hazards as a list}, for best(); a bucket's entry is
        # dropped when the drafter records in it (its counts change there; the prior never)
        self._hazard_lists: dict[str, dict[int, list[float]]] = {}

    # -- estimates -------------------------------------------------------------------
    def price_load(self, load: BatchLoad | None) -> None:
        """Price the coming round's choices under ``load`` (None: alone); one snapshot for
        the whole round, so its choices compare like with like."""
        if load != self._load:
            self._load = load
            self._loaded = {}

    def _costs(self, context: int | None) -> tuple[list[float], float, bool]:
        """(seconds per round by tokens fed, index 1.., tokens the others' rows yield,
        under load?) at ``context``."""
        load = self._load
        batch = self.cost_model.batch
        if load is None or batch is None:
            return self.cost_model.curve_list(context), 0.0, False
        seconds = self._loaded.get(context)
        if seconds is None:
            if len(self._loaded) >= 16:
                self._loaded = {}
            seconds = self._loaded[context] = batch.step_seconds(context, load)
        return seconds, 0.0 if batch.padded(load) else load.tokens, True

    def _hazard(self, drafter: str, bucket: int | slice) -> np.ndarray:
        """P(token j accepted | 1..j-1 accepted) from this request's and the prior's counts,
        [L] for one bucket ([buckets, L] for a slice)."""
        counts = self.local[drafter]
        offered, accepted = counts.offered[bucket], counts.accepted[bucket]
        prior = self.prior.get(drafter)
        if prior is not None:
            offered, accepted = offered + prior.offered[bucket], accepted + prior.accepted[bucket]
        # A context seen rarely leans on the pessimistic prior (mean a0 / (a0 + b0)); leaning
        # on the drafter's rate over all its contexts instead replayed 0.5-1.5 % slower.
        return (accepted + self._a0) / (offered + self._a0 + self._b0)

    def _hazard_list(self, drafter: str, bucket: int) -> list[float]:
        """:meth:`_hazard` of one bucket as a list, cached until ``drafter`` records in that
        bucket (the cache's own list: read, or slice before changing it)."""
        lists = self._hazard_lists.setdefault(drafter, {})
        hazard = lists.get(bucket)
        if hazard is None:
            hazard = lists[bucket] = self._hazard(drafter, bucket).tolist()
        return hazard

    def survival(self, drafter: str, bucket: int, optimistic: bool = False) -> np.ndarray:
        """float64 [L]: P(accepted >= j), j = 1..L, for a draft of L tokens."""
        hazard = self._hazard(drafter, bucket)
        if optimistic:
            hazard[0] = min(1.0, hazard[0] + self._bonus(drafter, bucket))
        return np.cumprod(hazard)

    def _hinted_first(self, drafter: str, bucket: int, hint: float) -> float:
        """A hinted pull's first-position hazard: the hint as the prior mean (weight
        HINT_WEIGHT) of its level's own first-position outcomes (this request's and the
        server's capped ones). The probe is calibrated over all positions; the controller pulls
        at a selection of them (e.g. where no cheap drafter proposes, on chat the head hit
        less often than the probe said), and its level's outcomes correct for that."""
        counts, prior = self.local[drafter], self.prior.get(drafter)
        offered, accepted = counts.offered[bucket, 0], counts.accepted[bucket, 0]
        if prior is not None:
            offered, accepted = offered + prior.offered[bucket, 0], accepted + prior.accepted[bucket, 0]
        return float((accepted + HINT_WEIGHT * hint) / (offered + HINT_WEIGHT))

    def _bonus(self, drafter: str, bucket: int) -> float:
        """The optimism on a costly drafter's first position (blind: what choosing it yields
        at all is what exploration must find out). Only the first position: deeper ones are
        offered only after the first is accepted, so their counts stay small, and a bonus
        there never faded (a drafter right 20 % of the time on code was valued at ~2.5 tokens
        per pull and called in half the rounds). Sized by the server's evidence as well as
        the request's: a drafter the server has tried many times is not re-explored by every
        request (its capped prior alone would invite that)."""
        evidence = self.evidence.get(drafter)
        seen = self.local[drafter].offered[bucket, 0] + (evidence[bucket, 0] if evidence is not None else 0.0)
        return self._optimism * math.sqrt(math.log(self.rounds + 2) / (seen + 1.0))

    def rate(self, one_token_seconds: float) -> float:
        """The throughput the objective prices a round's seconds at (module docstring):
        this request's rounds so far, seeded with RATE_PRIOR_ROUNDS rounds of
        ``one_token_seconds`` at the server's rate (plain decoding's on a cold server)."""
        prior = self._server_rate if self._server_rate is not None else 1.0 / one_token_seconds
        weight = RATE_PRIOR_ROUNDS * one_token_seconds
        return (self._round_tokens + prior * weight) / (self._round_seconds + weight)

    def choose(self, candidates: list[Candidate], gamma_cap: int, context: int | None = None,
               start: Choice | None = None, priced: int = 0) -> Choice:
        """The best (drafter, gamma) for this round, plain decoding included; ``context``:
        the tokens before the round (prompt + generated), which the verify cost grows with;
        ``start``, ``priced``: see :meth:`best`."""
        best = self.best(candidates, gamma_cap, context, start, priced)
        self.rounds += 1
        if self.objective == "rate":  # the rate's evidence (the ratio needs none: no work per round)
            self._round_tokens += best.expected_tokens
            self._round_seconds += best.seconds
            if self.shared is not None:
                self.shared.record_round(best.expected_tokens, best.seconds)
        return best

    def best(self, candidates: list[Candidate], gamma_cap: int, context: int | None = None,
             start: Choice | None = None, priced: int = 0) -> Choice:
        """What :meth:`choose` would choose, without counting a round. ``start``: this
        round's best of ``candidates[:priced]`` (same cap and context), from which the scan
        goes on over the rest: the same choice as a scan of all of them (the first of
        equally good ones wins), without pricing the first ``priced`` again.

        Scalar arithmetic over Python floats (a round asks this two or three times, over a
        handful of candidates of at most L lengths each: numpy's per-call overhead was most
        of its cost); the same IEEE operations in the same order as :meth:`survival` and
        the cost curve plus a costly drafter's drafting, so the choice is the one they give."""
        seconds, others, loaded = self._costs(context)
        cap = max(0, min(gamma_cap, self.max_len, len(seconds) - 2))
        # under load both objectives are the step's goodput (module docstring)
        rate = self.rate(seconds[1]) if self.objective == "rate" and not loaded else None
        if start is not None:
            best = start
        else:
            plain = 1.0 - rate * seconds[1] if rate is not None else (others + 1.0) / seconds[1]
            best = Choice(PLAIN, 0, 1.0, 1.0 / seconds[1], seconds[1], plain)
            priced = 0
        for candidate in candidates[priced:] if priced else candidates:
            top = min(candidate.max_gamma, cap)
            if top <= 0:
                continue
            hazard = self._hazard_list(candidate.drafter, candidate.bucket)[:top]
            if candidate.first_hazard is not None:  # an estimate for this very round
                hazard[0] = self._hinted_first(candidate.drafter, candidate.bucket, candidate.first_hazard)
            elif candidate.costly and not candidate.previewed:
                hazard[0] = min(1.0, hazard[0] + self._bonus(candidate.drafter, candidate.bucket))
            per_call, per_token = candidate.draft_seconds_per_call, candidate.draft_seconds_per_token
            survival, expected = 1.0, 1.0
            top_value, top_gamma, top_expected, top_seconds = -math.inf, 0, 0.0, 0.0
            for gamma in range(1, top + 1):
                survival *= hazard[gamma - 1]
                expected += survival
                cost = seconds[gamma + 1] + per_call + per_token * gamma
                value = expected - rate * cost if rate is not None else (others + expected) / cost
                if value > top_value:  # the shortest of equally good lengths
                    top_value, top_gamma, top_expected, top_seconds = value, gamma, expected, cost
            if top_value > best.value + 1e-9 * abs(best.value):
                best = Choice(candidate.drafter, top_gamma, top_expected, top_expected / top_seconds, top_seconds,
                              top_value)
        return best

    def utility_bound(self, candidate: Candidate, gamma_cap: int, context: int | None = None,
                      buckets: slice = slice(None)) -> float:
        """The best value (:attr:`Choice.value`) ``candidate``'s drafter could have in any
        context among ``buckets`` (the most favourable one): when even that cannot beat the
        round's best choice, there is no point in asking the drafter (a preview costs a head
        call, a REST lookup several times a PLD one)."""
        seconds, others, loaded = self._costs(context)
        top = max(0, min(candidate.max_gamma, gamma_cap, self.max_len, len(seconds) - 2))
        counts = self.local.get(candidate.drafter)
        if top <= 0 or counts is None:
            return 0.0
        # Optimism on the first position, by the drafter's evidence over all its contexts:
        # a drafter little asked is asked (its preview is how it learns); a well-known one is
        # judged on its estimates (a bonus per unseen context would keep every one alive).
        evidence = self.evidence.get(candidate.drafter)
        seen = counts.offered[:, 0].sum() + (evidence[:, 0].sum() if evidence is not None else 0.0)
        bonus = self._optimism * math.sqrt(math.log(self.rounds + 2) / (seen + 1.0))
        # Scalar arithmetic (as in best(): numpy's per-call overhead over [buckets, top]
        # arrays was most of the cost) in cumprod's / cumsum's order.
        per_call, per_token = candidate.draft_seconds_per_call, candidate.draft_seconds_per_token
        costs = [seconds[gamma + 1] + per_call + per_token * gamma for gamma in range(1, top + 1)]
        rate = self.rate(seconds[1]) if self.objective == "rate" and not loaded else None
        top_value = -math.inf
        for hazard in self._hazard(candidate.drafter, buckets)[:, :top].tolist():  # [buckets][top]
            survival = min(1.0, hazard[0] + bonus)
            total = 0.0
            for gamma in range(1, top + 1):
                if gamma > 1:
                    survival *= hazard[gamma - 1]
                total += survival
                cost = costs[gamma - 1]
                value = (1.0 + total) - rate * cost if rate is not None else (others + 1.0 + total) / cost
                if value > top_value:
                    top_value = value
        return float(top_value)

    def seen(self, drafter: str, bucket: int, position: int) -> float:
        """How many outcomes at draft position ``position`` (0-based) in ``bucket`` this
        request and the server (undecayed evidence) hold for ``drafter``."""
        counts = self.local.get(drafter)
        if counts is None or not 0 <= position < self.max_len:
            return 0.0
        evidence = self.evidence.get(drafter)
        return float(counts.offered[bucket, position] + (evidence[bucket, position] if evidence is not None else 0.0))

    # -- learning --------------------------------------------------------------------
    def record(self, drafter: str, bucket: int, proposed: int, accepted: int, known: int, already: int = 0) -> int:
        """A proposal's outcome so far (full information for cheap drafters, the pulled
        arm's for costly ones); returns how many of its positions are now recorded."""
        counts = self.local.get(drafter)
        if counts is None:
            return already
        done = counts.record(bucket, proposed, accepted, known, 1.0, already)
        if done > already:
            self._hazard_lists.get(drafter, {}).pop(bucket, None)  # the request's counts change only there
        if self.shared is not None and done > already:
            self.shared.record(drafter, bucket, proposed, accepted, known, already, self.regime)
        return done
