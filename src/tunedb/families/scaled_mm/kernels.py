"""The quantized GEMM's Triton kernels (no torch import): one tile kernel for both lanes, the
split-K reduction, the decode lane's weight-streaming kernel, and the row quantizer of the
`_quant` op.

Scale modes (SCALE): 0 per-tensor, 1 per-row (x per token [M], W per output channel [N]),
2 blocks (x [M, ceil(K/128)], W [ceil(N/128), ceil(K/128)], row-major). Modes 0 and 1 scale
the raw accumulator once, in the epilogue: int8 accumulates exactly in int32 (so every int8
tile, split or not, produces the same bits), fp8 in fp32. Mode 2 scales each K tile's product
inside the K loop (BLOCK_K divides 128, so a K tile never straddles two scale blocks).

The epilogue's arithmetic order is the torch arm's: (acc * x_scale[row]) * w_scale[col] in
fp32, one rounding to the output (per-tensor: acc * (x_scale * w_scale), as cuBLASLt's alpha).
fp8 products are promoted to the fp32 accumulator once per K tile (no fast accumulation).
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (the validity predicate refuses _pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.gemm.kernels_common import tile_coords


@triton.jit
def apply_scales(acc, sx_ptr, sw_ptr, rows_in, cols_in, SCALE: tl.constexpr):
    """fp32 acc scaled by mode SCALE (0 or 1; mode 2 was scaled in the K loop)."""
    acc = acc.to(tl.float32)
    if SCALE == 0:
        acc = acc * (tl.load(sx_ptr) * tl.load(sw_ptr))
    elif SCALE == 1:
        sx = tl.load(sx_ptr + rows_in)
        sw = tl.load(sw_ptr + cols_in)
        acc = acc * sx[:, None] * sw[None, :]
    return acc


@triton.jit(do_not_specialize=("M",))
def scaled_mm_kernel(x_ptr, w_ptr, y_ptr, sx_ptr, sw_ptr, M, N, K,
                     SCALE: tl.constexpr, INT: tl.constexpr, PARTIAL: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, SPLIT: tl.constexpr):
    """y[M, N] = scaled(x[M, K] @ w[N, K]^T); with PARTIAL, ws[split, M, N] = the split's raw
    (modes 0/1) or scaled (mode 2) sum over its run of K tiles, split = program_id(1)."""
    pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    split = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    # wrapped indices keep edge-tile loads in bounds without masks; the store masks instead
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    k_tiles = tl.cdiv(K, BK)
    per_split = tl.cdiv(k_tiles, SPLIT)
    kt_lo = split * per_split
    kt_hi = tl.minimum(kt_lo + per_split, k_tiles)
    offs_k = tl.arange(0, BK)
    ZERO: tl.constexpr = 0 if INT else 0.0  # Triton casts no int to fp8
    x_ptrs = x_ptr + rows_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    w_ptrs = w_ptr + cols_in[None, :] * K + (kt_lo * BK + offs_k)[:, None]
    if SCALE == 2:
        k_blocks = tl.cdiv(K, 128)
        sx_row = sx_ptr + rows_in * k_blocks
        sw_col = sw_ptr + (cols_in // 128) * k_blocks
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(kt_lo, kt_hi):
            k_left = K - kt * BK
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=ZERO)
            kb = (kt * BK) // 128
            sa = tl.load(sx_row + kb)
            sb = tl.load(sw_col + kb)
            acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            x_ptrs += BK
            w_ptrs += BK
    else:
        acc = tl.zeros((BM, BN), dtype=tl.int32 if INT else tl.float32)
        for kt in range(kt_lo, kt_hi):
            k_left = K - kt * BK
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=ZERO)
            if INT:
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            else:
                # fp8 on Hopper accumulates a chained dot in reduced precision; a fresh dot per
                # K tile added in fp32 promotes every BK elements (torch's use_fast_accum=False)
                acc += tl.dot(a, b)
            x_ptrs += BK
            w_ptrs += BK
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    if PARTIAL:
        tl.store(y_ptr + split.to(tl.int64) * M * N + offs, acc, mask=mask)
    else:
        acc = apply_scales(acc, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=("M",))
def scaled_mm_reduce_kernel(ws_ptr, y_ptr, sx_ptr, sw_ptr, M, N, SCALE: tl.constexpr,
                            SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """y = scaled(sum_s ws[s]), summed in split order (int32 partials: exactly)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
    plane = M.to(tl.int64) * N
    acc = tl.zeros((BM, BN), dtype=ws_ptr.dtype.element_ty)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + s * plane + offs, mask=mask, other=0)
    acc = apply_scales(acc, sx_ptr, sw_ptr, (rows % M).to(tl.int64), (cols % N).to(tl.int64), SCALE)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=("M",))
