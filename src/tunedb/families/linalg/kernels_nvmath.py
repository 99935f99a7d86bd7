"""The optional dependency tier of the small linear-algebra family (spec 003): potrf and posv
through cuSOLVERDx, nvmath-python's device API, in a numba-cuda kernel.

An arm `nvmath_b{B}` runs B problems a CUDA block (B = 1 today: the library writes info for
every problem of a block, so a block past the batch's end would write past info). A block loads
its problems' A (and b) from the caller's row-major [batch, n, n] / [batch, n] tensors into shared memory, calls the
library's Cholesky factorization (lower fill, A row-major, b column-major) and, for posv, its
solve, then stores L (zeros above the diagonal) or x, and info (0, or the 1-based order of the
first leading minor that is not positive definite, as torch.linalg.cholesky_ex reports; a NaN
pivot, which the library's test lets through, is found on L's diagonal afterwards). The
block size is the library's suggestion for (n, B, precision). A block reads all its problems
before it writes any, and blocks own disjoint problems, so out may alias A (potrf) or b (posv).

It is a dependency arm (configs.dependency): the pick rule lets it take a cell only when it
beats the best native arm by the dependency margin, and each table entry keeps the native
partition too. It exists only where nvmath-python, numba-cuda and their CUDA libraries import
(`available()` looks without importing; on the device machine bench/nvmath_install.sh installs
them from carried wheels). Measured on the H200 (session 19, bench/nvmath_probe.py): 1.5-5x
slower than the Triton arms at n <= 32, ahead of every native arm for posv at n = 64.

Kernels compile on their first launch (numba-cuda + NVRTC + LTO: 3-17 s each, in-process; the
Triton pool prebuild skips them), keyed by (op, dtype, n, B, device). A kernel whose shared
memory passes the static 48 KiB opts in to dynamic shared memory up to SMEM_LIMIT. The launch
goes to torch's current stream, so it captures into torch's CUDA graphs; the first launch
(the compile) belongs outside a capture, as a Triton kernel's does.

numpy 2.4 removed np.row_stack, which numba-cuda 0.30 still overloads when it is imported: the
import here puts np.vstack under that name when numpy lacks it (numba-cuda's own fix is in
later releases), and touches nothing when numpy has it.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any

PREFIX = "nvmath"
OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
BATCHES_PER_BLOCK = (1,)  # the space: one problem a block (the library's suggestion from n = 16 up)
SMEM_LIMIT = 227 * 1024  # sm90's dynamic shared memory per block
STATIC_SMEM = 48 * 1024
_ID = re.compile(r"^nvmath_b([0-9]+)$")
_ITEM = {"fp32": 4, "fp64": 8}
_KERNELS: dict[tuple, tuple] = {}


def available() -> bool:
    """nvmath-python and numba-cuda are installed (found, not imported)."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("nvmath", "numba", "numba.cuda"))
    except (ImportError, ValueError):
        return False


def config_id(bpb: int) -> str:
    return f"{PREFIX}_b{bpb}"


def parse_bpb(config_id_: str) -> int | None:
    """B of `nvmath_b{B}`, or None for any other id."""
    match = _ID.match(config_id_)
    return int(match.group(1)) if match else None


def smem_bytes(n: int, dtype: str, bpb: int) -> int:
    return bpb * (n * n + n) * _ITEM.get(dtype, 8)


def invalid_reason(op: str, bpb: int, n: int, dtype: str) -> str | None:
    """Why `nvmath_b{bpb}` cannot run op at (n, dtype) here, or None."""
    if op not in OPS:
        return f"{config_id(bpb)} runs {', '.join(OPS)} only, not {op}"
    if dtype not in DTYPES:
        return f"{config_id(bpb)} runs {', '.join(DTYPES)} only, not {dtype}"
    if bpb != 1:  # the library writes info for every problem of a block: a padded block would overrun
        return f"{config_id(bpb)}: one problem a block only (nvmath_b1)"
    need = smem_bytes(n, dtype, bpb)
    if need > SMEM_LIMIT:
        return f"{config_id(bpb)} at n={n} {dtype} needs {need} B of shared memory a block (at most {SMEM_LIMIT})"
    if not available():
        return f"{config_id(bpb)} needs nvmath-python with numba-cuda, which is not importable"
    return None


def config_ids(op: str, n: int, dtype: str) -> tuple[str, ...]:
    """The tier's arms for a cell: the valid ones of BATCHES_PER_BLOCK (none without nvmath)."""
    return tuple(config_id(b) for b in BATCHES_PER_BLOCK if invalid_reason(op, b, n, dtype) is None)


