"""The triton_splitk lane: K split across CTAs into an fp32 workspace, then a fixed-order reduction.

No atomics: partials land in ws[split, M, N] and one reduction kernel sums them in split order,
so the same inputs always give the same bits. No torch import.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE, epilogue

@triton.jit(do_not_specialize=("M",))
def splitk_partial_kernel(x_ptr, w_ptr, ws_ptr, M, N, K,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    """ws[s, M, N] = x[:, Ks] @ w[:, Ks]^T for split s = program_id(1) (a contiguous run of K tiles)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_n = tl.cdiv(N, BN)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT)
    kt_lo = split * per_split
    kt_hi = tl.minimum(kt_lo + per_split, k_tiles)
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + rows_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    w_ptrs = w_ptr + cols_in[None, :] * K + (kt_lo * BK + offs_k)[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(kt_lo, kt_hi):  # a trailing split may own no tiles: it writes zeros
        k_left = K - kt * BK
        a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    base = ws_ptr + split.to(tl.int64) * M * N
    ptrs = base + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(ptrs, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def splitk_reduce_kernel(ws_ptr, y_ptr, b_ptr, M, N, HAS_BIAS, ACT,
                         SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """y = act(sum_s ws[s] + b), summed in split order 0..SPLIT-1."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    plane = M.to(tl.int64) * N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + s * plane + offs, mask=mask, other=0.0)
    acc = epilogue(acc, b_ptr, cols, N, HAS_BIAS, ACT)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
