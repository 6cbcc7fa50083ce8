"""CPU training keeps freed activations for reuse instead of page-faulting fresh memory."""

from __future__ import annotations

import platform
import resource

import pytest
import torch

from nmt.ops.cpu_malloc import keep_freed_memory


def test_the_users_own_malloc_settings_win(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_memory() == "malloc as set by MALLOC_TRIM_THRESHOLD_"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_large_block_freed_and_allocated_again_is_not_faulted_in_anew(monkeypatch):
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert keep_freed_memory().startswith("glibc malloc keeps freed blocks")
    pages = 64 * 2**20 // resource.getpagesize()  # 64 MiB: above glibc's largest automatic mmap threshold
    faults = []
    for _ in range(30):  # written, then freed; untuned, each one is mapped and faulted in anew
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(64 * 2**20 // 4)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    # The heap settles within the first few blocks (9 at most in 8 runs), then reuses one.
    assert sum(faults[15:]) < pages, f"page faults per 64 MiB block: {faults} ({pages} pages each)"
