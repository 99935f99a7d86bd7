"""The compile pool's size: how many compile processes this machine can take, and why.

The cores this process may run on (its affinity) less one for the measuring worker, and
MemAvailable over a per-compile memory budget (TUNEDB_COMPILE_MEM_MB); TUNEDB_COMPILE_JOBS
overrides (0 turns the pool off). build/compile_pool.py sizes its pool here and re-exports
these names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def affinity_cores() -> int:
    """The cores this process may run on (its CPU affinity; os.cpu_count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in bytes from /proc/meminfo (None where the file or the line is missing)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class PoolSize:
    """How many compile processes, and why (what the report prints)."""

    jobs: int
    cores: int
    mem_available: int | None
    per_compile: int
    reason: str


def pool_size(cores: int | None = None, available: int | None | str = "read",
              per_compile_mb: int | None = None, override: int | None = None) -> PoolSize:
    """Compile processes for this machine: min(cores - 1, MemAvailable // per-compile budget),
    at least 1; `override` (TUNEDB_COMPILE_JOBS when None) wins, 0 meaning no pool."""
    from tunedb import settings

    cores = affinity_cores() if cores is None else cores
    available = mem_available() if available == "read" else available
    per_mb = settings.compile_mem_mb() if per_compile_mb is None else per_compile_mb
    per = per_mb * 2**20
    override = settings.compile_jobs() if override is None else override
    if override is not None:
        return PoolSize(override, cores, available, per, f"TUNEDB_COMPILE_JOBS={override}")
    by_cores = max(1, cores - 1)  # one core stays with the measuring worker
    by_mem = by_cores if available is None else max(1, available // per)
    jobs = min(by_cores, by_mem)
    why = (f"{cores} core(s) less 1 for measuring" if by_cores <= by_mem else
           f"MemAvailable {available / 2**30:.1f} GiB / {per_mb} MiB per compile")
    return PoolSize(jobs, cores, available, per, why)
