"""Memory settings of a build process: glibc keeps freed memory; PyTorch asks for huge pages.

* glibc serves allocations above its mmap threshold (at most 32 MB by default) with fresh
  ``mmap`` pages and returns them on free, so every [M, K] logits buffer of a training step
  (~64 MB) is page-faulted and zeroed by the kernel again, several times slower than reusing
  memory. Raising the mmap and trim thresholds keeps freed memory for reuse; the process's
  footprint stays at its peak, which a build can afford (serving does not call this).
* PyTorch asks the kernel for transparent huge pages (``madvise``) under CPU buffers of >= 2 MB
  when ``THP_MEM_ALLOC_ENABLE`` is set, which it reads once, at its first buffer of that
  size. On 4 KB pages a training step slows over a build (TLB misses over a heap that grows
  and scatters); on huge pages it does not, with the same weights. Self-distillation gains nothing.
"""

from __future__ import annotations

import logging
import os

from banditspec.engine.allocator import set_malloc_thresholds

log = logging.getLogger(__name__)

_LIMIT = 2**31 - 1  # the largest int mallopt takes: 2 GiB
HUGE_PAGE = 2 << 20  # PyTorch's huge-page threshold
THP_ENV = "THP_MEM_ALLOC_ENABLE"


def keep_freed_memory() -> bool:
    """Tell glibc malloc to keep freed memory (both thresholds at 2 GiB); False where this
    is not glibc (nothing changes there)."""
    ok = set_malloc_thresholds(_LIMIT, _LIMIT)
    if not ok:
        log.info("malloc thresholds unchanged (mallopt refused)")
    return ok


def use_huge_pages() -> bool:
    """Ask PyTorch for transparent huge pages under its CPU buffers of >= 2 MB (unless the
    environment already says otherwise); True when they are in effect in this process.

    Call it before the process's first tensor of >= 2 MB: PyTorch decides then, once. Child
    processes started later inherit the setting. Where the kernel's THP mode is ``never``
    the advice is ignored and buffers stay on 4 KB pages (no harm)."""
    import torch

    os.environ.setdefault(THP_ENV, "1")
    probe = torch.empty(4 * HUGE_PAGE, dtype=torch.uint8)
    on = _advised_huge(probe.data_ptr() + probe.numel() // 2)
    if not on:
        log.warning("huge pages not in effect (%s=%s, or a large tensor came first): training "
                    "steps are slower (1.42 s against 0.95 s here)", THP_ENV, os.environ.get(THP_ENV))
    return on


def _advised_huge(address: int) -> bool:
    """Whether the mapping holding ``address`` was advised to use huge pages (smaps' VmFlags "hg")."""
    try:
        with open("/proc/self/smaps") as smaps:
            lines = smaps.read().splitlines()
    except OSError:
        return False
    inside = False
    for line in lines:
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:  # a mapping's first line: start-end perms ...
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return "hg" in line.split()[1:]
    return False
