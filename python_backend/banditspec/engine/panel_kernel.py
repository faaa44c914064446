"""The engine's C kernels (kernels/: gemm.c, attention.c, int8.c, eagle_step.c): one
library, built once, loaded, and the GEMM wrapped as a linear layer.

:data:`LIBRARY` is compiled with the system C compiler into the cache the first time it is
needed (``banditspec build kernels`` or the set-up does it ahead of time; see
:mod:`banditspec.native`) and loaded with ctypes. A missing compiler, a CPU without AVX2
and FMA, or a failed build make :func:`load` return None with the reason in
:func:`unavailable_reason`; callers fall back to torch's kernels.

Why the GEMM exists and why it is exact: see the header of kernels/gemm.c. In short, the
weight streams from memory once per call whatever the number of rows, and each output
is one FMA chain over k in a fixed order, so a row computed in a 5-row verify step is
bitwise the row a 1-row decode step computes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import torch

from banditspec.native import COMPILE_FLAGS, NativeLibrary

KERNELS = Path(__file__).with_name("kernels")
LIBRARY = NativeLibrary(
    "panel",
    [KERNELS / name for name in ("common.h", "gemm.c", "attention.c", "int8.c", "eagle_step.c")],
    (*COMPILE_FLAGS, "-fopenmp"),
    fallback="torch's kernels",
    disable_env="BANDITSPEC_PANEL_KERNEL",
)
log = logging.getLogger("banditspec.engine")


def build(*, force: bool = False) -> Path:
    """Compile the kernels into the cache (see :meth:`NativeLibrary.build`); returns the
    library's path, raises on failure."""
    return LIBRARY.build(force=force)


def load() -> ctypes.CDLL | None:
    """The loaded kernel library, building it if needed; None when it cannot run here."""
    return LIBRARY.load(_configure)


def _configure(library: ctypes.CDLL) -> str | None:
    if not library.bs_panel_cpu_ok():
        return "this CPU lacks AVX2 or FMA"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    library.bs_panel_gemm.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_int]
    library.bs_panel_gemm.restype = None
    library.bs_panel_stride.argtypes = [i64]
    library.bs_panel_stride.restype = i64
    library.bs_panel_width.restype = ctypes.c_int
    library.bs_panel_set_isa.argtypes = [ctypes.c_int]
    library.bs_panel_set_isa.restype = ctypes.c_int
    library.bs_panel_isa.restype = ctypes.c_int
    library.bs_attention.argtypes = [ptr, i64, i64, i64, ptr, ptr, i64, i64, ptr, ptr, ptr, *[i64] * 5, ctypes.c_float, ctypes.c_int]
    library.bs_attention.restype = None
    library.bs_attention_packed.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, i64,
                                            ctypes.c_float, ctypes.c_int]
    library.bs_attention_packed.restype = None
    library.bs_i8_gemm.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64, ptr, i64]
    library.bs_i8_gemm.restype = None
    library.bs_i8_stride.argtypes = [i64]
    library.bs_i8_stride.restype = i64
    library.bs_i8_max_rows.restype = ctypes.c_int
    library.bs_i8_group_columns.restype = ctypes.c_int
    library.bs_eagle_step.argtypes = [i64] * 6 + [ctypes.c_float] + [ptr] * 11 + [i64, i64, ptr, i64]
    library.bs_eagle_step.restype = ctypes.c_int
    want = os.environ.get("BANDITSPEC_PANEL_ISA", "auto")
    if want not in ("auto", "avx2", "avx512"):
        log.warning("BANDITSPEC_PANEL_ISA=%r is not auto | avx2 | avx512; using auto", want)
        want = "auto"
    # auto: AVX-512 where the CPU has it (bitwise the same outputs as AVX2, see gemm.c)
    library.bs_panel_set_isa(256 if want == "avx2" else 512)
    return None


def isa(library: ctypes.CDLL | None = None) -> str | None:
    """The vector width the panel GEMM runs on ("avx512" | "avx2"), None when the kernel is unavailable."""
    library = library or load()
    return None if library is None else _width(library)


