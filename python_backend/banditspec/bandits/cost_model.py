"""What a decoding round costs on this platform: the verify-cost surface and drafting costs.

A round that feeds k = 1 + gamma tokens to the target after C tokens of context costs
``verify_seconds(k, C)``; on a GPU that is almost flat in k, on a CPU engine it grows with k,
and with C: attention reads every cached position for every token fed, so a long draft
on a long prompt costs more than the same draft on a short one (this CPU engine: 9 tokens
against 1 cost 1.33x at 100 cached tokens and 1.53x at 700). The model is

    seconds(k, C) = f(k) + (C - C0) * (b + t * (k - 1))

f(k): the cost at the reference context C0 (the observations' mean context), one free
value per observed k (kernels are not linear in k); b: what a context token adds to every
round, t: what it adds per extra token fed. Observations are kept per cell (k, context
bucket of ``context_bucket`` tokens), the last ``window`` per cell; the fit is a weighted
least-squares fit through the cells' MEDIANS (robust to a GC pause or a cache miss),
weighted by their counts (each observation updates its cell's summary; the fit is redone
after every observation for the model's first ``window``, then every ``REFIT_EVERY``).
The context terms enter only when the observed contexts spread over ``min_spread`` tokens
or more, and only when they come out non-negative and identifiable (else the model is the
k-only curve of before, the same at every context). Unobserved k are filled by a
least-squares line through the observed f(k) (or the prior slope while only one k is
known), and f is made non-decreasing in k by a weighted isotonic fit (each k weighted by
its observations: a noisy cell is pooled with its neighbours, not propagated to every
longer length); a context's adjustment keeps it so. ``overhead_seconds`` is what a round
costs besides the verify call (proposals, bookkeeping), an exponential average.

Costly drafters (an Eagle head, a draft engine, either in this process or another model
reached through BLS) cost time per proposal: ``draft_costs()`` gives, per drafter, seconds
per call plus seconds per drafted token, fitted (like the curve) through the medians of
the last ``window`` proposals grouped by tokens produced. Server-wide, so that a new
request starts knowing what the drafter costs (a per-request estimate made every request
try the drafter at no cost first).

Thread-safe: one model is shared by every request of a server. Decisions read it
through :meth:`curve` (a snapshot), so a request's choices are a deterministic
function of (its statistics, the snapshot it read).

Under load (:class:`BatchCost`): concurrent sequences' steps reach the target as one
batched call (engine/gather.py), and a sequence's extra rows make that call slower for
every sequence in it. A batched pass of a packed target costs ``B(S, R, C)`` for S sequences
feeding R rows in all after a mean context C: a term per sequence apart from the rows' convex
curve (bandits/pass_cost.py, ``PackedShape``), fitted over every pass the target reports
(:meth:`BatchCost.observe_pass`: its rows, sequences and engine time, however many callers'
groups the target's batcher merged into it) and, from a target that reports none, every
gathered call that did not queue behind another; the calibration's lone passes stay in every
fit (:meth:`BatchCost.anchor_pass`): where every sequence under load feeds one row, they alone
tell a row's cost from a sequence's. A request whose step joins S_o others
feeding R_o rows pays for feeding k itself

    T(k) = seconds(k, C) + B(S_o + 1, R_o + k, C_call) - B(1, k, C)

(its own round as alone, plus what the others add given its own): T(k) - T(1) is the
marginal cost of its rows in the current batch. Until that fit can tell a sequence from a row
(passes of two or more sizes and draft lengths), and under ``batch_pricing: rows``, B is a
curve over rows alone, ``CostModel`` with k become R: this model's own calibrated curve,
extended over R by its line, until batched passes are observed. Over rows alone a sequence's
cost lands on its rows (rows and sequences grow together under load), and the fewer tokens
the sequences draft, the dearer a drafted token looks. A target that reports what it padded
(the reference target on the other kernels: every sequence's rows to the longest, its K/V to
the deepest context) can be priced by the fit of its padded passes instead (``batch_pricing:
padded``): B(R_o + k) becomes the pass of the others and this sequence, padded to max(N_o, k)
rows each, N_o the most one of the others feeds; a sum of rows cannot see that a draft no
longer than N_o is free and that each token beyond it costs a row for every sequence. There
the controller maximises E / T(k), as if the others drafted as it does (bandits/costaware.py
says why). Otherwise the controller maximises the call's goodput (E_o + E) / T(k), E_o the
tokens the others yield (bandits/costaware.py). With no other sequence in flight ``load()``
is None and the single-sequence model decides alone, as it does in a process without a
gatherer.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from banditspec.bandits.pass_cost import PackedShape, PassCost, PassShape
from banditspec.engine.contract import VerifyPass
from banditspec.errors import BanditSpecValidationError

CONTEXT_SCALE = 1000.0  # context enters the fit in thousands of tokens (conditioning)
REFIT_EVERY = 8  # observations between refits once the model has seen a window's worth
# The weight, in the monotone fit over k, of a length filled in by the line (not observed):
# it follows its observed neighbours rather than moving them.
UNOBSERVED_WEIGHT = 1e-3


@dataclass(frozen=True)
class _Fit:
    """The fitted surface: f[k] at the reference context c0 (index 0 unused), slopes in
    seconds per context token."""

    f: np.ndarray  # float64 [max_tokens + 1]
    c0: float
    per_context: float  # b
    per_context_token: float  # t

    def at(self, context: float | None) -> np.ndarray:
        out = self.f.copy()
        if context is not None and (self.per_context or self.per_context_token):
            delta = float(context) - self.c0
            ks = np.arange(len(out), dtype=np.float64)
            out[1:] += delta * (self.per_context + self.per_context_token * (ks[1:] - 1))
        out[1:] = np.maximum.accumulate(np.maximum(out[1:], 1e-6))
        return out


class _Cell:
    """The last ``window`` verify times at one (k, context bucket), with their contexts;
    ``row``: its row in the model's table of cell summaries."""

    __slots__ = ("seconds", "contexts", "row")

    def __init__(self, window: int, row: int):
        self.seconds: deque = deque(maxlen=window)
        self.contexts: deque = deque(maxlen=window)
        self.row = row


