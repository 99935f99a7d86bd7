"""Compiling many small linear-algebra kernels at once, in worker processes (the disk cache).

Triton compiles a kernel on its first launch; a few hundred (op, config, n, dtype) kernels
compile serially in minutes, so tests and the bench first launch each once in a pool of
spawned processes (each on the GPU, none timed). The kernels land in Triton's on-disk cache,
which the calling process then loads in milliseconds. The kernels do not specialise on the
batch (do_not_specialize), so one launch per kernel covers every batch.
"""
from __future__ import annotations

import os
from typing import Iterable


def _compile_one(item: tuple[str, str, int, str]) -> str | None:
    op, cid, n, dtype = item
    try:
        import torch

        from tunedb.families.linalg import kernels_check as check
        from tunedb.families.linalg.launch import launch

        launch(op, cid, *check.make_inputs(op, 3, n, dtype, device="cuda"))
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # reported to the caller, which decides
        return f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"


def compile_all(items: Iterable[tuple[str, str, int, str]], jobs: int | None = None) -> list[str]:
    """Compile every (op, config id, n, dtype) kernel; returns the failures as lines."""
    import concurrent.futures as cf
    import multiprocessing as mp

    # the dependency tiers compile in the process that launches them (numba-cuda and NVRTC keep
    # their kernels in memory): NVRTC's here, in threads, where a GPU and NVRTC are present;
    # numba-cuda's on first launch
    items = list(items)
    jobs = jobs or max(1, min(16, (os.cpu_count() or 2) - 1))
    failed: list[str] = []
    nvrtc = [(op, cid, n, dt) for op, cid, n, dt in items if cid.startswith("cuda")]
    if nvrtc:
        from tunedb.families.linalg import kernels_cuda

        if kernels_cuda.available():
            failed = kernels_cuda.compile_all(nvrtc, jobs)
    todo = sorted(set((op, cid, n, dt) for op, cid, n, dt in items if not cid.startswith(("torch", "nvmath", "cuda"))))
    if not todo:
        return failed
    if jobs == 1:
        return failed + [e for e in map(_compile_one, todo) if e]
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        return failed + [e for e in pool.map(_compile_one, todo, chunksize=4) if e]
