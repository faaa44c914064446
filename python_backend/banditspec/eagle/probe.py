"""A head's first-token probe: whether pulling the Eagle head now would pay, without calling it.

The costaware controller pulls the Eagle arm blind (a preview costs a head call: the
catch-up on new target features plus an LM-head scoring with the weights cold after a target
forward, and through Triton a BLS round trip too), and most pulls decline
(the head's first token is below its confidence cut-off). The probe answers from what the
controller already holds: the target's feature at the last position (the state that produced
the token the target just emitted, the head's next input), through one logistic regression:

    P(hit) = sigmoid(weights . f + bias)     f: float32 [F], the row the head reads (EAGLE-1: F = hidden)

"hit" = the head, pulled now, drafts a first token (its confidence at or above the cut-off) and
the target accepts it. The feature's normalisation is folded into ``weights`` / ``bias``.
Fitted by ``engine_build/eagle/fit_probe.py`` on self-generated greedy continuations of the
project's training prompts; stored in the head's JSON (``first_token_probe``), so a head
without one is pulled blind as before. The controller uses the probability as the blind
candidate's context (banditspec.bandits.costaware.hint_level) and learns each level's real
outcome from its pulls; the probe never decides alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from banditspec.errors import BanditSpecValidationError

PROBE_KEY = "first_token_probe"  # its place in the head's JSON


@dataclass(frozen=True)
class FirstTokenProbe:
    """weights: float32 [F]; bias: float (the feature's normalisation folded in)."""

    weights: np.ndarray
    bias: float

    def __post_init__(self) -> None:
        weights = np.asarray(self.weights, dtype=np.float32).reshape(-1)
        if weights.size == 0 or not np.all(np.isfinite(weights)) or not math.isfinite(float(self.bias)):
            raise BanditSpecValidationError(PROBE_KEY, "weights must be a non-empty finite vector, bias finite")
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "bias", float(self.bias))

    @property
    def feature_size(self) -> int:
        return int(self.weights.size)

    def __call__(self, feature: np.ndarray) -> float:
        """P(hit) for one feature row [F]."""
        row = np.asarray(feature, dtype=np.float32).reshape(-1)
        if row.size != self.weights.size:
            raise BanditSpecValidationError("hidden_states", f"the probe reads rows of {self.weights.size}, got {row.size}")
        z = float(np.dot(self.weights, row)) + self.bias
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def as_json(self, **about: Any) -> dict:
        return {"weights": [round(float(w), 7) for w in self.weights], "bias": round(self.bias, 7), **about}

    @classmethod
    def from_json(cls, data: dict) -> FirstTokenProbe:
        try:
            return cls(np.asarray(data["weights"], dtype=np.float32), float(data["bias"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BanditSpecValidationError(PROBE_KEY, f"malformed: {exc}") from None


def head_probe(weights: Path) -> FirstTokenProbe | None:
    """The probe stored in the JSON beside a head's ``weights``; None when it has none."""
    from banditspec.eagle.head3 import head_info

    data = head_info(weights).get(PROBE_KEY)
    return None if data is None else FirstTokenProbe.from_json(data)