def row_quant_kernel(y_ptr, q_ptr, s_ptr, M, N, QMAX: tl.constexpr, INV_QMAX: tl.constexpr,
                     INT: tl.constexpr, BLOCK: tl.constexpr):
    """q[row] = quantize(y[row] / s[row]), s[row] = amax(|y[row]|) / QMAX, one program per row.

    IEEE division (div_rn) and an exact round-half-to-even, so the torch epilogue computes the
    same bits (torch divides tensors exactly; Triton's `/` would not)."""
    row = tl.program_id(0).to(tl.int64)
    src = y_ptr + row * N
    dst = q_ptr + row * N
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(src + cols, mask=cols < N, other=0.0)))
    a = tl.maximum(tl.max(amax, 0), 1e-12)
    inv = tl.math.div_rn(a * 0.0 + QMAX, a)
    tl.store(s_ptr + row, a * INV_QMAX)
    for off in range(0, N, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        v = tl.load(src + cols, mask=cols < N, other=0.0) * inv
        if INT:
            f = tl.floor(v)
            d = v - f
            odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
            v = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
        v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
        tl.store(dst + cols, v.to(q_ptr.dtype.element_ty), mask=cols < N)


@triton.jit(do_not_specialize=("M",))
def scaled_mm_tma_kernel(x_ptr, w_ptr, y_ptr, sx_ptr, sw_ptr, M, N, K,
                         SCALE: tl.constexpr, INT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, GROUP_M: tl.constexpr):
    """The triton_tma lane (sm90+): operands by device-side tensor descriptors (out-of-range rows
    and K columns read as zero), a persistent grid walking tiles pid, pid + grid, ... in grouped
    order; the same epilogue and K-block scaling as scaled_mm_kernel, stored through pointers
    (masked), so N needs no alignment. K * 1 byte must be a multiple of 16 (the predicate)."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = tile_coords(tile, M, N, BM, BN, GROUP_M)
        om = pid_m * BM
        on = pid_n * BN
        rows = om + tl.arange(0, BM)
        cols = on + tl.arange(0, BN)
        rows_in = (rows % M).to(tl.int64)
        cols_in = (cols % N).to(tl.int64)
        if SCALE == 2:
            k_blocks = tl.cdiv(K, 128)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kt in range(k_tiles):
                a = x_desc.load([om, kt * BK])
                b = w_desc.load([on, kt * BK])
                kb = (kt * BK) // 128
                sa = tl.load(sx_ptr + rows_in * k_blocks + kb)
                sb = tl.load(sw_ptr + (cols_in // 128) * k_blocks + kb)
                acc += tl.dot(a, b.T) * sa[:, None] * sb[None, :]
        else:
            acc = tl.zeros((BM, BN), dtype=tl.int32 if INT else tl.float32)
            for kt in range(k_tiles):
                a = x_desc.load([om, kt * BK])
                b = w_desc.load([on, kt * BK])
                if INT:
                    acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
                else:
                    acc += tl.dot(a, b.T)  # promoted per K tile, as scaled_mm_kernel
        acc = apply_scales(acc, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_step(acc, x, w, sx_row, sw_col, kt, BK: tl.constexpr, SCALE: tl.constexpr, INT: tl.constexpr,
                 FIRST: tl.constexpr):
    """acc plus one K tile's product, promoted as scaled_mm_kernel does (int32 exact; fp8 a fresh
    dot per tile; block scales per tile)."""
    if SCALE == 2:
        kb = (kt * BK) // 128
        part = tl.dot(x, w) * tl.load(sx_row + kb)[:, None] * tl.load(sw_col + kb)[None, :]
    elif INT:
        part = tl.dot(x, w, out_dtype=tl.int32)
    else:
        part = tl.dot(x, w)
    if FIRST:
        return part
    return acc + part


@triton.jit(do_not_specialize=("M",))
def scaled_mm_decode_kernel(x_ptr, w_ptr, y_ptr, sx_ptr, sw_ptr, ws_ptr, cnt_ptr, M, N, K,
                            SCALE: tl.constexpr, INT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                            SPLIT: tl.constexpr, PDL: tl.constexpr):
    """The triton_decode lane, M <= 16: y[M, N] = scaled(x[M, K] @ w[N, K]^T) as one weight stream.

    Grid (cdiv(N, BN), SPLIT): each CTA reads a BN-row slab of W over a contiguous run of K tiles
    (runs differ by at most one tile); x's rows (wrapped past M: no row mask, the loads stay
    16-byte vectors) ride in one 16-row tile reread from L2. With SPLIT > 1 each split stores its
    raw partial (int32 for int8, fp32 otherwise; block scales already applied) in
    ws[slab, split, 16, BN]; an acq_rel counter per slab finds the last split to arrive, which sums
    the partials in split order 0..SPLIT-1 (the same bits whichever CTA is last; int32 exactly),
    applies the epilogue, stores y and resets the counter (left zero for the next call). With PDL
    the first W tile is loaded before gdc_wait: x and its scales (the previous kernel's output)
    are read, and everything is written, only after it."""
    BM: tl.constexpr = 16
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)
    rows = tl.arange(0, BM)
    rows_in = (rows % M).to(tl.int64)
    offs_k = tl.arange(0, BK)
    k_tiles = tl.cdiv(K, BK)
    kt_lo = split * k_tiles // SPLIT
    kt_hi = (split + 1) * k_tiles // SPLIT
    ZERO: tl.constexpr = 0 if INT else 0.0
    w_ptrs = w_ptr + cols_in[None, :] * K + (kt_lo * BK + offs_k)[:, None]
    x_ptrs = x_ptr + rows_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    k_blocks = tl.cdiv(K, 128)
    sx_row = sx_ptr + rows_in * k_blocks
    sw_col = sw_ptr + (cols_in // 128) * k_blocks
    k_left = K - kt_lo * BK
    w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=ZERO)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
    acc = _decode_step(0, x, w, sx_row, sw_col, kt_lo, BK, SCALE, INT, True)
    for kt in range(kt_lo + 1, kt_hi):
        w_ptrs += BK
        x_ptrs += BK
        k_left = K - kt * BK
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=ZERO)
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=ZERO)
        acc = _decode_step(acc, x, w, sx_row, sw_col, kt, BK, SCALE, INT, False)
    out_mask = (rows[:, None] < M) & (cols[None, :] < N)
    y_ptrs = y_ptr + rows[:, None] * N + cols[None, :]
    if SPLIT == 1:
        acc = apply_scales(acc, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = rows[:, None] * BN + tl.arange(0, BN)[None, :]
        live = (rows[:, None] < M) & (tile >= 0)  # only the M real rows travel through L2
        tl.store(ws_ptr + (pid_n.to(tl.int64) * SPLIT + split) * (BM * BN) + tile, acc, mask=live)
        tl.debug_barrier()  # every thread's partial is issued before the counter releases it
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tl.debug_barrier()
            first = ws_ptr + pid_n.to(tl.int64) * SPLIT * (BM * BN)
            total = tl.zeros((BM, BN), dtype=ws_ptr.dtype.element_ty)
            for s in tl.static_range(SPLIT):
                total += tl.load(first + s * (BM * BN) + tile, mask=live, other=0, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            total = apply_scales(total, sx_ptr, sw_ptr, rows_in, cols_in, SCALE)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
