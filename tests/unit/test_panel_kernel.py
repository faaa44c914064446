"""The panel GEMM kernel: right values, and bitwise the same row whatever the row count.

The second property is what makes a verify step compute exactly what one-token decoding
computes in the projections; it is checked directly here (and end to end by the
lossless suite on the real model)."""

from __future__ import annotations

import pytest
import torch

from banditspec.engine import panel_kernel
from banditspec.engine.panel_kernel import PanelLinear


@pytest.fixture(scope="module")
def library():
    lib = panel_kernel.load()
    assert lib is not None, f"the panel kernel must build and run here: {panel_kernel.unavailable_reason()}"
    return lib


# shapes: the model's own (qkv, o, gate/up, down) and ragged ones (a partial panel, a
# partial group of panels, a K that is not a multiple of the k block, K = 1)
SHAPES = [(960, 576), (576, 1536), (3072, 64), (100, 37), (16, 5), (7, 1), (97 * 16 + 3, 33)]


@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_values_match_float64(library, out_features, in_features):
    generator = torch.Generator().manual_seed(out_features * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    x = torch.randn(19, in_features, generator=generator)
    y = PanelLinear(weight, library)(x)
    assert y.shape == (19, out_features) and y.dtype == torch.float32
    expected = x.double() @ weight.double().t()
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-4 * (in_features ** 0.5))


@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_a_row_is_bitwise_the_same_in_any_call(library, out_features, in_features):
    generator = torch.Generator().manual_seed(7 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    x = torch.randn(40, in_features, generator=generator)
    linear = PanelLinear(weight, library)
    full = linear(x)
    for rows in (1, 2, 5, 6, 7, 13, 17):
        for start in (0, 40 - rows):
            assert torch.equal(linear(x[start : start + rows]), full[start : start + rows]), (rows, start)


def test_shapes_threads_and_inputs(library):
    weight = torch.randn(200, 48)
    linear = PanelLinear(weight, library)
    x = torch.randn(2, 3, 48)
    y = linear(x)
    assert y.shape == (2, 3, 200)
    assert torch.equal(linear(x.transpose(0, 1).contiguous().transpose(0, 1)), y)  # non-contiguous input
    assert linear(torch.empty(0, 48)).shape == (0, 200)
    threads = torch.get_num_threads()
    many = torch.randn(70, 48)  # >= 64 rows (a prefill): panels shared out among threads
    alone = linear(many)
    try:
        torch.set_num_threads(2)
        assert torch.equal(linear(x), y)  # a decoding step stays on one thread
        assert torch.equal(linear(many), alone)  # threads: same values
    finally:
        torch.set_num_threads(threads)


def test_build_is_cached_and_keyed_by_source(library):
    path = panel_kernel.build()
    assert path.exists() and path.parent.parent.name == "kernels"
    assert panel_kernel.build() == path  # no rebuild


def test_engine_keeps_freed_memory_in_the_heap():
    from banditspec.engine import allocator

    assert allocator.keep_freed_memory() is True  # glibc here: the thresholds were accepted
    assert allocator.keep_freed_memory() is True  # once per process, idempotent
