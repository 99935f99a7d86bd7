"""Launching the fused solvers (kernels_direct, kernels_pcg) on a strip as stored.

What they cover: n <= MAX_N (every block an NP x NP register tile), fp32 and fp64, any strides
(the strip, b and x0 are read in place through their strides: no copy, no reformat). The direct
solver is one launch; PCG is two (the preconditioner's block inverses, then the whole iteration
loop), whatever T and the iteration cap, so both capture into a CUDA graph with nothing on the
host inside. Workspaces are new tensors per call (a graph keeps them in its pool).
"""
from __future__ import annotations

from typing import Any

MAX_N = 32


def covers(strip: Any) -> bool:
    """The fused kernels take this strip (its n and dtype; the device is the caller's rule)."""
    import torch

    return strip.shape[-2] <= MAX_N and strip.dtype in (torch.float32, torch.float64)


# kernels="auto" takes the fused direct solver where the H200 run (bench/results/s10_A,
# cutoff_solvers) measured it ahead of the torch.linalg composition: n <= 16 at any batch
# (1.07-16.9x), 16 < n <= 32 only up to AUTO_DIRECT_BATCH systems (n=32: 1.14-1.54x at batch
# 256, 0.45-0.63x at batch 4096: one program per system then leaves its 32 x 32 tiles spilling
# into too few SMs' worth of registers). Fused PCG was 2.5x or more everywhere up to n = 32.
AUTO_DIRECT_N = 16
AUTO_DIRECT_BATCH = 1024


def auto_direct(strip: Any) -> bool:
    """kernels="auto" takes the fused direct solver for this strip (covered and measured faster)."""
    n, batch = strip.shape[-2], strip.shape[0]
    return covers(strip) and (n <= AUTO_DIRECT_N or batch <= AUTO_DIRECT_BATCH)


def _np(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())


def direct_warps(np_: int) -> int:
    """One warp up to 8 x 8 tiles (the reductions along n stay in shuffles), then as many as
    keep the three live n x n tiles in registers without spilling (ptxas -v, sm_90: fp64 at
    32 x 32 spills on 2 warps, not on 4)."""
    return {2: 1, 4: 1, 8: 1, 16: 2}.get(np_, 4)


def pcg_chunk(np_: int, steps: int) -> int:
    """Block rows per pass chunk: about 1024 tile elements (at 4 warps the passes then fit in
    about 128 registers, so 4 programs share an SM), never past T rounded up."""
    tb = max(1, 1024 // (np_ * np_))
    return min(tb, max(1, 1 << (steps - 1).bit_length()))


def direct(strip: Any, b: Any) -> tuple[Any, Any]:
    """(x, ok) of every system by the one-kernel block Cholesky."""
    import torch

    from tunedb.cutoff import kernels_direct

    batch, steps, n, _ = strip.shape
    np_ = _np(n)
    x = b.new_empty(batch, steps, n)
    info = torch.empty(batch, dtype=torch.int32, device=strip.device)
    if batch == 0:
        return x, info == 0
    cw = strip.new_empty(batch, steps, np_, np_)
    ww = strip.new_empty(batch, steps, np_, np_)
    yw = strip.new_empty(batch, steps, np_)
    kernels_direct.btd_direct[(batch,)](strip, *strip.stride(), b, *b.stride(), x, cw, ww, yw, info, steps,
                                        N=n, NP=np_, num_warps=direct_warps(np_))
    return x, info == 0


def pcg(strip: Any, b: Any, x0: Any, *, tol: float, max_iter: int, chunk: int | None = None) -> tuple[Any, Any, Any]:
    """(x, converged, iterations) of every system by the fused block-Jacobi PCG (chunk: block
    rows per pass chunk, a power of two; default pcg_chunk's)."""
    import torch

    from tunedb.cutoff import kernels_pcg

    batch, steps, n, _ = strip.shape
    np_ = _np(n)
    x = b.new_empty(batch, steps, n)
    conv = torch.empty(batch, dtype=torch.int8, device=strip.device)
    iters = torch.empty(batch, dtype=torch.int32, device=strip.device)
    if batch == 0:
        return x, conv.bool(), iters
    blocks = batch * steps
    tb_inv = max(1, 1024 // (np_ * np_))
    minv = strip.new_empty(batch, steps, np_, np_)
    kernels_pcg.block_inverse[(triton_cdiv(blocks, tb_inv),)](strip, *strip.stride(), minv, blocks, steps,
                                                              N=n, NP=np_, TB=tb_inv, num_warps=4)
    work = [b.new_empty(batch, steps, n) for _ in range(4)]  # r, p, z, ap
    x0_ = b if x0 is None else x0
    tb = chunk or pcg_chunk(np_, steps)
    kernels_pcg.pcg[(batch,)](strip, *strip.stride(), b, *b.stride(), x0_, *x0_.stride(), minv, x, *work,
                              conv, iters, steps, max_iter, tol, HAS_X0=x0 is not None, N=n, NP=np_, TB=tb,
                              num_warps=4)
    return x, conv.bool(), iters


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
