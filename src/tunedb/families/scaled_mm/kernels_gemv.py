"""The triton_decode lane's GEMV kernel (`gv` configs, M <= 16): W streamed as [BN, BK] slabs of
K-contiguous bytes (16-byte vector loads, N rows wrapped so no load is masked in N), the product
taken either by CUDA-core FMAs (M <= 4: each fp8/int8 weight converted in registers, multiplied
by the M activation rows and summed over K; no tensor-core padding of M to 16 nor of N to the MMA
tile) or, with DOT, by one tensor-core dot per K tile with the weight slab on the MMA's M side:
w [BN, BK] @ x^T [BK, 16] (both K-major, as sm90's 8-bit MMAs take them), so BN rows of W fill the
MMA's rows (BN = 64-128 on 4 warps: one wgmma m64n16k32 per 32 bytes of K, read from shared memory
by the tensor cores) and x's rows past M are zero-filled copies that read nothing.

Why a second decode kernel: at M <= 16 the call is a weight stream, and the `dk` kernel moved 37%
of 4.3 TB/s at 4096x4096 where a pure read of the same bytes reaches 61-65% (session 13 F). Its
slabs are 32-128 rows wide, so at 4096 columns its grid is 32-128 CTAs per split and it needs
split-K (whose last-arriving CTA reduces serially: store, counter, reload) to fill the SMs;
the FMA path here takes 4-16-row slabs, so an unsplit grid already holds 256-1024 CTAs (several
per SM, each a few 16-byte loads in flight per thread), and split-K stays an option, reduced as
the `dk` kernel does: partials in ws[slab, split, 16, BN], an acq_rel counter per slab, the last
split sums them in split order 0..SPLIT-1 (deterministic; int32 exactly) and resets the counter.

Why the tensor-core path is transposed (session 16; instruction counts from the K loop's sm90 PTX
by Triton 3.6): it took x [16, BK] @ w^T, so a slab's BN columns were the MMA's N side: a 16 x 16
product on 4 warps (warps [2, 2]) computed every tile twice, at 4.9 instructions a weight byte
(ldmatrix, byte repacking of the fp8 operands: as many as the FMA path at M=1), and x was read as
16 wrapped rows a tile whatever M (16 x K bytes from L2 per slab: as many as the weight at BN=16).
Transposed, the padding falls on the MMA's N=16 side: one warp per 16 weight rows (2.1 a byte),
64+ rows on 4 warps a wgmma (0.9 a byte), and M rows of x read. The FMA path at M = 4 runs 14
instructions a weight byte (one FMA per row and byte, conversions, row sums): past the ~8 a byte
that 132 SMs issue at 4.3 TB/s, hence ~2x M=1's time there; the tensor-core path is the M >= 2 one.

Arithmetic: int8 multiplies and sums in int32 (exact: the same bits as every other int8 arm);
fp8 converts to fp32 and sums each K tile in fp32 before adding it to the accumulator; block
scales (BK divides 128) scale each tile's sum. The epilogue is the family's apply_scales:
(acc * x_scale[m]) * w_scale[n] in fp32, one rounding to the output. The first W tile is loaded
before the K loop and its product taken after it, so the loop's pipeline prologue (STAGES - 1
tiles by cp.async) is requested while it is in flight; with PDL that first tile is loaded before
gdc_wait, and x, the scales and every store come after it. Imports triton only.
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
def _mma_tile(w, x, sx_row, sw_col, kt, BK: tl.constexpr, SCALE: tl.constexpr, INT: tl.constexpr):
    """One K tile's [BN, 16] tensor-core product w [BN, BK] @ x[16, BK]^T (the weight on the MMA's
    M side), block scales applied."""
    if INT:
        part = tl.dot(w, tl.trans(x), out_dtype=tl.int32)
    else:
        part = tl.dot(w, tl.trans(x))
    if SCALE == 2:
        kb = (kt * BK) // 128
        part = part * tl.load(sx_row + kb)[None, :] * tl.load(sw_col + kb)[:, None]  # x's scale first, as ever
    return part


@triton.jit
def _fma_row(wf, x_ptr, sx_ptr, sw_col, R: tl.constexpr, M, K, kt, offs_k, k_ok, k_blocks,
             BK: tl.constexpr, SCALE: tl.constexpr, INT: tl.constexpr):
    """Row R (wrapped past M) of one K tile's product: sum_k wf[n, k] * x[R, k] -> [BN]. x's row
    is a 1-D vector in the layout of wf's K axis, so the sum runs inside each thread's 16 bytes,
    then across the warp's lanes: no shared memory, no layout conversion of the weight tile."""
    ZERO: tl.constexpr = 0 if INT else 0.0  # Triton casts no int to fp8
    row = (R % M).to(tl.int64)
    xr = tl.load(x_ptr + row * K + kt * BK + offs_k, mask=k_ok, other=ZERO)
    if INT:
        part = tl.sum(wf * xr.to(tl.int32)[None, :], axis=1)
    else:
        part = tl.sum(wf * xr.to(tl.float32)[None, :], axis=1)
    if SCALE == 2:
        kb = (kt * BK) // 128
        part = part * tl.load(sx_ptr + row * k_blocks + kb) * tl.load(sw_col + kb)
    return part


