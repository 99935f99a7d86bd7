"""Triton kernels of the fused GEMM + log-softmax (y = log_softmax(x @ W^T + b, dim=-1)).

Two designs share one tile body (a [BM, BN] tile of fp32 logits from a K loop of tl.dot):

- recompute (lane `triton_recompute`): pass 1 (`_stats_kernel`, WRITE=False) computes every tile
  of logits and keeps only its rows' max and sum of exp per N tile (fp32 partials [M, T]); a
  tiny combine (`_combine_kernel`) turns each row's T partials into its log-sum-exp [M]; pass 2
  (`_recompute_kernel`) recomputes the same tile and writes logit - lse once. The logits never reach memory; the GEMM
  runs twice (wins where the K loop is short and the M x N output traffic dominates).
- fixup (lane `triton_fixup`): pass 1 (`_stats_kernel`, WRITE=True) also stores the tile's
  logits in the output dtype into the output buffer; the same combine, then `_fixup_kernel`
  subtracts lse in place. One GEMM, but the output is written, read and written again (the
  logits are rounded to the output dtype before the subtraction, as torch's linear then
  log_softmax rounds them), so its statistics are those of the rounded logits, as torch's are:
  each row of exp(y) then sums to 1 up to the output's own rounding.

recompute takes the statistics of the fp32 tile (its lse is the fp32 logits', and pass 2
subtracts it from the same fp32 logits). No torch import: launch.py passes tensors.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_wait: Triton 3.4+ (the validity predicate refuses pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass


@triton.jit
def _logit_tile(x_ptr, w_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_xm, stride_wn,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """fp32 logits [BM, BN] of one tile; columns past N are -inf (they drop out of max and sum)."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + offs_k) < K
        a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        acc += bias[None, :]
    acc = tl.where(n_ok[None, :], acc, float("-inf"))
    return acc, offs_m, offs_n, m_ok, n_ok


@triton.jit
def _tile_ids(M, BM: tl.constexpr):
    # consecutive programs share one N tile (one slice of W read from DRAM once, x from L2)
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    return pid % num_m, pid // num_m


@triton.jit
def _stats_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, M, N, K, T,
                  stride_xm, stride_wn, stride_ym,
                  HAS_BIAS: tl.constexpr, WRITE: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Pass 1: per (row, N tile) max and sum of exp(logit - max); WRITE also stores the logits."""
    pid_m, pid_n = _tile_ids(M, BM)
    acc, offs_m, offs_n, m_ok, n_ok = _logit_tile(x_ptr, w_ptr, b_ptr, pid_m, pid_n, M, N, K,
                                                  stride_xm, stride_wn, HAS_BIAS, BM, BN, BK)
    if WRITE:
        # The fixup subtracts lse from the stored (rounded) logits, so lse must be theirs: with
        # the fp32 logits' lse a bf16 logit near 20 (half an ulp: 0.06) would shift its row's
        # probabilities by up to 6% and the row would no longer sum to 1.
        acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
    t_max = tl.max(acc, axis=1)
    t_sum = tl.sum(tl.exp(acc - t_max[:, None]), axis=1)
    stat = offs_m.to(tl.int64) * T + pid_n
    tl.store(pmax_ptr + stat, t_max, mask=m_ok)
    tl.store(psum_ptr + stat, t_sum, mask=m_ok)
    if WRITE:
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _row_lse(pmax_ptr, psum_ptr, offs_m, m_ok, T, TB: tl.constexpr):
    """The log-sum-exp of each row from its T partial (max, sum) pairs, TB at a time."""
    offs_t = tl.arange(0, TB)
    run_max = tl.full(offs_m.shape, float("-inf"), tl.float32)
    run_sum = tl.zeros(offs_m.shape, tl.float32)
    base = offs_m.to(tl.int64) * T
    for t0 in range(0, T, TB):
        ok = m_ok[:, None] & ((t0 + offs_t) < T)[None, :]
        pm = tl.load(pmax_ptr + base[:, None] + t0 + offs_t[None, :], mask=ok, other=float("-inf"))
        ps = tl.load(psum_ptr + base[:, None] + t0 + offs_t[None, :], mask=ok, other=0.0)
        new_max = tl.maximum(run_max, tl.max(pm, axis=1))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows past M: keep them finite
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(ps * tl.exp(pm - safe[:, None]), axis=1)
        run_max = new_max
    return tl.where(m_ok, run_max + tl.log(tl.where(m_ok, run_sum, 1.0)), 0.0)


@triton.jit
def _combine_kernel(pmax_ptr, psum_ptr, lse_ptr, M, T, RB: tl.constexpr, TB: tl.constexpr):
    """The combine: each row's lse from its T partials, once (pass 2 then reads one float a row)."""
    offs_m = tl.program_id(0) * RB + tl.arange(0, RB)
    m_ok = offs_m < M
    tl.store(lse_ptr + offs_m, _row_lse(pmax_ptr, psum_ptr, offs_m, m_ok, T, TB), mask=m_ok)


