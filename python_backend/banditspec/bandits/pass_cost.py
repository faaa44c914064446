"""What one pass of the target costs, learned from the passes it reports: padded or packed.

A padded-batch target (the reference target on kernels other than the panel ones,
engine/reference.py; on the panel kernels its passes are packed and it reports no padding)
verifies the sequences of a pass as one padded batch: every sequence's new tokens are padded
to the most that any of them feeds, its cached K/V are left-padded to the deepest context
and gathered into the batch.
So a pass of B sequences, the longest feeding N tokens, the deepest after C cached tokens,
costs about

    seconds = a + s * B + r * B * N + x * B * C / 1000

a: what any pass costs; s: what a sequence adds whatever it feeds (its state gathered and
scattered, its rows' bookkeeping); r: a padded row (every sequence computes N rows, real or
not); x: a cached position of the padded K/V, per sequence. A sum of the tokens fed (what a
packed batch costs) cannot tell these apart: under load, rows and sequences grow together,
and a row then looks as costly as a sequence, so every drafted token looks dear, while a
draft no longer than the others' longest costs nothing at all.

The fit is a least-squares fit over the last ``window`` passes with non-negative
coefficients (the best of the fits over subsets of the terms whose coefficients all come out
non-negative), redone every ``refit_every`` passes, then once more without the passes far
off it. It is ready once it has seen
``min_passes`` passes holding at least two different numbers of sequences and two
different longest drafts (else s and r are not identifiable).

A packed target (the reference target on the panel kernels; TensorRT-LLM's inflight batches)
lays every sequence's rows side by side: a pass of S sequences feeding R rows in all, after a
mean context of C cached tokens per row, costs about

    seconds = a + s * S + r * R + x * R * C / 1000 + sum_j h_j * max(0, R - K_j)

s: what a sequence adds whatever it feeds (its K/V buffer's attention call, its bookkeeping);
r: a row; x: a row's attention over its context; the hinges at K_j rows (non-negative, so the
curve is convex): a few rows ride on one read of the weights, many rows are compute-bound.
Fitted over rows alone, a sequence's cost lands on the rows (under load they grow together:
on the reference target a row then read ~4.5 ms against 2.8 ms), which makes a drafted token
look dearer the fewer tokens the sequences draft.

Thread-safe: one fit is shared by every request of a server.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from banditspec.errors import BanditSpecValidationError

CONTEXT_SCALE = 1000.0  # context enters the fit in thousands of tokens (conditioning)
OUTLIER_MADS = 6.0  # a pass whose residual exceeds this many median residuals is left out of the refit
HINGES = (8, 32, 128)
ANCHORS = 128  # anchored passes kept  # rows where a packed pass's cost per row may rise (convex, not fixed)


@dataclass(frozen=True)
class PassShape:
    """What a padded pass computes: ``sequences`` B, the ``longest`` run of tokens one of them
    feeds N, the ``deepest`` context C (cached tokens before those fed)."""

    sequences: float
    longest: float
    deepest: float

    TERMS: ClassVar[tuple[str, ...]] = ("base", "per_sequence", "per_padded_row", "per_padded_kilo_context")

    def features(self) -> list[float]:
        # [1, B, B N, B C]: the third over the second is N, the draft that tells a row from a sequence
        b = self.sequences
        return [1.0, b, b * self.longest, b * self.deepest / CONTEXT_SCALE]


@dataclass(frozen=True)
class PackedShape:
    """What a packed pass computes: ``sequences`` S, ``rows`` R (the tokens all of them feed),
    and the rows' mean ``context`` C (cached tokens before each)."""

    sequences: float
    rows: float
    context: float

    TERMS: ClassVar[tuple[str, ...]] = ("base", "per_sequence", "per_row", "per_row_kilo_context",
                                        *(f"per_row_beyond_{k}" for k in HINGES))

    def features(self) -> list[float]:
        # [1, S, R, R C, hinges]: the third over the second is R / S, rows a sequence feeds
        r = self.rows
        return [1.0, self.sequences, r, r * self.context / CONTEXT_SCALE, *(max(0.0, r - k) for k in HINGES)]



