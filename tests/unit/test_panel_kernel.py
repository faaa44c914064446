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


def test_build_is_cached_and_keyed_by_every_source(library):
    path = panel_kernel.build()
    assert path.exists() and path.parent.parent.name == "kernels"
    assert panel_kernel.build() == path  # no rebuild
    # every file of kernels/ is a source of the one library (so it is in the cache key)
    assert sorted(p.name for p in panel_kernel.LIBRARY.sources) == sorted(p.name for p in panel_kernel.KERNELS.iterdir())
    assert "-fno-tree-vectorize" in panel_kernel.LIBRARY.flags and "-fopenmp" in panel_kernel.LIBRARY.flags


def test_engine_keeps_freed_memory_in_the_heap():
    from banditspec.engine import allocator

    assert allocator.keep_freed_memory() is True  # glibc here: the thresholds were accepted
    assert allocator.keep_freed_memory() is True  # once per process, idempotent


# (heads, kv heads): SmolLM2's 9 / 3, and groups that are not whole triples or are 1 / 8 wide
ATTENTION_HEADS = [(9, 3), (4, 2), (8, 8), (6, 1), (8, 1)]


@pytest.mark.parametrize("heads,kv_heads", ATTENTION_HEADS)
def test_attention_values_and_rows_bitwise(library, heads, kv_heads):
    """Close to torch's attention; each query row bitwise the same computed alone, in a
    call of 21 rows (two row blocks), after left padding, and over views of a longer buffer."""
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(heads * 10 + kv_heads)
    cached, fresh, dim = 37, 21, 64  # keys span several key chunks
    q = torch.randn(1, heads, fresh, dim, generator=generator)
    k = torch.randn(1, kv_heads, cached + fresh, dim, generator=generator)
    v = torch.randn(1, kv_heads, cached + fresh, dim, generator=generator)
    hi = (torch.arange(fresh) + cached + 1)[None]
    lo = torch.zeros(1, fresh, dtype=torch.long)
    out = panel_kernel.attention(library, q, k, v, lo, hi, 0.125)
    mask = torch.ones(fresh, cached + fresh, dtype=torch.bool).tril(diagonal=cached)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=0.125,
                                              enable_gqa=True).transpose(1, 2).reshape(1, fresh, heads * dim)
    assert out.shape == (1, fresh, heads * dim)
    assert torch.allclose(out.double(), expected, atol=2e-6)
    for t in range(fresh):
        end = cached + t + 1
        alone = panel_kernel.attention(library, q[:, :, t : t + 1], k[:, :, :end], v[:, :, :end], lo[:, :1], hi[:, t : t + 1], 0.125)
        assert torch.equal(alone[0, 0], out[0, t]), t
    pad = 5
    padded_k = torch.cat([torch.randn(1, kv_heads, pad, dim, generator=generator), k], dim=2)
    padded_v = torch.cat([torch.randn(1, kv_heads, pad, dim, generator=generator), v], dim=2)
    assert torch.equal(panel_kernel.attention(library, q, padded_k, padded_v, lo + pad, hi + pad, 0.125), out)
    buffer_k = torch.randn(1, kv_heads, cached + fresh + 40, dim, generator=generator)
    buffer_v = torch.randn(1, kv_heads, cached + fresh + 40, dim, generator=generator)
    buffer_k[:, :, : cached + fresh], buffer_v[:, :, : cached + fresh] = k, v
    view_k, view_v = buffer_k[:, :, : cached + fresh], buffer_v[:, :, : cached + fresh]
    assert kv_heads == 1 or not view_k.is_contiguous()
    assert torch.equal(panel_kernel.attention(library, q, view_k, view_v, lo, hi, 0.125), out)