def _numba_cuda() -> Any:
    """numba.cuda, imported after the row_stack shim (see the module docstring)."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from numba import cuda

    return cuda


def _build(op: str, dtype: str, n: int, bpb: int) -> tuple[Any, Any, int]:
    """(numba kernel, solver, dynamic shared memory bytes or 0) for one (op, dtype, n, B)."""
    import numpy as np

    cuda = _numba_cuda()
    from nvmath.device import CholeskySolver as solver_cls

    prec = {"fp32": np.float32, "fp64": np.float64}[dtype]
    s = solver_cls(size=(n,), precision=prec, execution="Block", fill_mode="lower",
                   arrangement=("row_major", "col_major"), batches_per_block=bpb, block_dim="suggested")
    na, nb = s.a_size(), s.b_size()
    dyn = smem_bytes(n, dtype, bpb) > STATIC_SMEM
    per = s.batches_per_block
    sa0, sa1, sa2 = s.a_strides()
    sb0, sb1, _ = s.b_strides()
    nn = n * n
    vt = s.value_type

    if op == "potrf":
        @cuda.jit
        def kernel(A, L, INFO, batch):
            if dyn:
                smem_a = cuda.shared.array(0, dtype=vt)[:na]
            else:
                smem_a = cuda.shared.array(na, dtype=vt)
            base = cuda.blockIdx.x * per
            nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
            tid = cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.z * cuda.blockDim.x * cuda.blockDim.y
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                v = 1.0 if r == c else 0.0  # past the batch: the identity, never stored
                if base + p < batch and c <= r:  # the lower triangle only: the op's contract
                    v = A[base + p, r, c]
                smem_a[p * sa0 + r * sa1 + c * sa2] = v
            cuda.syncthreads()
            s.factorize(smem_a, INFO[base:])
            cuda.syncthreads()
            if tid == 0 and base < batch and INFO[base] == 0:
                for j in range(n):  # a NaN pivot: the library's test (d <= 0) lets it through
                    d = smem_a[j * sa1 + j * sa2]
                    if d != d:
                        INFO[base] = j + 1
                        break
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                if base + p < batch:
                    L[base + p, r, c] = smem_a[p * sa0 + r * sa1 + c * sa2] if c <= r else 0.0
    else:
        @cuda.jit
        def kernel(A, B, X, INFO, batch):
            if dyn:
                smem = cuda.shared.array(0, dtype=vt)
                smem_a = smem[:na]
                smem_b = smem[na:na + nb]
            else:
                smem_a = cuda.shared.array(na, dtype=vt)
                smem_b = cuda.shared.array(nb, dtype=vt)
            base = cuda.blockIdx.x * per
            nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
            tid = cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.z * cuda.blockDim.x * cuda.blockDim.y
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                v = 1.0 if r == c else 0.0  # past the batch: the identity, never stored
                if base + p < batch and c <= r:  # the lower triangle only: the op's contract
                    v = A[base + p, r, c]
                smem_a[p * sa0 + r * sa1 + c * sa2] = v
            for idx in range(tid, per * n, nt):
                p = idx // n
                r = idx % n
                v = 0.0
                if base + p < batch:
                    v = B[base + p, r]
                smem_b[p * sb0 + r * sb1] = v
            cuda.syncthreads()
            s.factorize(smem_a, INFO[base:])
            cuda.syncthreads()
            if tid == 0 and base < batch and INFO[base] == 0:
                for j in range(n):  # a NaN pivot: the library's test (d <= 0) lets it through
                    d = smem_a[j * sa1 + j * sa2]
                    if d != d:
                        INFO[base] = j + 1
                        break
            s.solve(smem_a, smem_b)
            cuda.syncthreads()
            for idx in range(tid, per * n, nt):
                p = idx // n
                r = idx % n
                if base + p < batch:
                    X[base + p, r] = smem_b[p * sb0 + r * sb1]
    return kernel, s, ((na + nb) * np.dtype(prec).itemsize if dyn else 0)


def _opt_in(kernel: Any, args: list, nbytes: int, device: int) -> None:
    """Let the compiled kernel use `nbytes` of dynamic shared memory (past the 48 KiB default).
    numba-cuda >= 0.2x loads kernels through cuLibrary (a CUkernel handle: cuKernelSetAttribute);
    older ones hold a CUfunction (cuFuncSetAttribute)."""
    from cuda.bindings import driver

    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    library = getattr(compiled, "_codelibrary", None) or compiled.library
    handle = library.get_cufunc().handle
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if type(handle).__name__ == "CUkernel":
        res = driver.cuKernelSetAttribute(attr, nbytes, handle, driver.CUdevice(device))
    else:
        res = driver.cuFuncSetAttribute(handle, attr, nbytes)
    if res[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot give the nvmath kernel {nbytes} B of dynamic shared memory: {res[0]}")


def launch(op: str, bpb: int, tensors: tuple, out: Any, n: int, batch: int, dtype: str) -> tuple[Any, Any]:
    """Run `nvmath_b{bpb}` on contiguous CUDA tensors (launch.py checked shapes and made `out`);
    returns (L or x, info)."""
    import torch

    why = invalid_reason(op, bpb, n, dtype)
    if why:
        raise ValueError(why)
    cuda = _numba_cuda()

    a = tensors[0]
    if not a.is_cuda:
        raise ValueError(f"{config_id(bpb)} runs on CUDA tensors only, got {a.device}")
    info = torch.empty((batch,), dtype=torch.int32, device=a.device)
    if batch == 0:
        return out, info
    args_t = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    key = (op, dtype, n, bpb, device)
    entry = _KERNELS.get(key)
    if entry is None:
        kernel, solver, dyn = _build(op, dtype, n, bpb)
        entry = _KERNELS[key] = [kernel, solver, dyn, False]
    kernel, solver, dyn, opted = entry
    args = [cuda.as_cuda_array(t) for t in args_t] + [cuda.as_cuda_array(out), cuda.as_cuda_array(info), batch]
    if dyn and not opted:
        _opt_in(kernel, args, dyn, device)
        entry[3] = True
    stream = cuda.external_stream(torch.cuda.current_stream(a.device).cuda_stream)
    grid = -(-batch // solver.batches_per_block)
    kernel[grid, solver.block_dim, stream, dyn](*args)
    return out, info
