"""The triton_decode lane's GEMV kernel (`gv` configs, M <= 16): W streamed as [BN, BK] slabs of
K-contiguous bytes (16-byte vector loads, N rows wrapped so no load is masked in N), the product
taken either by CUDA-core FMAs (M <= 4: each fp8/int8 weight converted in registers, multiplied
by the M activation rows and summed over K; no tensor-core padding of M to 16 nor of N to the MMA
tile) or, with DOT, by one tensor-core dot per K tile against x padded to 16 rows.

Why a second decode kernel: at M <= 16 the call is a weight stream, and the `dk` kernel moved 37%
of 4.3 TB/s at 4096x4096 where a pure read of the same bytes reaches 61-65% (session 13 F). Its
slabs are 32-128 rows wide, so at 4096 columns its grid is 32-128 CTAs per split and it needs
split-K (whose last-arriving CTA reduces serially: store, counter, reload) to fill the SMs;
the FMA path here takes 4-16-row slabs, so an unsplit grid already holds 256-1024 CTAs (several
per SM, each a few 16-byte loads in flight per thread), and split-K stays an option, reduced as
the `dk` kernel does: partials in ws[slab, split, 16, BN], an acq_rel counter per slab, the last
split sums them in split order 0..SPLIT-1 (deterministic; int32 exactly) and resets the counter.

Arithmetic: int8 multiplies and sums in int32 (exact: the same bits as every other int8 arm);
fp8 converts to fp32 and sums each K tile in fp32 before adding it to the accumulator; block
scales (BK divides 128) scale each tile's sum. The epilogue is the family's apply_scales:
(acc * x_scale[m]) * w_scale[n] in fp32, one rounding to the output. With PDL the first W tile
is loaded before gdc_wait; x, the scales and every store come after it. Imports triton only.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (the validity predicate refuses _pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.scaled_mm.kernels import apply_scales


@triton.jit
def _gemv_tile(w, x, sx_row, sw_col, kt, BK: tl.constexpr, SCALE: tl.constexpr, INT: tl.constexpr,
               DOT: tl.constexpr):
    """One K tile's [MP, BN] product of x [MP, BK] and w [BN, BK] (block scales applied)."""
    if DOT:
        if INT:
            part = tl.dot(x, tl.trans(w), out_dtype=tl.int32)
        else:
            part = tl.dot(x, tl.trans(w))
    elif INT:
        part = tl.sum(x.to(tl.int32)[:, None, :] * w.to(tl.int32)[None, :, :], axis=2)
    else:
        part = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    if SCALE == 2:
        kb = (kt * BK) // 128
        part = part * tl.load(sx_row + kb)[:, None] * tl.load(sw_col + kb)[None, :]
    return part


@triton.jit(do_not_specialize=("M",))
def scaled_mm_gemv_kernel(x_ptr, w_ptr, y_ptr, sx_ptr, sw_ptr, ws_ptr, cnt_ptr, M, N, K,
                          SCALE: tl.constexpr, INT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          SPLIT: tl.constexpr, MP: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr,
                          STAGES: tl.constexpr):
    """y[M, N] = scaled(x[M, K] @ w[N, K]^T), M <= MP (16 with DOT); grid (cdiv(N, BN), SPLIT)."""
    WS_ROWS: tl.constexpr = 16  # the workspace's rows per slab and split (any M <= 16)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)
    rows = tl.arange(0, MP)
    rows_in = (rows % M).to(tl.int64)  # wrapped: x loads need no row mask
    offs_k = tl.arange(0, BK)
    k_tiles = tl.cdiv(K, BK)
    kt_lo = split * k_tiles // SPLIT
    kt_hi = (split + 1) * k_tiles // SPLIT
    ZERO: tl.constexpr = 0 if INT else 0.0
    w_ptrs = w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    x_ptrs = x_ptr + rows_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    k_blocks = tl.cdiv(K, 128)
    sx_row = sx_ptr + rows_in * k_blocks
    sw_col = sw_ptr + (cols_in // 128) * k_blocks
    k_left = K - kt_lo * BK
    w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=ZERO, eviction_policy="evict_first")
    if PDL:
        # x and the scales are the previous kernel's outputs: read them (and write anything) after it
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
    acc = _gemv_tile(w, x, sx_row, sw_col, kt_lo, BK, SCALE, INT, DOT)
    # an explicit num_stages: Triton pipelines loads that feed no dot only when the loop asks
    # (cp.async into shared memory, STAGES - 1 tiles in flight per CTA)
    for kt in tl.range(kt_lo + 1, kt_hi, num_stages=STAGES):
        w_ptrs += BK
        x_ptrs += BK
        k_left = K - kt * BK
        w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=ZERO, eviction_policy="evict_first")
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
        acc += _gemv_tile(w, x, sx_row, sw_col, kt, BK, SCALE, INT, DOT)
    out_mask = (rows[:, None] < M) & (cols[None, :] < N)
    y_ptrs = y_ptr + rows[:, None] * N + cols[None, :]
    if SPLIT == 1:
        acc = apply_scales(acc, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = rows[:, None] * BN + tl.arange(0, BN)[None, :]
        live = (rows[:, None] < M) & (tile >= 0)  # only the M real rows travel through L2
        plane = ws_ptr + pid_n.to(tl.int64) * SPLIT * (WS_ROWS * BN)
        tl.store(plane + split * (WS_ROWS * BN) + tile, acc, mask=live)
        tl.debug_barrier()  # every thread's partial is issued before the counter releases it
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tl.debug_barrier()
            total = tl.zeros((MP, BN), dtype=ws_ptr.dtype.element_ty)
            for s in tl.static_range(SPLIT):
                total += tl.load(plane + s * (WS_ROWS * BN) + tile, mask=live, other=0, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            total = apply_scales(total, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