class PassCost:
    def __init__(self, window: int = 512, refit_every: int = 16, min_passes: int = 32,
                 shape: type[PassShape] | type[PackedShape] = PassShape):
        if window < 4 or refit_every < 1 or min_passes < 4:
            raise BanditSpecValidationError("window", "window and min_passes must be >= 4, refit_every >= 1")
        self.terms = shape.TERMS
        self._rows: deque[tuple[list[float], float]] = deque(maxlen=window)
        # passes kept in every refit whatever the window holds (the calibration's lone passes:
        # under load every pass may hold as many rows as sequences, and they alone then tell
        # what a row costs apart from a sequence)
        self._anchors: deque[tuple[list[float], float]] = deque(maxlen=ANCHORS)
        self._refit_every = refit_every
        self._min_passes = min_passes
        self._since_fit = 0
        self._coef: np.ndarray | None = None
        self._lock = threading.Lock()

    def observe(self, shape: PassShape | PackedShape, seconds: float) -> None:
        if shape.sequences < 1 or shape.features()[2] < 1 or not seconds > 0:
            return
        with self._lock:
            self._rows.append((shape.features(), float(seconds)))
            self._since_fit += 1
            if len(self._rows) >= self._min_passes and (self._coef is None or self._since_fit >= self._refit_every):
                self._refit()

    def anchor(self, shape: PassShape | PackedShape, seconds: float) -> None:
        """A pass to keep in every refit (at most ``ANCHORS``, the oldest dropped first)."""
        if shape.sequences < 1 or shape.features()[2] < 1 or not seconds > 0:
            return
        with self._lock:
            self._anchors.append((shape.features(), float(seconds)))
            self._coef = None  # refit with it at the next pass
            self._since_fit = self._refit_every

    def _refit(self) -> None:
        rows = [*self._anchors, *self._rows]
        x = np.asarray([f for f, _ in rows])
        y = np.asarray([s for _, s in rows])
        self._since_fit = 0
        if len(set(x[:, 1])) < 2 or len(set((x[:, 2] / x[:, 1]).round(6))) < 2:
            return  # one batch size, or one draft length a sequence: s and r are not told apart
        coef = _nonnegative_fit(x, y)
        # once more without the passes far off the fit (a pause of the process, a cache miss)
        residual = np.abs(x @ coef - y)
        keep = residual <= OUTLIER_MADS * max(float(np.median(residual)), 1e-6)
        self._coef = _nonnegative_fit(x[keep], y[keep]) if keep.sum() >= self._min_passes else coef

    def ready(self) -> bool:
        with self._lock:
            return self._coef is not None

    def seconds(self, shape: PassShape | PackedShape) -> float:
        """The fitted seconds of a pass of ``shape`` (call only when :meth:`ready`)."""
        with self._lock:
            coef = self._coef
        if coef is None:
            raise RuntimeError("PassCost.seconds before the fit is ready")
        return float(np.dot(coef, shape.features()))

    def as_dict(self) -> dict:
        with self._lock:
            coef, n = self._coef, len(self._rows)
        fit = None if coef is None else {t: round(1000.0 * float(c), 4) for t, c in zip(self.terms, coef)}
        return {"passes": n, "ms": fit}


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin |x c - y| over c >= 0, the intercept free: the least-squares fits over every
    subset of the other terms, the best of those whose coefficients are all >= 0 (four terms:
    eight small solves; seven: 64)."""
    n_terms = x.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for size in range(n_terms - 1, -1, -1):
        for subset in itertools.combinations(range(1, n_terms), size):
            cols = [0, *subset]
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(coef[1:] < 0):
                continue
            residual = float(np.sum((x[:, cols] @ coef - y) ** 2))
            if best is None or residual < best[0]:
                full = np.zeros(n_terms)
                full[cols] = coef
                best = (residual, full)
    assert best is not None  # the intercept alone is always feasible
    return best[1]
