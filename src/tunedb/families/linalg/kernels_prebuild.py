"""Compiling many small linear-algebra kernels at once, in worker processes (the disk cache).

Triton compiles a kernel on its first launch; a few hundred (op, config, n, dtype) kernels
compile serially in minutes, so tests and the bench first launch each once in a pool of
spawned processes (each on the GPU, none timed). The kernels land in Triton's on-disk cache,
which the calling process then loads in milliseconds. Triton specialises an integer argument
on being 1 or a multiple of 16, so each kernel is launched at one batch of each class the
caller will use (`batches`).
"""
from __future__ import annotations

import os
from typing import Iterable


def specialisations(batches: Iterable[int]) -> tuple[int, ...]:
    """One batch per class Triton compiles separately: 1, multiples of 16, the rest."""
    return tuple(sorted({1 if b == 1 else 16 if b % 16 == 0 else 17 for b in batches if b > 0}))


def _compile_one(item: tuple[str, str, int, str, tuple[int, ...]]) -> str | None:
    op, cid, n, dtype, batches = item
    try:
        import torch

        from tunedb.families.linalg import kernels_check as check
        from tunedb.families.linalg.launch import launch

        for batch in batches:
            launch(op, cid, *check.make_inputs(op, batch, n, dtype, device="cuda"))
        torch.cuda.synchronize()
        return None
    except Exception as exc:  # reported to the caller, which decides
        return f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"


def compile_all(items: Iterable[tuple[str, str, int, str]], jobs: int | None = None,
                batches: Iterable[int] = (1, 17, 16)) -> list[str]:
    """Compile every (op, config id, n, dtype) kernel for the batch sizes' specialisations;
    returns the failures as lines."""
    import concurrent.futures as cf
    import multiprocessing as mp

    spec = specialisations(batches)
    todo = sorted(set((op, cid, n, dt, spec) for op, cid, n, dt in items if not cid.startswith("torch")))
    if not todo:
        return []
    jobs = jobs or max(1, min(16, (os.cpu_count() or 2) - 1))
    if jobs == 1:
        return [e for e in map(_compile_one, todo) if e]
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        return [e for e in pool.map(_compile_one, todo, chunksize=4) if e]