@triton.jit
def _recompute_kernel(x_ptr, w_ptr, b_ptr, y_ptr, lse_ptr, M, N, K,
                      stride_xm, stride_wn, stride_ym,
                      HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Pass 2 of the recompute design: recompute the tile, write logit - lse once."""
    pid_m, pid_n = _tile_ids(M, BM)
    acc, offs_m, offs_n, m_ok, n_ok = _logit_tile(x_ptr, w_ptr, b_ptr, pid_m, pid_n, M, N, K,
                                                  stride_xm, stride_wn, HAS_BIAS, BM, BN, BK)
    lse = tl.load(lse_ptr + offs_m, mask=m_ok, other=0.0)
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, (acc - lse[:, None]).to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _fixup_kernel(y_ptr, lse_ptr, M, N, stride_ym, RB: tl.constexpr, FN: tl.constexpr):
    """Pass 2 of the fixup design: y[row, :] -= lse(row), in place, RB rows x FN columns a program."""
    offs_m = tl.program_id(0) * RB + tl.arange(0, RB)
    offs_n = tl.program_id(1) * FN + tl.arange(0, FN)
    m_ok = offs_m < M
    lse = tl.load(lse_ptr + offs_m, mask=m_ok, other=0.0)
    ok = m_ok[:, None] & (offs_n < N)[None, :]
    ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    y = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    tl.store(ptrs, (y - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rows_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, R: tl.constexpr, C: tl.constexpr,
                 ONE: tl.constexpr, VEC: tl.constexpr, GDC: tl.constexpr):
    """The linear_rows lane's pass over logits F.linear wrote: y[row] = x[row] - lse(row) for R
    rows a program, fp32 inside. ONE (C >= N): each row is read once and kept in registers;
    otherwise an online max/sum over C-column chunks, then a second sweep (the row was just read:
    it comes from L2) writes. y may be x (in place).

    VEC (launch.row_vec): N and both row strides are multiples of VEC elements and the pointers
    VEC-element aligned. Triton specialises an integer argument only when it divides by 16, so
    without the hint a vocabulary such as 5000 (a multiple of 8, not 16) compiles to 2-byte
    loads and stores; with VEC=8 they are 16-byte vectors (the sm90 compile test checks the PTX).
    GDC: launched under programmatic dependent launch after F.linear's GEMM; wait for it here."""
    if GDC:
        tl.extra.cuda.gdc_wait()
    if VEC > 1:  # the same values, rewritten so that the compiler sees their divisibility
        N = (N // VEC) * VEC
        stride_xm = (stride_xm // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    rows = tl.program_id(0) * R + tl.arange(0, R)
    r_ok = rows < M
    cols = tl.arange(0, C)
    xrow = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    yrow = y_ptr + rows[:, None].to(tl.int64) * stride_ym
    if ONE:
        ok = r_ok[:, None] & (cols < N)[None, :]
        v = tl.load(xrow + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32)
        mx = tl.max(v, axis=1)
        mx = tl.where(r_ok, mx, 0.0)  # rows past M: finite, never stored
        lse = mx + tl.log(tl.sum(tl.exp(v - mx[:, None]), axis=1))
        tl.store(yrow + cols[None, :], (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)
    else:
        run_max = tl.full((R,), float("-inf"), tl.float32)
        run_sum = tl.zeros((R,), tl.float32)
        for c0 in range(0, N, C):
            ok = r_ok[:, None] & ((c0 + cols) < N)[None, :]
            v = tl.load(xrow + c0 + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, tl.max(v, axis=1))
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(v - safe[:, None]), axis=1)
            run_max = new_max
        lse = tl.where(r_ok, run_max + tl.log(tl.where(r_ok, run_sum, 1.0)), 0.0)
        for c0 in range(0, N, C):
            ok = r_ok[:, None] & ((c0 + cols) < N)[None, :]
            v = tl.load(xrow + c0 + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            tl.store(yrow + c0 + cols[None, :], (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rows_stream_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, R: tl.constexpr, C: tl.constexpr,
                        VEC: tl.constexpr, GDC: tl.constexpr):
    """The persistent row pass (`lr_..._p{P}`): a grid of P programs an SM walks the row blocks
    (R rows, whole rows held: C >= N), loading block i + G while it reduces and stores block i,
    so one program's next read overlaps its own reductions and writes (the one-read kernel
    above leaves them in sequence: at M >= 1024 its waves alternate between reading and
    writing). The prefetched block is held in the input dtype. Launched with num_stages=1: the
    prefetch is written out, not left to the pipeliner. y may be x: a block is stored only after
    it was read, and blocks belong to one program each. VEC, GDC: as _rows_kernel's."""
    if GDC:
        tl.extra.cuda.gdc_wait()
    if VEC > 1:  # the same values, rewritten so that the compiler sees their divisibility
        N = (N // VEC) * VEC
        stride_xm = (stride_xm // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, C)
    c_ok = cols < N
    rows = pid * R + tl.arange(0, R)
    nxt = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :],
                  mask=(rows < M)[:, None] & c_ok[None, :], other=float("-inf"))
    for blk in range(pid, tl.cdiv(M, R), G):
        rows = blk * R + tl.arange(0, R)
        r_ok = rows < M
        v = nxt.to(tl.float32)
        ahead = rows + G * R
        nxt = tl.load(x_ptr + ahead[:, None].to(tl.int64) * stride_xm + cols[None, :],
                      mask=(ahead < M)[:, None] & c_ok[None, :], other=float("-inf"))
        mx = tl.where(r_ok, tl.max(v, axis=1), 0.0)  # rows past M: finite, never stored
        lse = mx + tl.log(tl.sum(tl.exp(v - mx[:, None]), axis=1))
        tl.store(y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :],
                 (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=r_ok[:, None] & c_ok[None, :])
