"""The triton_mma lane: portable tl.dot tiles over a grouped 1-D grid (no torch import)."""
from __future__ import annotations

import triton
import triton.language as tl

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE, epilogue, tile_coords


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gemm_mma_kernel(x_ptr, w_ptr, y_ptr, b_ptr, M, N, K, HAS_BIAS, ACT,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """y[M, N] = act(x[M, K] @ w[N, K]^T + b); x, w, y contiguous."""
    pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    # Wrapped indices keep edge-tile loads in bounds without masks; the store masks instead.
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + rows_in[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + cols_in[None, :] * K + offs_k[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        k_left = K - kt * BK
        a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    acc = epilogue(acc, b_ptr, cols, N, HAS_BIAS, ACT)
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