@triton.jit
def _fma_tile(w, x_ptr, sx_ptr, sw_col, a0, a1, a2, a3, M, K, kt, offs_k, k_ok, k_blocks,
              MP: tl.constexpr, BK: tl.constexpr, SCALE: tl.constexpr, INT: tl.constexpr):
    """a_r += row r's product for r < MP (MP <= 4: one [BN] accumulator per row, unused ones
    stay as they are)."""
    wf = w.to(tl.int32) if INT else w.to(tl.float32)
    a0 += _fma_row(wf, x_ptr, sx_ptr, sw_col, 0, M, K, kt, offs_k, k_ok, k_blocks, BK, SCALE, INT)
    if MP > 1:
        a1 += _fma_row(wf, x_ptr, sx_ptr, sw_col, 1, M, K, kt, offs_k, k_ok, k_blocks, BK, SCALE, INT)
    if MP > 2:
        a2 += _fma_row(wf, x_ptr, sx_ptr, sw_col, 2, M, K, kt, offs_k, k_ok, k_blocks, BK, SCALE, INT)
        a3 += _fma_row(wf, x_ptr, sx_ptr, sw_col, 3, M, K, kt, offs_k, k_ok, k_blocks, BK, SCALE, INT)
    return a0, a1, a2, a3


@triton.jit(do_not_specialize=("M",))
def scaled_mm_gemv_kernel(x_ptr, w_ptr, y_ptr, sx_ptr, sw_ptr, ws_ptr, cnt_ptr, M, N, K,
                          SCALE: tl.constexpr, INT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                          SPLIT: tl.constexpr, MP: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr,
                          STAGES: tl.constexpr):
    """y[M, N] = scaled(x[M, K] @ w[N, K]^T), M <= MP (16 with DOT, <= 4 without); grid
    (cdiv(N, BN), SPLIT). DOT accumulates [BN, MP] and transposes it once for the epilogue."""
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
    ACC: tl.constexpr = tl.int32 if INT else tl.float32
    w_ptrs = w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    k_blocks = tl.cdiv(K, 128)
    sw_col = sw_ptr + (cols_in // 128) * k_blocks
    k_left = K - kt_lo * BK
    w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=ZERO, eviction_policy="evict_first")
    if PDL:
        # x and the scales are the previous kernel's outputs: read them (and write anything) after it
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # The first tile's product is taken after the loop: the loop's pipeline prologue (STAGES - 1
    # tiles) is issued while that tile is still in flight, so a CTA starts with STAGES tiles
    # requested instead of one (the ramp of a stream of a few tiles per CTA).
    w0 = w
    if DOT:
        x_ptrs = x_ptr + rows_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
        sx_row = sx_ptr + rows_in * k_blocks
        # rows past M are masked, not wrapped: a zero-filled copy moves no bytes, where a wrapped
        # row would reread x from L2 (16 rows a tile whatever M)
        row_ok = rows[:, None] < M
        x0_mask = row_ok & (offs_k[None, :] < k_left)
        acc = tl.zeros((BN, MP), dtype=ACC)
        # an explicit num_stages: Triton pipelines (cp.async, STAGES - 1 tiles in flight) the loads
        # of a loop that asks, dot or no dot
        for kt in tl.range(kt_lo + 1, kt_hi, num_stages=STAGES):
            k_left = K - kt * BK
            off = (kt - kt_lo) * BK
            w = tl.load(w_ptrs + off, mask=offs_k[None, :] < k_left, other=ZERO, eviction_policy="evict_first")
            x = tl.load(x_ptrs + off, mask=row_ok & (offs_k[None, :] < k_left), other=ZERO)
            acc += _mma_tile(w, x, sx_row, sw_col, kt, BK, SCALE, INT)
        x = tl.load(x_ptrs, mask=x0_mask, other=ZERO)
        acc += _mma_tile(w0, x, sx_row, sw_col, kt_lo, BK, SCALE, INT)
        acc = tl.trans(acc)  # [MP, BN] for the epilogue: one small exchange per CTA
    else:
        k0_ok = offs_k < k_left
        a0 = tl.zeros((BN,), dtype=ACC)
        a1 = a0
        a2 = a0
        a3 = a0
        for kt in tl.range(kt_lo + 1, kt_hi, num_stages=STAGES):
            k_left = K - kt * BK
            w = tl.load(w_ptrs + (kt - kt_lo) * BK, mask=offs_k[None, :] < k_left, other=ZERO,
                        eviction_policy="evict_first")
            a0, a1, a2, a3 = _fma_tile(w, x_ptr, sx_ptr, sw_col, a0, a1, a2, a3, M, K, kt, offs_k,
                                       offs_k < k_left, k_blocks, MP, BK, SCALE, INT)
        a0, a1, a2, a3 = _fma_tile(w0, x_ptr, sx_ptr, sw_col, a0, a1, a2, a3, M, K, kt_lo, offs_k, k0_ok,
                                   k_blocks, MP, BK, SCALE, INT)
        # the rows' accumulators into one [MP, BN] tile, once per CTA
        acc = tl.where(rows[:, None] == 0, a0[None, :], 0)
        if MP > 1:
            acc += tl.where(rows[:, None] == 1, a1[None, :], 0)
        if MP > 2:
            acc += tl.where(rows[:, None] == 2, a2[None, :], 0) + tl.where(rows[:, None] == 3, a3[None, :], 0)
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
