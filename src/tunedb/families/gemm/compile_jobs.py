"""GEMM's compile_jobs hook: the Triton binaries a build will launch, as picklable jobs for the
build's compile pool (build/compile_pool.py).

A job compiles through the kernel's own JIT warmup in a pool process whose Triton driver is a
stand-in reporting the target (prebuild.py's worker side), into the cache directory the measuring
worker reads. Triton keys its cache by source, options, target and tool versions, never by the
device, so the worker's first launch of that config loads the binary instead of compiling it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tunedb.records import SENTINELS, Signature

_ACTIVE: list[tuple[int, str]] = []  # this process's (capability, cache) once the stand-in is set


@dataclass(frozen=True, order=True)
class TargetJob:
    """One prebuild Job compiled for a target capability into a cache directory."""

    job: object  # prebuild.Job (frozen, picklable)
    capability: int
    cache_dir: str

    def run(self) -> dict:
        from tunedb.families.gemm import prebuild

        want = (self.capability, self.cache_dir)
        if _ACTIVE and _ACTIVE != [want]:
            # the JIT's in-memory kernel cache is per device, not per target: a second target in
            # this process would be handed the first one's binary
            return {"job": repr(self.job), "ok": False, "seconds": 0.0,
                    "error": f"this process compiles for {_ACTIVE[0]}, not {want}: one target per process"}
        if not _ACTIVE:
            # before triton is imported here: Triton reads its cache directory from the environment
            os.environ["TRITON_CACHE_DIR"] = self.cache_dir
            prebuild._init_worker(self.capability, self.cache_dir)
            _ACTIVE[:] = [want]
        return prebuild.compile_job(self.job)


def measured_dt(sig: Signature) -> str:
    """The dtype a build measures `sig` in (a dt=half signature is measured in bf16)."""
    return "fp16" if sig.dt == "fp16" else "bf16"


def jobs(arch_family: str, sig: Signature, config_ids, cache_dir: str | None = None) -> list[TargetJob]:
    """The binaries measuring `config_ids` on `sig` loads, compiled for `arch_family`: each
    config's kernels in the measured dtype and the signature's N/K alignment class. Sentinels
    other than 'default' (torch, heuristic) compile nothing."""
    from tunedb import settings
    from tunedb.families.gemm import configs, prebuild

    cap = configs.capability(arch_family)
    cache = str(cache_dir or settings.triton_cache_dir())
    out = []
    for cid in config_ids:
        if cid in SENTINELS:
            cfg = configs.default_config(sig) if cid == "default" else None
        else:
            cfg = configs.parse(cid)
        if cfg is not None and not cfg.is_sentinel:
            out.append(TargetJob(prebuild.job_for(cfg.id, measured_dt(sig), sig), cap, cache))
    return out
