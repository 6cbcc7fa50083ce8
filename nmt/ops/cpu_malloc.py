"""glibc malloc settings for training and translating on CPU: keep freed memory for the next step.

A training step on CPU allocates and frees the same large activations (megabytes each) over
and over. glibc serves blocks above its mmap threshold (dynamic, at most 32 MiB) with fresh
`mmap`s, and trims the heap's free top above its trim threshold, so every step maps new pages
and pays a page fault per 4 KiB on first touch, which made some backward operations many
times slower. Raising both thresholds keeps the freed blocks in the heap for reuse: faster
training, the same peak RSS (bench/bench_train.py,
bench/results/2026-11-30_4dbe3b0_sapphire-rapids_glibc-malloc-thresholds.json).

`nmt translate` with nmt's own engine on a CPU does the same: a beam search step allocates its
layers' outputs, attention scores and logit blocks and frees them, and the next step allocates
them again: fewer page faults and a faster command, for a little more peak RSS, with identical
outputs (bench/results/2026-12-04_72c8b52_zen4_translate-malloc.json). `nmt serve`
is left untuned (a server that kept its peak for good was not measured). `--engine ctranslate2`
imports no torch and keeps glibc's defaults too: its peak RSS is what it promises.

PyTorch has no CPU caching allocator; Intel's PyTorch tuning guides preload jemalloc or
tcmalloc for the same reason. These two `mallopt` settings need nothing installed.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Optional

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30
"""Blocks below 1 GiB come from the heap (reused), larger ones are still mapped."""
TRIM_THRESHOLD = (1 << 31) - 1
"""Free memory kept at the heap's top before it is returned (mallopt takes an int)."""

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> Optional[str]:
    """Raise glibc's mmap and trim thresholds for this process; say what was done.

    Returns a line for the run's records, or None where nothing changed: not glibc, or the
    user tuned malloc through its environment variables (theirs win).
    """
    if platform.libc_ver()[0] != "glibc":
        return None
    user = [name for name in USER_SETTINGS if name in os.environ]
    if user:
        return f"malloc as set by {', '.join(user)}"
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError):
        return None
    return "glibc malloc keeps freed blocks below 1 GiB for reuse (mmap and trim thresholds raised)" if ok else None
