"""Keep freed memory in the process (glibc malloc), for the build's large short-lived tensors.

glibc serves allocations above its mmap threshold (at most 32 MB by default) with fresh
``mmap`` pages and returns them on free, so every [M, K] logits buffer of a training step
(~64 MB) is page-faulted and zeroed by the kernel again: on this VM a 64 MB copy took 16 ms
that way and 5 ms from reused memory, and a training step spent ~40 % of its time in the
kernel. Raising the mmap and trim thresholds keeps freed memory for reuse; the process's
footprint stays at its peak, which a build can afford (serving does not call this).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_LIMIT = 2**31 - 1  # the largest int mallopt takes: 2 GiB


def keep_freed_memory() -> bool:
    """Tell glibc malloc to keep freed memory (both thresholds at 2 GiB); False where this
    is not glibc (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _LIMIT)) and bool(mallopt(_M_TRIM_THRESHOLD, _LIMIT))
    if not ok:
        log.info("malloc thresholds unchanged (mallopt refused)")
    return ok
