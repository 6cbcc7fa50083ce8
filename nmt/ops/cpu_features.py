"""What this CPU is, from /proc/cpuinfo: the facts the ops (and `nmt.device`) choose kernels by."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=None)
def cpuinfo_field(name: str) -> str:
    """The first CPU's `name` line of /proc/cpuinfo (flags, vendor_id, ...), '' where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (avx512_bf16, amx_bf16, ...); empty where /proc/cpuinfo has none."""
    return frozenset(cpuinfo_field("flags").split())