@pytest.mark.parametrize("heads,kv_heads", ATTENTION_HEADS)
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_attention_is_each_sequences_own_bitwise(library, heads, kv_heads, threads):
    """Sequences packed side by side, each over its own K/V storage (views of buffers of
    different capacities): every row bitwise what :func:`attention` gives its sequence alone;
    18-21 rows a sequence (two row blocks) and 80 rows in all (past the threaded size)."""
    generator = torch.Generator().manual_seed(heads * 100 + kv_heads)
    dim = 64
    shapes = [(37, 21), (0, 1), (150, 18), (5, 20), (64, 20)]  # (cached, fresh) per sequence
    qs, keys, values, alone = [], [], [], []
    for cached, fresh in shapes:
        q = torch.randn(1, heads, fresh, dim, generator=generator)
        buffer_k = torch.randn(1, kv_heads, cached + fresh + 13, dim, generator=generator)
        buffer_v = torch.randn(1, kv_heads, cached + fresh + 13, dim, generator=generator)
        k, v = buffer_k[:, :, : cached + fresh], buffer_v[:, :, : cached + fresh]
        hi = (torch.arange(fresh) + cached + 1)[None]
        alone.append(panel_kernel.attention(library, q, k, v, torch.zeros_like(hi), hi, 0.125))
        qs.append(q)
        keys.append(k)
        values.append(v)
    first = [0]
    for _, fresh in shapes:
        first.append(first[-1] + fresh)
    assert first[-1] >= 64
    q = torch.cat(qs, dim=2)
    hi = torch.cat([torch.arange(fresh) + cached + 1 for cached, fresh in shapes])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = panel_kernel.attention_packed(library, q, keys, values, torch.tensor(first), torch.zeros_like(hi), hi,
                                            0.125)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (1, first[-1], heads * dim)
    assert torch.equal(out, torch.cat(alone, dim=1))


def test_attention_softmax_underflow_and_one_key(library):
    """A key far below the others gets weight 0 (not NaN); a single key returns its value."""
    q = torch.zeros(1, 3, 1, 8)
    q[..., 0] = 1.0
    k = torch.zeros(1, 3, 2, 8)
    k[:, :, 0, 0] = -1000.0  # score -1000 against 0: e^-1000 underflows
    v = torch.arange(2 * 8, dtype=torch.float32).view(1, 1, 2, 8).expand(1, 3, 2, 8).contiguous()
    lo, hi = torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1), 2)
    out = panel_kernel.attention(library, q, k, v, lo, hi, 1.0).view(3, 8)
    assert torch.equal(out, v[0, :, 1])
    one = panel_kernel.attention(library, q, k, v, lo + 1, hi, 1.0).view(3, 8)
    assert torch.equal(one, v[0, :, 1])


def _avx512(library) -> bool:
    return bool(library.bs_panel_avx512_ok())


def test_isa_switch(library):
    """The GEMM runs on AVX-512 where the CPU has it (the default), AVX2 on request."""
    before = panel_kernel.isa(library)
    assert before == ("avx512" if _avx512(library) else "avx2")
    try:
        assert panel_kernel.set_isa(library, "avx2") == "avx2"
        assert panel_kernel.isa(library) == "avx2"
        assert panel_kernel.set_isa(library, "avx512") == before
        with pytest.raises(ValueError, match="avx2 or avx512"):
            panel_kernel.set_isa(library, "sse")
    finally:
        panel_kernel.set_isa(library, before)


@pytest.mark.parametrize("out_features,in_features", SHAPES + [(49152 // 8, 576)])
def test_avx512_rows_are_bitwise_the_avx2_rows(library, out_features, in_features):
    """Both widths compute each output as one FMA chain over increasing k: the same bits,
    whatever the row count (1-4 rows stream in one pass, more in a first row and fours),
    so prefills on one and verify steps on the other would still agree."""
    if not _avx512(library):
        pytest.skip("this CPU has no AVX-512F")
    generator = torch.Generator().manual_seed(out_features + 3 * in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    linear = PanelLinear(weight, library)
    x = torch.randn(70, in_features, generator=generator)
    threads = torch.get_num_threads()
    try:
        for rows in (1, 2, 3, 4, 5, 6, 8, 9, 13, 17, 33, 70):
            panel_kernel.set_isa(library, "avx2")
            narrow = linear(x[:rows])
            panel_kernel.set_isa(library, "avx512")
            assert torch.equal(linear(x[:rows]), narrow), rows
        torch.set_num_threads(2)  # a prefill's groups shared among threads
        assert torch.equal(linear(x), narrow)
    finally:
        torch.set_num_threads(threads)
        panel_kernel.set_isa(library, "avx512")


def test_isa_environment_variable():
    """BANDITSPEC_PANEL_ISA=avx2 at load keeps the GEMM on AVX2 (a fresh process)."""
    import os
    import subprocess
    import sys

    code = "from banditspec.engine import panel_kernel as p; print(p.isa())"
    env = dict(os.environ, BANDITSPEC_PANEL_ISA="avx2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "avx2"