class CostModel:
    def __init__(
        self,
        max_tokens: int,
        *,
        prior_one_token_seconds: float = 0.05,
        prior_slope: float = 0.25,
        window: int = 64,
        min_observations: int = 3,
        context_bucket: int = 64,
        min_spread: float = 48.0,
        batch_sequences: int = 32,
    ):
        """max_tokens: largest k (1 + L); prior_slope: extra cost per extra token as a share
        of one token's cost, used until two k have been observed; context_bucket: tokens of
        context per cell; min_spread: the weighted standard deviation of the observed
        contexts (tokens) from which the fit prices context; batch_sequences: the most
        sequences a batched call is priced for (0: no batch model)."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BanditSpecValidationError("max_tokens", f"must be an int >= 1, got {max_tokens!r}")
        if not prior_one_token_seconds > 0 or not prior_slope >= 0:
            raise BanditSpecValidationError("prior", "one-token cost must be > 0 and slope >= 0")
        if isinstance(context_bucket, bool) or not isinstance(context_bucket, int) or context_bucket < 1:
            raise BanditSpecValidationError("context_bucket", f"must be an int >= 1, got {context_bucket!r}")
        self.max_tokens = max_tokens
        self._prior = (float(prior_one_token_seconds), float(prior_slope))
        self._min_obs = min_observations
        self._bucket = context_bucket
        self._min_spread = float(min_spread)
        self._cells: dict[tuple[int, int], _Cell] = {}  # (k, context // context_bucket)
        # one row per cell: k, median seconds, mean context, observations (kept up to date
        # by observe, so that a refit reads one array)
        self._table = np.zeros((0, 4))
        self._overhead = 0.0
        self._overhead_n = 0
        self._window = window
        self._drafts: dict[str, deque] = {}  # drafter -> (tokens produced, seconds)
        self._lock = threading.Lock()
        self._fit: _Fit | None = None
        self._stale = 0  # observations since the fit
        self._seen = 0  # observations in all
        self._draft_cached: dict[str, tuple[float, float]] | None = None
        # curve(context) for the current fit and overhead (a round asks for the same
        # context two or three times): read-only arrays and the same as lists (the
        # controller's scalar arithmetic), emptied when either changes
        self._curves: dict[int | None, tuple[np.ndarray, list[float]]] = {}
        self.calibrated = False
        # Batched calls (module docstring); the batch model's own is None (it prices rows).
        self.batch: BatchCost | None = BatchCost(self) if batch_sequences > 0 else None

    # -- observations ----------------------------------------------------------------
    def observe(self, tokens: int, seconds: float, context: int | None = None) -> None:
        """One verify call fed ``tokens`` new tokens after ``context`` tokens (None:
        unknown, taken as 0) and took ``seconds``. While other sequences are in flight the
        call was (or waited for) a batched one: its time is the batch model's evidence
        (:meth:`BatchCost.observe_call`), not a lone round's."""
        if not 1 <= tokens <= self.max_tokens or not seconds > 0:
            return
        if self.batch is not None and not self.batch.alone():
            return
        c = max(0, int(context or 0))
        with self._lock:
            key = (tokens, c // self._bucket)
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = _Cell(self._window, len(self._table))
                self._table = np.vstack([self._table, np.zeros((1, 4))])
            cell.seconds.append(float(seconds))
            cell.contexts.append(c)
            self._table[cell.row] = (tokens, _median(cell.seconds), sum(cell.contexts) / len(cell.contexts),
                                     len(cell.seconds))
            self._stale += 1
            self._seen += 1

    def observe_overhead(self, seconds: float) -> None:
        if not seconds >= 0:
            return
        with self._lock:
            self._overhead_n += 1
            rate = max(0.05, 1.0 / self._overhead_n)
            self._overhead += rate * (float(seconds) - self._overhead)
            self._curves.clear()

    def observe_draft(self, drafter: str, tokens: int, seconds: float) -> None:
        """One proposal of a costly ``drafter`` produced ``tokens`` tokens (0: it declined)
        in ``seconds``."""
        if tokens < 0 or not seconds >= 0:
            return
        with self._lock:
            window = self._drafts.get(drafter)
            if window is None:
                window = self._drafts[drafter] = deque(maxlen=self._window)
            window.append((int(tokens), float(seconds)))
            self._draft_cached = None

    # -- estimates -------------------------------------------------------------------
    def draft_costs(self) -> dict[str, tuple[float, float]]:
        """{drafter: (seconds per call, seconds per drafted token)} for every costly drafter
        observed so far (a snapshot)."""
        with self._lock:
            if self._draft_cached is None:
                self._draft_cached = {name: _fit_draft_cost(obs) for name, obs in self._drafts.items() if obs}
            return dict(self._draft_cached)

    def curve(self, context: int | None = None) -> np.ndarray:
        """float64 [max_tokens + 1]: seconds per round feeding k tokens after ``context``
        tokens (None: the reference context, the observations' mean), overhead included
        (index k >= 1; index 0 unused); non-decreasing in k. Read-only: the array is shared by
        the calls at the same context until the fit or the overhead changes."""
        return self._curve(context)[0]

    def curve_list(self, context: int | None = None) -> list[float]:
        """:meth:`curve` as a list of floats (the same values; shared: read only)."""
        return self._curve(context)[1]

    def _curve(self, context: int | None) -> tuple[np.ndarray, list[float]]:
        with self._lock:
            fit = self._current()
            out = self._curves.get(context)
            if out is None:
                if len(self._curves) >= 64:
                    self._curves.clear()
                array = fit.at(context)
                array[1:] += self._overhead
                array.setflags(write=False)
                out = self._curves[context] = (array, array.tolist())
        return out

    def refresh(self) -> None:
        """Refit now when it is due (:meth:`_current`), so that the next :meth:`curve` finds
        the fit done (a caller with time to spare: banditspec.decoding.bookkeeping)."""
        with self._lock:
            self._current()

    def observed(self) -> bool:
        """Whether some cell holds enough observations to be fitted (else: the prior)."""
        with self._lock:
            return bool(len(self._table)) and bool((self._table[:, 3] >= self._min_obs).any())

    def verify_seconds(self, tokens: int, context: int | None = None) -> float:
        return float(self.curve(context)[tokens])

    def reference_context(self) -> float:
        with self._lock:
            return self._current().c0

    def _current(self) -> _Fit:
        """The fit, refitted when observations arrived since: after each one while the model
        is young (its first ``window`` observations), then after every ``REFIT_EVERY`` (a
        refit costs ~0.2-0.5 ms; the surface moves slowly). Called under the lock."""
        young = self._seen < self._window
        if self._fit is None or self._stale >= (1 if young else REFIT_EVERY):
            self._fit = self._estimate()
            self._stale = 0
            self._curves.clear()
        return self._fit

    def _estimate(self) -> _Fit:
        # One small least-squares problem over the cells' summaries (see _current for when).
        data = self._table[self._table[:, 3] >= self._min_obs]  # [cells, 4]: k, median, context, weight
        one, slope = self._prior
        f = np.zeros(self.max_tokens + 1)
        c0, b, t = 0.0, 0.0, 0.0
        if len(data):
            ks, weights, contexts = data[:, 0].astype(np.int64), data[:, 3], data[:, 2]
            c0 = float(weights @ contexts / weights.sum())
            spread = float(np.sqrt(weights @ (contexts - c0) ** 2 / weights.sum()))
            terms = ["b", "t"] if spread >= self._min_spread else []
            while True:
                values, slopes = _fit_surface(data, c0, terms)
                dropped = [name for name in terms if slopes.get(name, -1.0) < 0]  # negative or unidentified
                if not dropped:
                    break
                terms = [name for name in terms if name not in dropped]
            b, t = slopes.get("b", 0.0), slopes.get("t", 0.0)
            seen = sorted(values)
            total = np.bincount(ks, weights=weights, minlength=self.max_tokens + 1)  # observations per k
            if len(seen) >= 2:
                a, s = _line([k - 1 for k in seen], [values[k] for k in seen], [float(total[k]) for k in seen])
                a, s = max(a, 1e-6), max(s, 0.0)
            else:
                (k0,) = seen
                a = values[k0] / (1 + slope * (k0 - 1))
                s = slope * a
            weights_k = np.full(self.max_tokens + 1, UNOBSERVED_WEIGHT)
            for k in range(1, self.max_tokens + 1):
                f[k] = values.get(k, a + s * (k - 1))
                if k in values:
                    weights_k[k] = float(total[k])
            f[1:] = _isotonic(f[1:], weights_k[1:])
        else:
            for k in range(1, self.max_tokens + 1):
                f[k] = one + slope * one * (k - 1)
        return _Fit(f, c0, b, t)

    def relative(self, context: int | None = None) -> list[float]:
        """The curve as multiples of one token's cost, k = 1..max_tokens."""
        curve = self.curve(context)
        return [round(float(c / curve[1]), 4) for c in curve[1:]]

    def as_dict(self) -> dict:
        curve = self.curve()
        with self._lock:
            fit = self._current()
            per_k = np.bincount(self._table[:, 0].astype(np.int64), weights=self._table[:, 3],
                                minlength=self.max_tokens + 1)
            observations = [int(n) for n in per_k[1 : self.max_tokens + 1]]
        out = {
            "verify_ms": [round(1e3 * float(c), 3) for c in curve[1:]],
            "relative": [round(float(c / curve[1]), 4) for c in curve[1:]],
            "observations": observations,
            "reference_context": round(fit.c0, 1),
            # what 100 tokens of context add to a round: to every round, and per extra token fed
            "context_ms_per_100": [round(1e5 * fit.per_context, 4), round(1e5 * fit.per_context_token, 4)],
            "overhead_ms": round(1e3 * self._overhead, 3),
            "calibrated": self.calibrated,
            "draft_ms": {name: {"per_call": round(1e3 * call, 3), "per_token": round(1e3 * token, 3)}
                         for name, (call, token) in sorted(self.draft_costs().items())},
        }
        if self.batch is not None and self.batch.gathered():
            out["batch"] = self.batch.as_dict()
        return out

    @classmethod
    def fixed(cls, relative: Sequence[float], one_token_seconds: float = 0.05) -> CostModel:
        """A model that knows its curve (replay, tests): relative[k - 1] = cost(k) / cost(1),
        the same at every context."""
        model = cls(len(relative), prior_one_token_seconds=one_token_seconds, min_observations=1)
        for k, r in enumerate(relative, start=1):
            model.observe(k, one_token_seconds * float(r))
        model.calibrated = True
        return model

    @classmethod
    def from_table(cls, seconds: dict[int, dict[int, float]], max_tokens: int | None = None) -> CostModel:
        """A model that knows its surface (replay): {context: {k: seconds}}, measured at two
        or more contexts (``banditspec bench-engine --contexts``); k beyond the table follow
        the line through the measured ones."""
        top = max_tokens or max(k for row in seconds.values() for k in row)
        model = cls(top, min_observations=1, min_spread=0.0)
        for context, row in seconds.items():
            for k, value in row.items():
                model.observe(int(k), float(value), int(context))
        model.calibrated = True
        return model


def _fit_surface(data: np.ndarray, c0: float, terms: list[str]) -> tuple[dict[int, float], dict[str, float]]:
    """Weighted least squares of median = f[k] + x (b + t (k - 1)), x = (context - c0) /
    CONTEXT_SCALE, over the cells (``data``: rows of k, median, mean context, weight);
    returns ({k: f[k]}, {term: slope per context token}). A term the data cannot identify
    (rank-deficient) is left out of the slopes."""
    ks = data[:, 0].astype(np.int64)
    seen, column = np.unique(ks, return_inverse=True)
    root = np.sqrt(data[:, 3])
    x = (data[:, 2] - c0) / CONTEXT_SCALE
    design = np.zeros((len(data), len(seen) + len(terms)))
    design[np.arange(len(data)), column] = root
    for j, name in enumerate(terms):
        design[:, len(seen) + j] = root * (x if name == "b" else x * (ks - 1))
    solution, _, rank, _ = np.linalg.lstsq(design, root * data[:, 1], rcond=None)
    if rank < design.shape[1] and terms:  # drop the last term (t before b) and try again
        return _fit_surface(data, c0, terms[:-1])
    values = {int(k): float(solution[i]) for i, k in enumerate(seen)}
    slopes = {name: float(solution[len(seen) + j]) / CONTEXT_SCALE for j, name in enumerate(terms)}
    return values, slopes


def _isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool
    adjacent violators): a cell that came out too high is averaged with its neighbours, by
    their evidence, instead of lifting every longer length to its value (a running maximum
    did that: one noisy median at k = 5 priced k = 5..8 ~15 % too high)."""
    means: list[float] = []  # per block of pooled lengths: weighted mean, weight, lengths
    weights_: list[float] = []
    counts: list[int] = []
    for value, weight in zip(values.tolist(), weights.tolist()):
        means.append(value)
        weights_.append(weight)
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            mean, weight_sum, count = means.pop(), weights_.pop(), counts.pop()
            total = weights_[-1] + weight_sum
            means[-1] = (means[-1] * weights_[-1] + mean * weight_sum) / total
            weights_[-1] = total
            counts[-1] += count
    return np.array([mean for mean, count in zip(means, counts) for _ in range(count)])


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _line(xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, float]:
    """(a, b) of the weighted least-squares line y = a + b x (b = 0 when x does not vary)."""
    w = list(weights) if weights is not None else [1.0] * len(xs)
    total = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / total
    my = sum(wi * y for wi, y in zip(w, ys)) / total
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def _fit_draft_cost(observations: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(seconds per call, seconds per drafted token) through the median time of each
    number of tokens produced, weighted by how often it occurred; both >= 0."""
    groups: dict[int, list[float]] = {}
    for tokens, seconds in observations:
        groups.setdefault(tokens, []).append(seconds)
    xs = sorted(groups)
    a, b = _line(xs, [_median(groups[x]) for x in xs], [len(groups[x]) for x in xs])
    if b < 0:  # noise: more tokens cannot cost less; a flat cost per call
        a, b = _median([s for _, s in observations]), 0.0
    if a < 0:  # the line through the origin's side: all of it per token
        a, b = 0.0, _median([s / max(1, t) for t, s in observations])
    return a, b


