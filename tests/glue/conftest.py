"""The models' ``initialize`` freezes the heap (banditspec.serving.heap, parameter ``gc_freeze``); in
this one test process that would make everything alive at that moment permanent, so each
glue test hands the frozen objects back to the collector when it ends."""

import gc

import pytest


@pytest.fixture(autouse=True)
def _unfreeze_after():
    yield
    gc.unfreeze()
