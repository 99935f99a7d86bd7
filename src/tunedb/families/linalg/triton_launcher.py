"""Prepared launches of the Triton arms for eager calls: the jit function, its grid and launch
meta resolved once per (op, config, n, batch, dtype), so that an eager call of a key already
served skips the general path's re-checks (launch._check, the config id's parse and validity)
and goes straight to Triton's launcher with the same arguments (launch.triton_run: the code the
general path runs, so the results are the same bit for bit).

Session 29 (bench/linalg_eager.py, H200 host): a Triton posv took 83-89 us of host time an
eager call, about half of it in that general path, half in Triton's own launcher (its argument
specialisation and cache lookup), which this leaves as it is.

`prepare(...)` returns `call(tensors) -> result | None`; None (a strided input, a tensor on
another device than the current one: Triton launches on the current device) sends the call the
general way.
"""
from __future__ import annotations

from typing import Any, Callable

from tunedb.families.linalg import kernels_space as space
from tunedb.families.linalg import launch


def prepare(op: str, cid: str, n: int, batch: int, dtype: str) -> Callable[[tuple], Any] | None:
    """The prepared eager launch of Triton arm `cid`, or None where it is not a valid Triton
    config for the cell (the general path then serves)."""
    if batch <= 0:
        return None
    try:
        cfg = space.parse_config(cid)
    except ValueError:
        return None
    if space.invalid_reason(op, cfg.packing, cfg.problems, cfg.warps, n, dtype):
        return None
    import torch

    kern, grid, meta = launch.triton_kernel(op, cfg, n, batch, dtype == "fp64")
    go = kern[grid]
    out_shape = (batch,) if op == "dot" else (batch, n) if op in ("gemv", "trsv", "posv") else (batch, n, n)
    with_info = op in ("potrf", "posv")
    get_device = torch._C._cuda_getDevice
    empty, int32, packing, run = torch.empty, torch.int32, cfg.packing, launch.triton_run

    def call(tensors: tuple) -> Any:
        a = tensors[0]
        for t in tensors:
            if not t.is_contiguous():
                return None
        device = a.get_device()
        if device != get_device():
            return None
        out = empty(out_shape, dtype=a.dtype, device=a.device)
        info = empty((batch,), dtype=int32, device=a.device) if with_info else None
        return run(op, packing, go, meta, tensors, out, info, batch, False)

    return call
