"""Non-learning baselines: a fixed arm, and a uniformly random arm.

Also holds the argument checks shared by every policy of this package
(``check_n_arms``, ``check_available``, ``check_update``), so that each policy
rejects bad input with the same :class:`BanditSpecValidationError` messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from banditspec.checks import check_int, is_int, is_number
from banditspec.errors import BanditSpecValidationError


def check_n_arms(n_arms: object) -> int:
    """``n_arms`` as an int >= 1, else BanditSpecValidationError('n_arms')."""
    return check_int("n_arms", n_arms, 1)


def check_positive(field: str, value: object) -> float:
    """``value`` as a finite float > 0, else BanditSpecValidationError(field)."""
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise BanditSpecValidationError(field, f"must be a finite number > 0, got {value!r}")
    return float(value)


def check_rng(rng: object) -> np.random.Generator:
    """``rng`` must be a seeded ``numpy.random.Generator`` (the caller owns the seed)."""
    if not isinstance(rng, np.random.Generator):
        raise BanditSpecValidationError("rng", f"must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _check_arm(arm: object, n_arms: int, field: str) -> int:
    if not is_int(arm) or not 0 <= arm < n_arms:
        raise BanditSpecValidationError(field, f"arm index must be an integer in [0, {n_arms}), got {arm!r}")
    return int(arm)


def check_available(available: Sequence[int], n_arms: int) -> list[int]:
    """The available arm indices, sorted ascending and de-duplicated.

    Raises BanditSpecValidationError('available') when empty or out of [0, n_arms).
    """
    arms = sorted({_check_arm(arm, n_arms, "available") for arm in available})
    if not arms:
        raise BanditSpecValidationError("available", "no arm is available")
    return arms


def check_update(arm: object, reward: object, n_arms: int) -> tuple[int, float]:
    """(arm, reward) checked: arm in [0, n_arms), reward a finite number."""
    arm_index = _check_arm(arm, n_arms, "arm")
    if not is_number(reward) or not math.isfinite(reward):
        raise BanditSpecValidationError("reward", f"must be a finite number, got {reward!r}")
    return arm_index, float(reward)


class FixedArmPolicy:
    """Always pulls ``arm``.

    When ``arm`` is not among the available arms (its drafter failed during the
    request), the lowest available arm is pulled instead: a fixed-arm request
    still completes, losslessly, with what is left.
    """

    def __init__(self, arm: int, n_arms: int):
        self.n_arms = check_n_arms(n_arms)
        self.arm = _check_arm(arm, self.n_arms, "arm")

    def select(self, available: Sequence[int]) -> int:
        arms = check_available(available, self.n_arms)
        return self.arm if self.arm in arms else arms[0]

    def update(self, arm: int, reward: float) -> None:
        check_update(arm, reward, self.n_arms)


class UniformPolicy:
    """Pulls an arm uniformly at random among the available ones (a simulator baseline)."""

    def __init__(self, n_arms: int, rng: np.random.Generator):
        self.n_arms = check_n_arms(n_arms)
        self.rng = check_rng(rng)

    def select(self, available: Sequence[int]) -> int:
        arms = check_available(available, self.n_arms)
        return arms[int(self.rng.integers(len(arms)))]

    def update(self, arm: int, reward: float) -> None:
        check_update(arm, reward, self.n_arms)
