"""Shared fixtures for unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_engine():
    """A ReferenceEngine over the cached random-weight "tiny" Llama (SmolLM2 tokenizer, vocab 49152).

    Shared by the session: call ``engine.clear()`` first when a test counts positions.
    """
    from banditspec.engine.reference import ReferenceEngine

    return ReferenceEngine.from_name("tiny", max_context=512)
