"""Prepared launches of the CUDA C++ tier for eager calls: the kernel, its geometry and a ctypes
argument block bound once per (op, config, n, batch, dtype, device), so that an eager call of a
key already served costs two allocations, a few pointer writes and one driver call.

Why: the general path (family.launch -> launch.launch -> kernels_cuda.launch) re-checks shapes,
re-parses the config id, re-validates the arm and builds a fresh ctypes argument array through
torch's `_CudaKernel.__call__` on every call: 55-75 us of host time an eager call on the H200's
host (bench/linalg_eager.py, session 29), against 31-33 us for torch.linalg.cholesky_ex or
solve_triangular. The kernels themselves take 1-10 us at batch <= 4096, so eager loops ran at
the host's pace and tunedb was 0.43-0.61x of torch there, while 10x faster in CUDA graphs.

`prepare(...)` returns `call(tensors) -> result | None`; None means "not this fast path" (a
non-contiguous input, another device current or given, an alias of out and an input cannot
arise: out is always fresh) and the caller runs the general path. Only ops.run calls it, after
the key's first call succeeded through launch_table.first_call, so a config that fails to
compile never gets here. The driver copies kernel parameters at launch (and into a graph node
during capture), so the argument block is reused; a lock keeps two threads from interleaving
their writes to it.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from tunedb.families.linalg import kernels_cuda, launch


def prepare(op: str, cid: str, n: int, batch: int, dtype: str, device: int) -> Callable[[tuple], Any] | None:
    """The prepared eager launch of CUDA-tier arm `cid` for (op, n, batch, dtype) on `device`,
    or None where the tier cannot serve it this way (an arm the predicate refuses, no NVRTC,
    batch 0 or past the grid limit)."""
    if batch <= 0 or batch >= 2 ** 31:
        return None
    if kernels_cuda.arm_invalid(op, cid, n, dtype) is not None:
        return None
    import torch

    kern = kernels_cuda._kernel(op, cid, n, dtype, device)
    grid, threads = kernels_cuda.geometry(op, cid, n, batch)
    dynamic = kernels_cuda.arm_smem(op, cid, n, dtype) if kernels_cuda.id_kind(cid)[0] == "blocked" else 0
    if dynamic:
        kernels_cuda._allow_smem(kern, dynamic)
    from torch.cuda._utils import _get_gpu_runtime_library

    launch_kernel = _get_gpu_runtime_library().cuLaunchKernel
    dev = torch.device("cuda", device)
    ptrs = [ctypes.c_void_p() for _ in range(4)]
    count = ctypes.c_int(batch)
    block = (ctypes.c_void_p * 5)(*(ctypes.addressof(p) for p in ptrs), ctypes.addressof(count))
    func = kern.func
    lock = threading.Lock()
    get_device = torch._C._cuda_getDevice
    raw_stream = torch._C._cuda_getCurrentRawStream
    empty, int32, new_out = torch.empty, torch.int32, launch._out
    with_info = op != "trsv"

    def call(tensors: tuple) -> Any:
        a = tensors[0]
        b = tensors[1] if len(tensors) > 1 else a  # potrf's kernel never reads B
        # the general path makes these contiguous (a copy) and reads trsv's column-major L as
        # given; the key fixes shape and dtype, not strides or device
        if not (a.is_contiguous() and b.is_contiguous()) or a.get_device() != device \
                or b.get_device() != device or get_device() != device:
            return None
        out = new_out(op, tensors, n, batch, None)  # the general path's result tensor
        info = empty((batch,), dtype=int32, device=dev) if with_info else out
        with lock:
            ptrs[0].value, ptrs[1].value = a.data_ptr(), b.data_ptr()
            ptrs[2].value, ptrs[3].value = out.data_ptr(), info.data_ptr()
            err = launch_kernel(func, grid, 1, 1, threads, 1, 1, dynamic,
                                ctypes.c_void_p(raw_stream(device)), block, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUresult {err} for linalg {op} {cid} "
                               f"n={n} {dtype} batch={batch}")
        return (out, info) if with_info else out

    call.args = (ptrs, count, block)  # type: ignore[attr-defined]  # block holds raw addresses: their storage lives with call
    return call
