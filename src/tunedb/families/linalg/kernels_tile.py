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

At NP >= 8 potrf/posv split the tile into 2x2 blocks of H = NP/2 ([P, H, H] each: L11, L21,
L22; the upper block is never held): the first H steps extract from and update all three, the
last N - H steps only L22, so a factorisation does about 1.25 N^3 tile element operations
instead of 4 N^3, and the back substitution 3/8 of the full tile's. The column scaling is
deferred to one pass at the end (column j of the tile is never touched after step j, so L's
entries are the very values the updates used), which saves a full-tile select per step. Below
the diagonal a column is scaled by the pivot's IEEE reciprocal (one division per column, not
one per element: Triton's IEEE fp32 division is a checked sequence with a slow-path call), as
LAPACK's potf2 does; within 1 ulp of the quotient, and the residual gate bounds the result.
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


@triton.jit
def _pivot(col, r2, k, j, info):
    """The pivot's square root from col[:, k] (global column j), its IEEE reciprocal, info updated."""
    d = tl.sum(tl.where(r2 == k, col, 0), axis=1)
    bad = (d <= 0) | (d != d)
    info = tl.where(bad & (info == 0), j + 1, info)
    s = sqrt_ieee(tl.where(bad, 1, d))[:, None]
    return s, div_ieee(tl.full(s.shape, 1, s.dtype), s), info


@triton.jit
def _scaled(t, s, inv, r, c, DIAG: tl.constexpr):
    """L's block from a deferred-scaled one: t[i, j] / s_j below the diagonal, s_j on it."""
    ic = inv[:, None, :]
    if DIAG:
        sc = s[:, None, :]
        return tl.where(r > c, t * ic, tl.where(r == c, sc, 0))
    else:
        return t * ic


@triton.jit
def _chol_split(A, base, okp, N: tl.constexpr, H: tl.constexpr, P: tl.constexpr,
                B, vbase, okv, SOLVE: tl.constexpr):
    """Cholesky of the lower triangle as 2x2 blocks of H (see the module docstring)."""
    r = tl.arange(0, H)[None, :, None]
    c = tl.arange(0, H)[None, None, :]
    r2 = tl.arange(0, H)[None, :]
    t11 = tl.load(A + base + r * N + c, mask=okp & (r >= c), other=0)
    t21 = tl.load(A + base + (r + H) * N + c, mask=okp & (r + H < N), other=0)
    t22 = tl.load(A + base + (r + H) * N + c + H, mask=okp & (r + H < N) & (r >= c), other=0)
    info = tl.zeros([P], tl.int32)
    s1 = tl.zeros([P, H], t11.dtype)
    s2 = tl.zeros([P, H], t11.dtype)
    i1 = tl.zeros([P, H], t11.dtype)
    i2 = tl.zeros([P, H], t11.dtype)
    y1 = tl.zeros([P, H], t11.dtype)
    y2 = tl.zeros([P, H], t11.dtype)
    if SOLVE:
        y1 = tl.load(B + vbase + r2, mask=okv, other=0)
        y2 = tl.load(B + vbase + r2 + H, mask=okv & (r2 + H < N), other=0)
    for j in range(H):  # N > H always (NP is the next power of two)
        col1 = tl.sum(tl.where(c == j, t11, 0), axis=2)
        col2 = tl.sum(tl.where(c == j, t21, 0), axis=2)
        s, inv, info = _pivot(col1, r2, j, j, info)
        s1 = tl.where(r2 == j, s, s1)
        i1 = tl.where(r2 == j, inv, i1)
        b1 = tl.where(r2 > j, col1 * inv, 0)
        b2 = col2 * inv
        b1c = b1[:, None, :]
        t11 = t11 - b1[:, :, None] * b1c
        t21 = t21 - b2[:, :, None] * b1c
        t22 = t22 - b2[:, :, None] * b2[:, None, :]
        if SOLVE:
            yj = tl.sum(tl.where(r2 == j, y1, 0), axis=1)[:, None] * inv
            y1 = tl.where(r2 == j, yj, y1 - b1 * yj)
            y2 = y2 - b2 * yj
    for k in range(N - H):
        col = tl.sum(tl.where(c == k, t22, 0), axis=2)
        s, inv, info = _pivot(col, r2, k, k + H, info)
        s2 = tl.where(r2 == k, s, s2)
        i2 = tl.where(r2 == k, inv, i2)
        b = tl.where(r2 > k, col * inv, 0)
        t22 = t22 - b[:, :, None] * b[:, None, :]
        if SOLVE:
            yk = tl.sum(tl.where(r2 == k, y2, 0), axis=1)[:, None] * inv
            y2 = tl.where(r2 == k, yk, y2 - b * yk)
    return (_scaled(t11, s1, i1, r, c, True), _scaled(t21, s1, i1, r, c, False),
            _scaled(t22, s2, i2, r, c, True), i1, i2, info, y1, y2)