def describe() -> str:
    """What the panel GEMM runs on in this process, for reports: "avx512", "avx2" or
    "unavailable (why)"."""
    return isa() or f"unavailable ({unavailable_reason()})"


def _width(library: ctypes.CDLL) -> str:
    return "avx512" if int(library.bs_panel_isa()) == 512 else "avx2"


def set_isa(library: ctypes.CDLL, name: str) -> str:
    """Switch the process's panel GEMM to "avx512" (where the CPU has it) or "avx2"; returns
    what it runs on now. Both compute bitwise the same outputs; this is for tests and
    benchmarks (the BANDITSPEC_PANEL_ISA environment variable sets it at load)."""
    if name not in ("avx2", "avx512"):
        raise ValueError(f"isa must be avx2 or avx512, got {name!r}")
    library.bs_panel_set_isa(512 if name == "avx512" else 256)
    return _width(library)


def unavailable_reason() -> str | None:
    """Why :func:`load` returned None (None when it loaded or was not tried)."""
    return LIBRARY.unavailable_reason()


def float_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """x [..., width] as contiguous float32 rows [n, width] (what the kernels read)."""
    rows = x.reshape(-1, width)
    if rows.dtype != torch.float32:
        rows = rows.float()
    return rows if rows.is_contiguous() else rows.contiguous()


