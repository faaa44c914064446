"""The argument checks every validator of the package shares: what counts as an integer
or a number (a bool is neither), and the range checks built on them. Each error is a
:class:`~banditspec.errors.BanditSpecValidationError` naming the field."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import TypeGuard

from banditspec.errors import BanditSpecValidationError


def is_int(value: object) -> TypeGuard[int]:
    """An integer (Python or numpy); a bool is not one."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A real number (Python or numpy, integer or float); a bool is not one."""
    return isinstance(value, Real) and not isinstance(value, bool)


def is_finite(value: object) -> bool:
    """A real number that is neither infinite nor NaN."""
    return is_number(value) and math.isfinite(value)


def check_int(field: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in [low, high] (either bound optional), else
    BanditSpecValidationError(field, "must be an integer ..., got ...")."""
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            bounds = f" in {low}..{high}"
        elif low is not None:
            bounds = f" >= {low}"
        elif high is not None:
            bounds = f" <= {high}"
        else:
            bounds = ""
        raise BanditSpecValidationError(field, f"must be an integer{bounds}, got {value!r}")
    return int(value)
