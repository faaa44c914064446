"""Fixtures shared by the slow tests (real SmolLM2 weights)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2_stack():
    """The whole in-process stack over SmolLM2 ("fast" kernels) with every drafter, Eagle included."""
    from banditspec.serving.runtime import load_local

    return load_local("smollm2", arms=("pld", "suffix", "rest", "eagle", "copy"))
