"""Prepared launches of the Triton arms for eager calls: the config parsed and judged valid once
per (op, config, n, batch, dtype), so that an eager call of a key already served skips the
general path's layers (family.launch, launch.launch's shape checks, the config id's parse and
validity, `_out`'s checks) and calls launch._triton itself, the code the general path ends in:
the same kernel, arguments and result bit for bit.

Session 29 (bench/linalg_eager.py, H200 host): a Triton posv took 55-65 us of host time an
eager call through the general path, about half of it in those layers and half in launch._triton
and Triton's own launcher (its argument specialisation and cache lookup), which this leaves as
they are. (Call 7 measured 25-27 us with a variant that also resolved launch._triton's kernel
and meta once; that variant changed launch.py, one of the sources the shipped table's impl_hash
covers, so the shipped tree keeps launch.py as measured and pays launch._triton's per-call
resolution, a few microseconds more, not measured.)

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

    get_device = torch._C._cuda_getDevice
    new_out, run = launch._out, launch._triton

    def call(tensors: tuple) -> Any:
        a = tensors[0]
        for t in tensors:
            if not t.is_contiguous():
                return None
        if a.get_device() != get_device():
            return None
        return run(op, cfg, tensors, new_out(op, tensors, n, batch, None), n, batch, False)

    return call
