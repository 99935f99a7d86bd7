"""Warp and block packings: register tiles with reductions along n.

warp: a program carries P >= 2 problems as a [P, NP] (vectors) or [P, NP, NP] (matrices) tile,
one problem's row or column spread across lanes. block: the same kernels at P = 1, the whole
NP x NP tile across 1-8 warps. NP is n rounded up to a power of two; masks keep the padding
out of memory and out of the pivots (padded entries load as 0 and are never a pivot column).

potrf/posv factor right-looking in registers: at step j, column j is extracted by a masked
reduction, scaled by the pivot's square root, the trailing part takes the rank-1 update and
column j of the tile is replaced by L's column, so the tile ends as L (zeros above). A pivot
that is not positive (or NaN) sets info to j + 1 (the first such column) and is replaced by 1:
the other problems of the program are untouched, and nothing loops on data.
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_thread import div_ieee, sqrt_ieee


@triton.jit
def _idx3(batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    prob = p[:, None, None]
    r = tl.arange(0, NP)[None, :, None]
    c = tl.arange(0, NP)[None, None, :]
    return prob, r, c, (prob < batch) & (r < N) & (c < N)


@triton.jit
def _idx2(batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    prob = p[:, None]
    r = tl.arange(0, NP)[None, :]
    return p, prob, r, (prob < batch) & (r < N)


@triton.jit(do_not_specialize=["batch"])
def dot_tile(X, Y, OUT, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    p, prob, r, m = _idx2(batch, N, NP, P)
    x = tl.load(X + prob * N + r, mask=m, other=0).to(ACC)
    y = tl.load(Y + prob * N + r, mask=m, other=0).to(ACC)
    tl.store(OUT + p, tl.sum(x * y, axis=1).to(OUT.dtype.element_ty), mask=p < batch)


@triton.jit(do_not_specialize=["batch"])
def gemv_tile(A, X, OUT, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    prob, r, c, m = _idx3(batch, N, NP, P)
    a = tl.load(A + prob * (N * N) + r * N + c, mask=m, other=0).to(ACC)
    x = tl.load(X + prob * N + c, mask=(prob < batch) & (c < N), other=0).to(ACC)
    y = tl.sum(a * x, axis=2)
    p, prob2, r2, m2 = _idx2(batch, N, NP, P)
    tl.store(OUT + prob2 * N + r2, y.to(OUT.dtype.element_ty), mask=m2)


@triton.jit(do_not_specialize=["batch"])
def gemm_tile(A, B, OUT, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    prob, r, c, m = _idx3(batch, N, NP, P)
    base = prob * (N * N)
    okp = prob < batch
    acc = tl.zeros([P, NP, NP], ACC)
    for k in range(N):
        a = tl.load(A + base + r * N + k, mask=okp & (r < N), other=0).to(ACC)
        b = tl.load(B + base + k * N + c, mask=okp & (c < N), other=0).to(ACC)
        acc += a * b
    tl.store(OUT + base + r * N + c, acc.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _chol_tile(A, base, m, r, c, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr,
               B, vbase, vm, SOLVE: tl.constexpr):
    """Right-looking Cholesky of the lower triangle; with SOLVE, also y = L^-1 b alongside."""
    t = tl.load(A + base + r * N + c, mask=m & (r >= c), other=0)
    r2 = tl.arange(0, NP)[None, :]
    info = tl.zeros([P], tl.int32)
    y = tl.zeros([P, NP], t.dtype)
    if SOLVE:
        y = tl.load(B + vbase + r2, mask=vm, other=0)
    for j in range(N):
        col = tl.sum(tl.where(c == j, t, 0), axis=2)
        d = tl.sum(tl.where(r2 == j, col, 0), axis=1)
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        s = sqrt_ieee(tl.where(bad, 1, d))[:, None]
        below = tl.where(r2 > j, div_ieee(col, s), 0)
        low = tl.where(r2 == j, s, below)
        t = t - below[:, :, None] * below[:, None, :]
        t = tl.where(c == j, low[:, :, None], t)
        if SOLVE:
            yj = div_ieee(tl.sum(tl.where(r2 == j, y, 0), axis=1)[:, None], s)
            y = tl.where(r2 == j, yj, y - below * yj)
    return t, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_tile(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    prob, r, c, m = _idx3(batch, N, NP, P)
    base = prob * (N * N)
    t, info, _ = _chol_tile(A, base, m, r, c, N, NP, P, A, base, m, False)
    tl.store(L + base + r * N + c, t, mask=m)
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    tl.store(INFO + p, info, mask=p < batch)


@triton.jit(do_not_specialize=["batch"])
def posv_tile(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """Factor in registers with the forward solve fused, then L^T x = y from the tile's rows."""
    prob, r, c, m = _idx3(batch, N, NP, P)
    p, prob2, r2, vm = _idx2(batch, N, NP, P)
    t, info, y = _chol_tile(A, prob * (N * N), m, r, c, N, NP, P, B, prob2 * N, vm, True)
    for jj in range(N):
        j = N - 1 - jj
        row = tl.sum(tl.where(r == j, t, 0), axis=1)  # L[j, :], indexed by column
        d = tl.sum(tl.where(r2 == j, row, 0), axis=1)[:, None]
        d = tl.where(d == 0, 1, d)
        xj = div_ieee(tl.sum(tl.where(r2 == j, y, 0), axis=1)[:, None], d)
        y = tl.where(r2 == j, xj, tl.where(r2 < j, y - row * xj, y))
    tl.store(X + prob2 * N + r2, y, mask=vm)
    tl.store(INFO + p, info, mask=p < batch)


@triton.jit(do_not_specialize=["batch"])
def trsv_tile(L, B, X, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """Forward substitution on a [P, NP] state; column j of L is loaded at step j. X may alias B."""
    p, prob, r, vm = _idx2(batch, N, NP, P)
    ok = p < batch
    base = prob * (N * N)
    x = tl.load(B + prob * N + r, mask=vm, other=0)
    for j in range(N):
        col = tl.load(L + base + r * N + j, mask=vm & (r >= j), other=0)
        d = tl.load(L + p * (N * N) + j * N + j, mask=ok, other=1)[:, None]
        xj = div_ieee(tl.sum(tl.where(r == j, x, 0), axis=1)[:, None], d)
        x = tl.where(r == j, xj, tl.where(r > j, x - col * xj, x))
    tl.store(X + prob * N + r, x, mask=vm)