class PanelLinear:
    """y = x @ W^T for x float32 [..., in], W [out, in], on the panel kernel.

    The weight is copied once into panels of 16 output columns (packed[p][k][j] =
    W[16 p + j][k], zero past ``out``), each panel ``stride`` floats apart.
    """

    def __init__(self, weight: torch.Tensor, library: ctypes.CDLL):
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        self._lib = library
        width = int(library.bs_panel_width())
        panels = -(-self.out_features // width)
        self.stride = int(library.bs_panel_stride(self.in_features))
        packed = torch.zeros(panels, self.stride)
        padded = torch.zeros(panels * width, self.in_features)
        padded[: self.out_features] = weight
        # [panels, width, in] -> [panels, in, width]: panel p holds k-major rows of 16 columns
        packed[:, : self.in_features * width] = padded.view(panels, width, self.in_features).transpose(1, 2).reshape(panels, -1)
        self.packed = packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape, rows = x.shape, float_rows(x, self.in_features)
        out = torch.empty(rows.shape[0], self.out_features)
        if rows.shape[0]:
            self._lib.bs_panel_gemm(
                rows.data_ptr(), rows.shape[0], self.in_features, self.in_features,
                self.packed.data_ptr(), self.stride, self.out_features,
                out.data_ptr(), self.out_features, torch.get_num_threads(),
            )
        return out.view(*shape[:-1], self.out_features)


class PanelInt8Linear:
    """y ~= x @ W^T for x float32 [..., in], W [out, in] quantized per output row to int8
    (symmetric, scale = max |W[n]| / 127), x kept in float32; on the kernel's int8 GEMM
    (``bs_i8_gemm``, kernels/int8.c). For drafting heads only: not the exact kernel.

    The weight is stored once in int8 panels of 16 output columns (packed[p][k][j] =
    Wq[16 p + j][k]), ``out`` padded with zero rows to whole groups of panels.
    """

    def __init__(self, weight: torch.Tensor, library: ctypes.CDLL):
        weight = weight.detach().float()
        self.out_features, self.in_features = weight.shape
        self._lib = library
        width, group = int(library.bs_panel_width()), int(library.bs_i8_group_columns())
        self._max_rows = int(library.bs_i8_max_rows())
        padded_out = -(-self.out_features // group) * group
        self.stride = int(library.bs_i8_stride(self.in_features))
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        quantized = torch.zeros(padded_out, self.in_features, dtype=torch.int8)
        quantized[: self.out_features] = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        panels = padded_out // width
        packed = torch.zeros(panels, self.stride, dtype=torch.int8)
        packed[:, : self.in_features * width] = quantized.view(panels, width, self.in_features).transpose(1, 2).reshape(panels, -1)
        self.packed = packed
        self.scale = torch.zeros(padded_out)
        self.scale[: self.out_features] = scale

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [out, in] this layer multiplies by (for tests)."""
        width = int(self._lib.bs_panel_width())
        panels = self.packed.shape[0]
        q = self.packed[:, : self.in_features * width].view(panels, self.in_features, width).transpose(1, 2)
        return (q.reshape(-1, self.in_features)[: self.out_features].float() * self.scale[: self.out_features, None])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape, rows = x.shape, float_rows(x, self.in_features)
        out = torch.empty(rows.shape[0], self.out_features)
        for start in range(0, rows.shape[0], self._max_rows):  # the kernel takes <= max_rows a call
            chunk = rows[start: start + self._max_rows]
            self._lib.bs_i8_gemm(
                chunk.data_ptr(), chunk.shape[0], self.in_features, self.in_features, self.packed.data_ptr(),
                self.stride, self.scale.data_ptr(), self.out_features, out[start:].data_ptr(), self.out_features,
            )
        return out.view(*shape[:-1], self.out_features)


def attention(
    library: ctypes.CDLL,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Grouped-query attention in a fixed reduction order (see kernels/attention.c).

    q: float32 [B, H, T, D] (any strides, D contiguous); k, v: float32 [B, KVH, L, D] with
    rows of D contiguous floats (views of a longer buffer are fine; k and v strided alike);
    lo, hi: int64 [B, T]: query (b, t) attends to keys lo[b, t] <= j < hi[b, t] <= L.
    Returns float32 [B, T, H * D] (heads concatenated, ready for the output projection).
    """
    batch, heads, fresh, dim = q.shape
    kv_heads = k.shape[1]
    if q.stride(3) != 1:
        q = q.contiguous()
    if k.stride()[2:] != (dim, 1) or v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    lo, hi = lo.contiguous(), hi.contiguous()
    out = torch.empty(batch, fresh, heads * dim)
    library.bs_attention(
        q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), k.data_ptr(), v.data_ptr(),
        k.stride(0), k.stride(1), lo.data_ptr(), hi.data_ptr(), out.data_ptr(),
        batch, heads, kv_heads, fresh, dim, scale, torch.get_num_threads(),
    )
    return out


def attention_packed(
    library: ctypes.CDLL,
    q: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    first: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """:func:`attention` of packed sequences in one call (see kernels/attention.c): each row
    bitwise what :func:`attention` gives it with its own sequence alone.

    q: float32 [1, H, R, D] (D contiguous), the sequences' rows one after another; keys[s],
    values[s]: float32 [1, KVH, L_s, D] (rows of D contiguous floats, each sequence's own
    storage; k and v strided alike); first: int64 [S + 1], sequence s's rows are first[s] ..
    first[s + 1] - 1 (built once a pass, shared by its layers); lo, hi: int64 [R], row t attends to its sequence's keys lo[t] <= j < hi[t].
    Returns float32 [1, R, H * D].
    """
    _, heads, rows, dim = q.shape
    kv_heads = keys[0].shape[1]
    if q.stride(3) != 1:
        q = q.contiguous()
    pairs = []
    for k, v in zip(keys, values):
        if k.stride()[2:] != (dim, 1) or v.stride() != k.stride():
            k, v = k.contiguous(), v.contiguous()
        pairs.append((k, v))
    k_ptrs = torch.tensor([k.data_ptr() for k, _ in pairs], dtype=torch.int64)
    v_ptrs = torch.tensor([v.data_ptr() for _, v in pairs], dtype=torch.int64)
    head_strides = torch.tensor([k.stride(1) for k, _ in pairs], dtype=torch.int64)
    bounds = first.contiguous()
    lo, hi = lo.contiguous(), hi.contiguous()
    out = torch.empty(1, rows, heads * dim)
    library.bs_attention_packed(
        q.data_ptr(), q.stride(1), q.stride(2), k_ptrs.data_ptr(), v_ptrs.data_ptr(), head_strides.data_ptr(),
        bounds.data_ptr(), len(pairs), lo.data_ptr(), hi.data_ptr(), out.data_ptr(), heads, kv_heads, dim, scale,
        torch.get_num_threads(),
    )
    return out
