"""What a decoding round costs on this platform: the verify-cost curve and drafting costs.

A round that feeds k = 1 + gamma tokens to the target costs ``verify_seconds(k)``; on a
GPU that is almost flat in k, on a CPU engine it may grow steeply. The curve is
calibrated once (a few timed forwards when the target loads, :func:`calibrate`) and
refined online from measured verify times with a robust estimator: the median of the
last ``window`` observations per k. Unobserved k are filled by a least-squares line
through the observed medians (or the prior slope while only one k is known), and the
curve is made non-decreasing. ``overhead_seconds`` is what a round costs besides the
verify call (proposals, bookkeeping), an exponential average.

Costly drafters (an Eagle head, a draft engine, either in this process or another model
reached through BLS) cost time per proposal: ``draft_costs()`` gives, per drafter, seconds
per call plus seconds per drafted token, fitted (like the curve) through the medians of
the last ``window`` proposals grouped by tokens produced. Server-wide, so that a new
request starts knowing what the drafter costs (a per-request estimate made every request
try the drafter at no cost first).

Thread-safe: one model is shared by every request of a server. Decisions read it
through :meth:`curve` (a snapshot), so a request's choices are a deterministic
function of (its statistics, the snapshot it read).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Sequence

import numpy as np

from banditspec.errors import BanditSpecValidationError


class CostModel:
    def __init__(
        self,
        max_tokens: int,
        *,
        prior_one_token_seconds: float = 0.05,
        prior_slope: float = 0.25,
        window: int = 64,
        min_observations: int = 3,
    ):
        """max_tokens: largest k (1 + L); prior_slope: extra cost per extra token as a share
        of one token's cost, used until two k have been observed."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise BanditSpecValidationError("max_tokens", f"must be an int >= 1, got {max_tokens!r}")
        if not prior_one_token_seconds > 0 or not prior_slope >= 0:
            raise BanditSpecValidationError("prior", "one-token cost must be > 0 and slope >= 0")
        self.max_tokens = max_tokens
        self._prior = (float(prior_one_token_seconds), float(prior_slope))
        self._min_obs = min_observations
        self._obs: list[deque] = [deque(maxlen=window) for _ in range(max_tokens + 1)]  # index k
        self._overhead = 0.0
        self._overhead_n = 0
        self._window = window
        self._drafts: dict[str, deque] = {}  # drafter -> (tokens produced, seconds)
        self._lock = threading.Lock()
        self._cached: np.ndarray | None = None
        self._draft_cached: dict[str, tuple[float, float]] | None = None
        self.calibrated = False

    # -- observations ----------------------------------------------------------------
    def observe(self, tokens: int, seconds: float) -> None:
        """One verify call fed ``tokens`` new tokens and took ``seconds``."""
        if not 1 <= tokens <= self.max_tokens or not seconds > 0:
            return
        with self._lock:
            self._obs[tokens].append(float(seconds))
            self._cached = None

    def observe_overhead(self, seconds: float) -> None:
        if not seconds >= 0:
            return
        with self._lock:
            self._overhead_n += 1
            rate = max(0.05, 1.0 / self._overhead_n)
            self._overhead += rate * (float(seconds) - self._overhead)
            self._cached = None

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

    def curve(self) -> np.ndarray:
        """float64 [max_tokens + 1]: seconds per round feeding k tokens (index k >= 1;
        index 0 unused), overhead included; non-decreasing in k."""
        with self._lock:
            if self._cached is None:
                self._cached = self._estimate()
            return self._cached.copy()

    def verify_seconds(self, tokens: int) -> float:
        return float(self.curve()[tokens])

    def _estimate(self) -> np.ndarray:
        # Recomputed after every observation, i.e. every decoding round: plain Python on a
        # few short lists (numpy's median and polyfit cost ~1 ms a round here).
        ks = [k for k in range(1, self.max_tokens + 1) if len(self._obs[k]) >= self._min_obs]
        medians = {k: _median(self._obs[k]) for k in ks}
        one, slope = self._prior
        if len(ks) >= 2:
            a, b = _line([k - 1 for k in ks], [medians[k] for k in ks])  # y = a + b (k - 1)
            a, b = max(a, 1e-6), max(b, 0.0)
        elif len(ks) == 1:
            (k0,) = ks
            a = medians[k0] / (1 + slope * (k0 - 1))
            b = slope * a
        else:
            a, b = one, slope * one
        out = np.zeros(self.max_tokens + 1)
        for k in range(1, self.max_tokens + 1):
            out[k] = medians.get(k, a + b * (k - 1))
        out[1:] = np.maximum.accumulate(out[1:])
        out[1:] += self._overhead
        return out

    def relative(self) -> list[float]:
        """The curve as multiples of one token's cost, k = 1..max_tokens."""
        curve = self.curve()
        return [round(float(c / curve[1]), 4) for c in curve[1:]]

    def as_dict(self) -> dict:
        curve = self.curve()
        return {
            "verify_ms": [round(1e3 * float(c), 3) for c in curve[1:]],
            "relative": self.relative(),
            "observations": [len(self._obs[k]) for k in range(1, self.max_tokens + 1)],
            "overhead_ms": round(1e3 * self._overhead, 3),
            "calibrated": self.calibrated,
            "draft_ms": {name: {"per_call": round(1e3 * call, 3), "per_token": round(1e3 * token, 3)}
                         for name, (call, token) in sorted(self.draft_costs().items())},
        }

    @classmethod
    def fixed(cls, relative: Sequence[float], one_token_seconds: float = 0.05) -> "CostModel":
        """A model that knows its curve (replay, tests): relative[k - 1] = cost(k) / cost(1)."""
        model = cls(len(relative), prior_one_token_seconds=one_token_seconds, min_observations=1)
        for k, r in enumerate(relative, start=1):
            model._obs[k].append(one_token_seconds * float(r))
        model.calibrated = True
        return model


def _median(values) -> float:
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


def _fit_draft_cost(observations) -> tuple[float, float]:
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


def calibrate(model: CostModel, timed_forward: Callable[[int], float], reps: int = 3) -> CostModel:
    """Time ``timed_forward(k)`` (seconds of one verify feeding k tokens) ``reps`` times
    for every k and seed the model with the observations."""
    for _ in range(reps):
        for k in range(1, model.max_tokens + 1):
            model.observe(k, timed_forward(k))
    model.calibrated = True
    return model