@triton.jit(do_not_specialize=["batch"])
def potrf_tile(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    if NP >= 8:
        H: tl.constexpr = NP // 2
        prob = p[:, None, None]
        base = prob * (N * N)
        okp = prob < batch
        r = tl.arange(0, H)[None, :, None]
        c = tl.arange(0, H)[None, None, :]
        l11, l21, l22, _, _, info, _, _ = _chol_split(A, base, okp, N, H, P, A, base, okp, False)
        tl.store(L + base + r * N + c, l11, mask=okp)
        tl.store(L + base + r * N + c + H, tl.zeros([P, H, H], l11.dtype), mask=okp & (c + H < N))
        tl.store(L + base + (r + H) * N + c, l21, mask=okp & (r + H < N))
        tl.store(L + base + (r + H) * N + c + H, l22, mask=okp & (r + H < N) & (c + H < N))
    else:
        prob, r, c, m = _idx3(batch, N, NP, P)
        base = prob * (N * N)
        t, info, _ = _chol_tile(A, base, m, r, c, N, NP, P, A, base, m, False)
        tl.store(L + base + r * N + c, t, mask=m)
    tl.store(INFO + p, info, mask=p < batch)


@triton.jit
def _back_rows(lr, y, xk, r2, k):
    """y -= L[j, :]^T x_j over one block's rows below k (lr: L's row j in that block)."""
    return tl.where(r2 < k, y - lr * xk, y)


@triton.jit(do_not_specialize=["batch"])
def posv_tile(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """Factor in registers with the forward solve fused, then L^T x = y from the tile's rows
    (at NP >= 8 scaled by the pivots' reciprocals the factorisation kept: no division there)."""
    if NP >= 8:
        H: tl.constexpr = NP // 2
        p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
        prob = p[:, None, None]
        r = tl.arange(0, H)[None, :, None]
        r2 = tl.arange(0, H)[None, :]
        okv = p[:, None] < batch
        vbase = p[:, None] * N
        l11, l21, l22, i1, i2, info, y1, y2 = _chol_split(A, prob * (N * N), prob < batch, N, H, P,
                                                  B, vbase, okv, True)
        for kk in range(N - H):
            k = N - H - 1 - kk
            row22 = tl.sum(tl.where(r == k, l22, 0), axis=1)  # L[k + H, H:], by column
            row21 = tl.sum(tl.where(r == k, l21, 0), axis=1)  # L[k + H, :H]
            xk = tl.sum(tl.where(r2 == k, y2 * i2, 0), axis=1)[:, None]
            y2 = tl.where(r2 == k, xk, _back_rows(row22, y2, xk, r2, k))
            y1 = y1 - row21 * xk
        for kk in range(H):
            k = H - 1 - kk
            row = tl.sum(tl.where(r == k, l11, 0), axis=1)
            xk = tl.sum(tl.where(r2 == k, y1 * i1, 0), axis=1)[:, None]
            y1 = tl.where(r2 == k, xk, _back_rows(row, y1, xk, r2, k))
        tl.store(X + vbase + r2, y1, mask=okv)
        tl.store(X + vbase + r2 + H, y2, mask=okv & (r2 + H < N))
    else:
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
    """Forward substitution by rows on a [P, NP] state. X may alias B (B is read before X is written).

    Step j loads row j of L (contiguous: the loads coalesce and each byte of L is read once) and
    takes b_j - L[j, :j] x[:j] in one reduction; the lane holding x_j scales it by its own
    IEEE reciprocal of L[j, j], taken for the whole diagonal before the loop. The loop body is
    then branch-free (no division slow path), and up to n = 32 it is unrolled, so the row
    loads, which do not depend on x, can issue ahead of the arithmetic.
    """
    p, prob, r, vm = _idx2(batch, N, NP, P)
    base = prob * (N * N)
    x = tl.load(B + prob * N + r, mask=vm, other=0)
    dg = tl.load(L + base + r * (N + 1), mask=vm, other=1)
    inv = div_ieee(tl.full(dg.shape, 1, dg.dtype), dg)
    if N <= 32:
        for j in tl.static_range(N):
            x = _trsv_row(L, base, vm, r, x, inv, j, N)
    else:
        for j in range(N):
            x = _trsv_row(L, base, vm, r, x, inv, j, N)
    tl.store(X + prob * N + r, x, mask=vm)


@triton.jit
def _trsv_row(L, base, vm, r, x, inv, j, N: tl.constexpr):
    # the whole row (its upper part is loaded, never used): a mask uniform over the row lets
    # the load vectorise, and keeps one register layout for every step
    row = tl.load(L + base + j * N + r, mask=vm, other=0)
    acc = tl.sum(tl.where(r < j, -row * x, tl.where(r == j, x, 0)), axis=1)
    return tl.where(r == j, acc[:, None] * inv, x)