@dataclass(frozen=True)
class BatchLoad:
    """What the other sequences put into the batched call a request's step joins (a
    snapshot of recent gathered calls): per step, their number, the rows (tokens) they
    feed, the tokens they yield, and their rows' mean context."""

    others: float
    rows: float
    tokens: float
    context: float
    # from a target that reports its passes (else 0): the most tokens one of the others
    # feeds, and the deepest context in the pass (a padded pass computes both for everyone)
    longest: float = 0.0
    deepest: float = 0.0


# How a batched step is priced: by the fit of packed passes, a sequence apart from its rows (the
# reference target on the panel kernels, TensorRT-LLM's inflight batches; the default), by the
# tokens fed alone (summed rows), or, where the target reports its padded passes, by the fit of
# those (bandits/pass_cost.py).
BATCH_PRICINGS = ("packed", "rows", "padded")


def check_batch_pricing(mode: str) -> str:
    """A batch pricing, normalised and checked (the error names ``batch_pricing``)."""
    normal = mode.strip().lower()
    if normal not in BATCH_PRICINGS:
        raise BanditSpecValidationError("batch_pricing", f"must be one of {', '.join(BATCH_PRICINGS)}, got {mode!r}")
    return normal


# How fast the load averages follow the gathered calls (per call).
LOAD_RATE = 0.1
# Contexts are priced under load in buckets of this many tokens (the batch curve is cached
# per context; a round's context moves by a few tokens a step).
LOAD_CONTEXT_BUCKET = 16


