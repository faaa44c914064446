"""What a decoding round costs on this platform: the verify-cost curve and drafting costs.

A round that feeds k = 1 + gamma tokens to the target costs ``verify_seconds(k)``; on a
GPU that is almost flat in k, on a CPU engine it may grow steeply. The curve is
calibrated once (a few timed forwards when the target loads, :func:`calibrate`) and
refined online from measured verify times with a robust estimator: the median of the
last ``window`` observations per k. Unobserved k are filled by a least-squares line
through the observed medians (or the prior slope while only one k is known), and the
curve is made non-decreasing. ``overhead_seconds`` is what a round costs besides the
verify call (proposals, bookkeeping), an exponential average.

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
        self._lock = threading.Lock()
        self._cached: np.ndarray | None = None
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

    # -- estimates -------------------------------------------------------------------
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
        ks = [k for k in range(1, self.max_tokens + 1) if len(self._obs[k]) >= self._min_obs]
        medians = {k: float(np.median(self._obs[k])) for k in ks}
        one, slope = self._prior
        if len(ks) >= 2:
            x = np.array(ks, dtype=np.float64)
            y = np.array([medians[k] for k in ks])
            b, a = np.polyfit(x - 1, y, 1)  # y = a + b (k - 1)
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
        }

    @classmethod
    def fixed(cls, relative: Sequence[float], one_token_seconds: float = 0.05) -> "CostModel":
        """A model that knows its curve (replay, tests): relative[k - 1] = cost(k) / cost(1)."""
        model = cls(len(relative), prior_one_token_seconds=one_token_seconds, min_observations=1)
        for k, r in enumerate(relative, start=1):
            model._obs[k].append(one_token_seconds * float(r))
        model.calibrated = True
        return model


def calibrate(model: CostModel, timed_forward: Callable[[int], float], reps: int = 3) -> CostModel:
    """Time ``timed_forward(k)`` (seconds of one verify feeding k tokens) ``reps`` times
    for every k and seed the model with the observations."""
    for _ in range(reps):
        for k in range(1, model.max_tokens + 1):
            model.observe(k, timed_forward(k))
    model.calibrated = True
    return model
