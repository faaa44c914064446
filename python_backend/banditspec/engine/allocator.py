"""Keep freed memory in the process heap (glibc): the engine's per-step buffers are reused
instead of being mapped and page-faulted anew on every decoding step.

Each step allocates per layer a new K/V tensor of the whole sequence (~230 KB per layer
at 300 cached tokens for SmolLM2) and frees the previous one. glibc serves blocks above
its mmap threshold (128 KB at start, adjusted on the fly) with fresh mappings, so every
step page-faults ~14 MB, a noticeable share of a decoding step.
Raising the mmap threshold and the trim threshold keeps such blocks in the heap.

Process-wide and once: the heap keeps up to TRIM_THRESHOLD of free memory instead of
returning it to the system at once (RSS stays near its peak; the engine's own memory is
bounded by the prefix cache's budget). Anything but glibc: a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20  # blocks above this still get their own mapping (weights, big batches)
TRIM_THRESHOLD = 256 << 20

_lock = threading.Lock()
_applied: bool | None = None


def set_malloc_thresholds(mmap_threshold: int, trim_threshold: int) -> bool:
    """glibc ``mallopt``: blocks above ``mmap_threshold`` get their own mapping; the heap keeps
    up to ``trim_threshold`` of free memory. True when glibc accepted both (False elsewhere)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def keep_freed_memory() -> bool:
    """Apply the engine's thresholds once per process; True when glibc accepted them."""
    global _applied
    with _lock:
        if _applied is None:
            _applied = set_malloc_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD)
        return _applied
