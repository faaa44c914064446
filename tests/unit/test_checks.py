"""banditspec.checks: a bool is neither an integer nor a number; range errors name the field."""

from __future__ import annotations

import numpy as np
import pytest
from banditspec.checks import check_int, is_finite, is_int, is_number
from banditspec.errors import BanditSpecValidationError


def test_what_counts_as_an_integer_or_a_number():
    assert is_int(3) and is_int(np.int32(3)) and not is_int(True) and not is_int(3.0) and not is_int("3")
    assert is_number(2.5) and is_number(np.float32(1)) and is_number(4) and not is_number(False)
    assert is_finite(1.0) and not is_finite(float("nan")) and not is_finite(float("inf")) and not is_finite(None)


@pytest.mark.parametrize("value, low, high, message", [
    (True, None, None, "n: must be an integer, got True"),
    (0, 1, None, "n: must be an integer >= 1, got 0"),
    (5, 1, 4, "n: must be an integer in 1..4, got 5"),
    (2.0, None, 4, "n: must be an integer <= 4, got 2.0"),
])
def test_check_int_names_the_field_and_the_range(value, low, high, message):
    with pytest.raises(BanditSpecValidationError) as error:
        check_int("n", value, low, high)
    assert str(error.value) == message
    assert check_int("n", np.int64(3), 1, 4) == 3 and type(check_int("n", np.int64(3))) is int
