"""Compiling the `gv` GEMV binaries (kernels_gemv.py) before their first launch, in parallel: the
GEMM prebuild's worker processes (prebuild.py: a stand-in driver reporting the target, the JIT's
own warmup path, so each binary lands in Triton's cache under exactly the key a launch computes).
A bench or test that would otherwise compile tens of binaries one by one on first call runs
`compile_all(jobs(...))` first. Needs triton only (no torch).
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from dataclasses import asdict, dataclass
from typing import Iterable

from tunedb.families.gemm import configs, configs_gemv, prebuild


@dataclass(frozen=True, order=True)
class GemvJob:
    """One binary: a config at one MP (the kernel's padded rows), dtype and N/K divisibility class."""

    config_id: str
    mp: int
    dt: str = "bf16"
    n_aligned: bool = True
    k_aligned: bool = True


def jobs(config_ids: Iterable[str], shapes: Iterable[tuple[int, int]], ms: Iterable[int],
         dt: str = "bf16") -> list[GemvJob]:
    """The binaries `config_ids` launch over (N, K) in `shapes` at M in `ms` (where the rules
    admit them), each once."""
    out = set()
    ms = tuple(ms)
    for cid in config_ids:
        cfg = configs_gemv.parse_gemv(cid)
        for n, k in shapes:
            for m in ms:
                if configs_gemv.gemv_reason(cfg, n, k, m, dt) is None:
                    out.add(GemvJob(cid, configs_gemv.rows_padded(m, bool(cfg.param("dot"))), dt, n % 16 == 0,
                                    k % 16 == 0))
    return sorted(out)


def warm(cfg, mp: int, dt: str, n_aligned: bool = True, k_aligned: bool = True) -> None:
    """Compile the binary `cfg` launches at MP = mp in dtype dt (bf16/fp16) for an N and K of
    that 16-divisibility, through the JIT's own warmup (the stand-in driver names the target).
    The GEMM prebuild (prebuild.compile_job) calls this for each MP of a `gv` config."""
    from tunedb.families.gemm.kernels_gemv import spec

    sp = spec(cfg)
    ptrs = [prebuild._Pointer(p) for p in (dt, dt, dt, dt, "f32", "i32")]
    # values matter only through Triton's specialisation (16-divisible or not); M never is
    ints = [16, 4096 if n_aligned else 4104, 4096 if k_aligned else 4104, 0, 0]
    sp.kernel.warmup(*ptrs, *ints, grid=(1,), **sp.kwargs(mp))


def compile_job(job: GemvJob) -> dict:
    """Compile one job (in a worker whose driver reports the target); a failure is reported."""
    start = time.perf_counter()
    try:
        warm(configs_gemv.parse_gemv(job.config_id), job.mp, job.dt, job.n_aligned, job.k_aligned)
    except Exception as exc:  # noqa: BLE001 - one config failing to compile is reported, not fatal
        return {"job": asdict(job), "ok": False, "seconds": time.perf_counter() - start,
                "error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
    return {"job": asdict(job), "ok": True, "seconds": time.perf_counter() - start, "error": ""}


def compile_all(todo: list[GemvJob], arch_family: str = "sm90", n_jobs: int = 16) -> dict:
    """Compile `todo` with n_jobs spawned workers into tunedb's Triton cache; a summary with the
    failed jobs (whose configs a caller leaves out)."""
    cache = prebuild.point_triton_cache()
    cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")  # the parent may hold CUDA; workers start clean
    with cf.ProcessPoolExecutor(max_workers=max(1, min(n_jobs, len(todo))), mp_context=ctx,
                                initializer=prebuild._init_worker,
                                initargs=(configs.capability(arch_family), str(cache))) as pool:
        results = list(pool.map(compile_job, todo))
    return {"jobs": len(todo), "ok": sum(r["ok"] for r in results), "failed": [r for r in results if not r["ok"]],
            "seconds": round(time.perf_counter() - start, 2)}
