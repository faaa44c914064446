"""Settings of the server-wide speculation-length controller and its load contexts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from banditspec.checks import check_int, is_number
from banditspec.config import MAX_SPECULATION_LENGTH
from banditspec.errors import BanditSpecValidationError


def _check_real(field: str, value: object, low: float, high: float, *, low_open: bool = False) -> None:
    in_range = is_number(value) and math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not in_range:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise BanditSpecValidationError(field, f"must be a number in {interval}, got {value!r}")


@dataclass(frozen=True)
class GammaControllerConfig:
    """How the controller measures and learns.

    max_gamma:          L; the controller chooses gamma in 0..L (0 = plain decoding)
    max_bucket:         load contexts are the powers of two 1, 2, 4, ... max_bucket; a number
                        of active sequences goes to the nearest one on a log scale
    steps_per_sequence: a round measures at least this many steps per active sequence
    min_round_steps:    ... and at least this many steps in all
    min_round_seconds:  ... and lasts at least this long
    max_gap_seconds:    a round that sees no call for this long (idle server) is dropped
    stall_factor:       a measured step longer than this many times the round's median step
                        is left out of the reward (it waited for a prefill, say)
    discount:           statistics of a context shrink by this factor at each of its rewards
    exploration:        scale on UCBSpec's confidence radius (1 = the paper's worst-case radius)
    delta:              UCBSpec's confidence parameter
    prior_weight:       pulls per gamma that a new context borrows from its nearest learned
                        neighbour (0 = every context starts by trying each gamma once)
    """

    max_gamma: int = 4
    max_bucket: int = 32
    steps_per_sequence: int = 4
    min_round_steps: int = 16
    min_round_seconds: float = 0.25
    max_gap_seconds: float = 3.0
    stall_factor: float = 3.0
    discount: float = 0.98
    exploration: float = 0.1
    delta: float = 0.5
    prior_weight: float = 1.0
    unimodal: bool = True

    def __post_init__(self) -> None:
        check_int("max_gamma", self.max_gamma, 1, MAX_SPECULATION_LENGTH)
        check_int("max_bucket", self.max_bucket, 1, 1 << 16)
        if self.max_bucket & (self.max_bucket - 1):
            raise BanditSpecValidationError("max_bucket", f"must be a power of two, got {self.max_bucket}")
        check_int("steps_per_sequence", self.steps_per_sequence, 1)
        check_int("min_round_steps", self.min_round_steps, 1)
        _check_real("min_round_seconds", self.min_round_seconds, 0.0, 3600.0)
        _check_real("max_gap_seconds", self.max_gap_seconds, 0.0, 3600.0, low_open=True)
        _check_real("stall_factor", self.stall_factor, 1.0, 1000.0)
        _check_real("discount", self.discount, 0.0, 1.0, low_open=True)
        _check_real("exploration", self.exploration, 0.0, 100.0)
        _check_real("delta", self.delta, 0.0, 0.999999, low_open=True)
        _check_real("prior_weight", self.prior_weight, 0.0, 1000.0)

    @property
    def n_buckets(self) -> int:
        return self.max_bucket.bit_length()

    def bucket_of(self, active_sequences: float) -> int:
        """Context index of a number of active sequences: round(log2(n)) clipped to the buckets.
        Index b stands for 2**b sequences (the last one for max_bucket and more)."""
        n = max(float(active_sequences), 1.0)
        return min(int(math.floor(math.log2(n) + 0.5)), self.n_buckets - 1)

    def bucket_label(self, bucket: int) -> str:
        size = 1 << bucket
        return f"{size}+" if bucket == self.n_buckets - 1 else str(size)