class BatchCost:
    """The cost of batched verify calls (module docstring), shared by a server's requests.

    ``observe_call`` takes each call the gatherer sends (engine/gather.py); ``load`` says
    what the other sequences in flight add to a step, None while the sequence is alone
    (``bind_active_sequences``: the server's exact count; unbound, a sequence is always
    alone, as in a process that decodes one request at a time)."""

    def __init__(self, single: CostModel, max_sequences: int = 32, pricing: str = "packed"):
        self.single = single
        self.pricing = check_batch_pricing(pricing)
        self.rows = CostModel(max(1, max_sequences) * single.max_tokens, batch_sequences=0)
        self._active: Callable[[], int] = lambda: 1
        self._lock = threading.Lock()
        self._calls = 0  # calls with at least one continuing sequence
        # decayed means over those calls: sequences a call; per continuing sequence: rows
        # fed, tokens yielded, context
        self._sequences = 0.0
        self._rows = 0.0
        self._tokens = 0.0
        self._context = 0.0
        # from reported passes of two or more sequences: decayed means of the most tokens one of
        # a sequence's others fed, and of the pass's deepest context
        self._passes_shared = 0
        self._longest = 0.0
        self._deepest = 0.0
        self.passes = PassCost()
        self.packed = PassCost(shape=PackedShape)
        self.prefill_calls = 0

    def bind_active_sequences(self, active: Callable[[], int]) -> None:
        self._active = active

    def alone(self) -> bool:
        """Whether no other sequence is in flight."""
        return self._active() <= 1

    def observe_pass(self, verified: VerifyPass) -> None:
        """One pass of the target as it measured it (engine/verify_pass.py): the evidence
        of choice, since a pass holds every sequence the target's batcher merged into it,
        not only one caller's group."""
        if verified.prefill:  # prompts, not rows of decoding steps: no share of the load
            with self._lock:
                self.prefill_calls += 1
            return
        if verified.sequences < 1 or verified.rows < 1:
            return
        n = verified.sequences
        self._learn(n, verified.rows / n, verified.produced / n, verified.context)
        if verified.seconds > 0:
            self.rows.observe(verified.rows, verified.seconds, round(verified.context))
            self.packed.observe(PackedShape(n, verified.rows, verified.context), verified.seconds)
        if verified.longest < 1:  # a target that does not say what it padded
            return
        self.passes.observe(PassShape(n, verified.longest, verified.deepest), verified.seconds)
        if n >= 2:
            # what its others fed at most, averaged over the pass's sequences: the longest
            # for all but the one that fed it, the runner-up for that one
            others_longest = ((n - 1) * verified.longest + verified.runner_up) / n
            with self._lock:
                self._passes_shared += 1
                rate = max(LOAD_RATE, 1.0 / self._passes_shared)
                self._longest += rate * (others_longest - self._longest)
                self._deepest += rate * (verified.deepest - self._deepest)

    def anchor_pass(self, verified: VerifyPass) -> None:
        """A lone pass of the calibration, kept in the fit of packed passes for good: under
        load the passes may all feed one row a sequence, and then only these tell a row's cost
        from a sequence's."""
        if not verified.prefill and verified.seconds > 0 and verified.rows >= 1:
            self.packed.anchor(PackedShape(verified.sequences, verified.rows, verified.context), verified.seconds)

    def observe_call(self, fed: Sequence[int], contexts: Sequence[int], produced: Sequence[int],
                     seconds: float, continues: Sequence[bool], queued: bool = False) -> None:
        """One batched call, where the target does not report its passes: per sequence,
        tokens ``fed`` (1 + draft), ``contexts`` (tokens before them), tokens ``produced``,
        and whether it ``continues`` an earlier step. A first step also prefills its prompt:
        such a call's time says nothing about rows (left out of the fit), and the first step
        is no share of the load. A ``queued`` call was sent while another was at the target:
        its time holds the wait for that one, so it is left out of the fit too."""
        if not fed or not seconds > 0:
            return
        steps = [i for i, c in enumerate(continues) if c]
        if len(steps) < len(fed):
            with self._lock:
                self.prefill_calls += 1
        if steps:
            n = len(steps)
            self._learn(len(fed), sum(fed[i] for i in steps) / n, sum(produced[i] for i in steps) / n,
                        sum(contexts[i] for i in steps) / n)
        if len(steps) == len(fed) and not queued:
            rows = sum(fed)
            context = sum(k * c for k, c in zip(fed, contexts)) / rows
            self.rows.observe(rows, seconds, round(context))
            self.packed.observe(PackedShape(len(fed), rows, context), seconds)

    def _learn(self, sequences: float, rows: float, tokens: float, context: float) -> None:
        """A step's sequences, and per continuing sequence its rows, tokens and context, into
        the decayed means."""
        with self._lock:
            self._calls += 1
            rate = max(LOAD_RATE, 1.0 / self._calls)
            self._sequences += rate * (sequences - self._sequences)
            self._rows += rate * (rows - self._rows)
            self._tokens += rate * (tokens - self._tokens)
            self._context += rate * (context - self._context)

    def gathered(self) -> bool:
        """Whether a gathered call has been observed."""
        with self._lock:
            return self._calls > 0 or self.prefill_calls > 0

    def load(self) -> BatchLoad | None:
        """What the others add to a step now; None while this sequence is alone or before
        any gathered call (the single-sequence model decides)."""
        active = self._active()
        if active <= 1:
            return None
        with self._lock:
            others = min(float(active), self._sequences) - 1.0
            if not self._calls or others <= 0.0:
                return None
            longest, deepest = (self._longest, self._deepest) if self._passes_shared else (0.0, 0.0)
            return BatchLoad(others, others * self._rows, others * self._tokens, self._context, longest, deepest)

    def step_seconds(self, context: int | None, load: BatchLoad) -> list[float]:
        """T(k), k = 0..max_tokens (index 0 unused): seconds of a step feeding k tokens after
        ``context`` while the others feed ``load`` (module docstring); non-decreasing in k."""
        own = self.single.curve_list(context)
        if self.padded(load):
            return self._padded_step_seconds(own, 0 if context is None else int(context), load)
        if self.pricing == "packed" and self.packed.ready():
            return self._packed_step_seconds(own, 0 if context is None else int(context), load)
        if self.rows.observed():
            c = 0 if context is None else int(context)
            call = (load.rows * load.context + c) / (load.rows + 1.0)  # the call's mean context
            joined = self.rows.curve_list(int(call) // LOAD_CONTEXT_BUCKET * LOAD_CONTEXT_BUCKET)
            alone = self.rows.curve_list(c // LOAD_CONTEXT_BUCKET * LOAD_CONTEXT_BUCKET)
        else:  # no call measured yet: rows cost what a lone sequence's tokens do
            joined = alone = own
        out = [own[0]]
        for k in range(1, len(own)):
            extra = _row_cost(joined, load.rows + k) - _row_cost(alone, float(k))
            out.append(max(out[-1], own[k] + max(0.0, extra)))
        return out

    def _packed_step_seconds(self, own: list[float], context: int, load: BatchLoad) -> list[float]:
        """step_seconds from the fit of packed passes: the pass of the others and this sequence
        feeding k, less this sequence's pass alone, on top of the lone curve. The others'
        sequences cost the same whatever k: only the rows' curve charges a draft."""
        sequences = load.others + 1.0
        out = [own[0]]
        for k in range(1, len(own)):
            rows = load.rows + k
            joined = self.packed.seconds(PackedShape(sequences, rows, (load.rows * load.context + k * context) / rows))
            alone = self.packed.seconds(PackedShape(1.0, float(k), float(context)))
            out.append(max(out[-1], own[k] + max(0.0, joined - alone)))
        return out

    def padded(self, load: BatchLoad) -> bool:
        """Whether ``load`` is priced by the fit of padded passes: ``pricing`` "padded", the
        target reports its passes and the fit is ready. The fit learns either way (the batch
        view shows it)."""
        return self.pricing == "padded" and load.longest >= 1 and self.passes.ready()

    def _padded_step_seconds(self, own: list[float], context: int, load: BatchLoad) -> list[float]:
        """step_seconds from the fit of padded passes (bandits/pass_cost.py): the pass this
        step joins, with the others' sequences, their longest run and their deepest context,
        less what a pass of this sequence alone would cost, on top of the lone curve. Rows up
        to the others' longest are padding the pass computes anyway: drafting into them adds
        nothing; each token beyond it adds a padded row for every sequence in the pass."""
        sequences = load.others + 1.0
        deepest = max(load.deepest, float(context))
        out = [own[0]]
        for k in range(1, len(own)):
            joined = self.passes.seconds(PassShape(sequences, max(load.longest, float(k)), deepest))
            alone = self.passes.seconds(PassShape(1.0, float(k), float(context)))
            out.append(max(out[-1], own[k] + max(0.0, joined - alone)))
        return out

    def as_dict(self) -> dict:
        load = self.load()
        with self._lock:
            summary: dict = {"calls": self._calls, "sequences_per_call": round(self._sequences, 3),
                             "rows_per_sequence": round(self._rows, 3),
                             "tokens_per_sequence": round(self._tokens, 3), "prefill_calls": self.prefill_calls}
        if self.rows.observed():
            fit = self.rows.as_dict()
            top = max((r for r, n in enumerate(fit["observations"], start=1) if n), default=0)
            summary["verify_ms_by_rows"] = fit["verify_ms"][:top]
            summary["observations_by_rows"] = fit["observations"][:top]
        summary["others_now"] = None if load is None else round(load.others, 3)
        if load is not None and load.longest:
            summary["others_longest"] = round(load.longest, 3)
            summary["deepest"] = round(load.deepest, 1)
        summary["pass_fit"] = self.passes.as_dict()
        summary["packed_fit"] = self.packed.as_dict()
        return summary


def _row_cost(curve: list[float], rows: float) -> float:
    """A curve over rows (index 1..) at fractional ``rows``: interpolated, and beyond its
    end extended by its last step."""
    top = len(curve) - 1
    if rows <= 1.0:
        return curve[1]
    if rows >= top:
        step = curve[top] - curve[top - 1] if top >= 2 else 0.0
        return curve[top] + step * (rows - top)
    low = int(rows)
    return curve[low] + (curve[low + 1] - curve[low]) * (rows - low)


CALIBRATION_CONTEXTS = (32, 320)  # cached tokens the target is timed after when it loads
# (each context is one prefill first: 512 tokens took 2.8 s of a 6.4 s calibration here, 320 take 1.5 s)


def calibration_plan(max_tokens: int, contexts: Sequence[int] = CALIBRATION_CONTEXTS) -> list[tuple[int, list[int]]]:
    """What to time when the target loads: [(cached tokens, ks)]: every k = 1..max_tokens
    after the first context, and k = 1, the middle k and max_tokens after each further one
    (the context slopes need two contexts, not every k at both)."""
    top = max(1, max_tokens)
    return [(int(c), list(range(1, top + 1)) if i == 0 else sorted({1, (1 + top) // 2, top}))
            for i, c in enumerate(contexts)]


def calibrate(model: CostModel, timed_forward: Callable[[int], float], reps: int = 3) -> CostModel:
    """Time ``timed_forward(k)`` (seconds of one verify feeding k tokens) ``reps`` times
    for every k and seed the model with the observations."""
    for _ in range(reps):
        for k in range(1, model.max_tokens + 1):
            model.observe(k, timed_forward(k))
    model.calibrated = True
    return model
