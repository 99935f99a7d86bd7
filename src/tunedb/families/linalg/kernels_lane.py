"""Lane packing of potrf/posv: one matrix column per lane, its rows in that lane's registers.

A program carries P problems as a [NP(cols), P, NP(rows)] tile whose columns lie across lanes
(NP lanes per problem, 32 / NP problems per warp up to n = 32) and whose rows lie inside each
lane. The factorisation is unrolled over the pivot (`tl.static_range`), so every mask on the row
axis is a compile-time constant per register: extracting row j, the pivot or a vector entry is a
register pick, and the rank-1 update issues FMAs only for the rows below the pivot. The one
cross-lane step per pivot is the transpose of row j into a row-indexed vector every lane holds
(a shared-memory round trip Triton emits for the layout change): no butterfly reductions in
the factorisation at all.

The tile is the full symmetric matrix, mirrored from A's lower triangle at load time (the upper
triangle of A is never read), and the trailing updates keep it symmetric, so row j of the
trailing matrix is column j: the lanes read it from their own registers. Column j's scaling is
deferred (it is never touched after step j): L[r, c] = t[r, c] / sqrt(d_c) is applied once at
the end with the pivots' IEEE reciprocals, as in kernels_tile. A pivot that is not positive (or
NaN) sets info to the first such column (1-based) and is replaced by 1: nothing loops on data,
and the other problems of the program are untouched.

posv keeps y = L^-1 b as a row-indexed vector replicated in every lane of its problem (the
forward solve is register-only, fused into the factorisation) and solves L^T x = y by columns:
at step k each lane dots its column with the solved tail of x (register-only) and the lane of
column k hands its x_k to the others (one cross-lane reduction per k).

The layout comes from the load (Triton's coalescing): the mirrored addresses have no
contiguity the compiler can vectorise, so each lane keeps one column; checked in the sm90
TTGIR (tests/unit/test_linalg_lane.py compiles it where a Triton 3.6 wheel is present).
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_thread import div_ieee, sqrt_ieee


@triton.jit
def _lane_load(A, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """The mirrored symmetric tile t[c, p, r] = A[max(r, c), min(r, c)] and its indices."""
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    c = tl.arange(0, NP)[:, None, None]
    pp = p[None, :, None]
    r = tl.arange(0, NP)[None, None, :]
    ok = (pp < batch) & (r < N) & (c < N)
    hi = tl.maximum(r, c)
    lo = tl.minimum(r, c)
    t = tl.load(A + pp * (N * N) + hi * N + lo, mask=ok, other=0)
    return p, pp, r, c, t


@triton.jit
def _lane_chol(t, r, c, y, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, SOLVE: tl.constexpr):
    """Unrolled right-looking Cholesky of t (deferred column scaling); with SOLVE, y = L^-1 y.

    Returns (t, s, inv, info, y): s / inv hold each lane's column pivot sqrt / its reciprocal,
    shape [NP, P, 1]; info [1, P, 1]."""
    info = tl.zeros([1, P, 1], tl.int32)
    s = tl.zeros([NP, P, 1], t.dtype)
    inv = tl.zeros([NP, P, 1], t.dtype)
    for j in tl.static_range(N):
        rowj = tl.sum(tl.where(r == j, t, 0), axis=2)  # [NP, P]: t[j, c] = t[c, j], a register pick
        colj = tl.trans(rowj)[None, :, :]  # [1, P, NP]: t[r, j] in every lane (the transpose)
        d = tl.sum(tl.where(r == j, colj, 0), axis=2)[:, :, None]  # [1, P, 1]: the pivot t[j, j]
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        sj = sqrt_ieee(tl.where(bad, 1, d))
        ij = div_ieee(tl.full(sj.shape, 1, sj.dtype), sj)
        s = tl.where(c == j, sj, s)
        inv = tl.where(c == j, ij, inv)
        # t[r, c] -= t[r, j] t[j, c] / d for r, c > j; c <= j (finished columns) take a zero
        right = tl.where(c > j, rowj[:, :, None] * (ij * ij), 0)
        t = tl.where(r > j, t - colj * right, t)
        if SOLVE:
            yj = tl.sum(tl.where(r == j, y, 0), axis=2)[:, :, None] * ij  # z_j = y_j / s_j
            y = tl.where(r == j, yj, tl.where(r > j, y - colj * (ij * yj), y))
    return t, s, inv, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_lane(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P)
    t, s, inv, info, _ = _lane_chol(t, r, c, t, N, NP, P, False)
    out = tl.where(r > c, t * inv, tl.where(r == c, s, 0))
    ok = (pp < batch) & (r < N) & (c < N)
    tl.store(L + pp * (N * N) + r * N + c, out, mask=ok)
    tl.store(INFO + pp, info, mask=pp < batch)


@triton.jit(do_not_specialize=["batch"])
def posv_lane(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """A x = b: factor with the forward solve fused, then L^T x = z by columns (x overwrites z
    from the bottom: entries below k are x, the rest still z)."""
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P)
    # b loaded lane-wise (as the tile's columns lie), then transposed into every lane
    bc = tl.load(B + pp * N + c, mask=(pp < batch) & (c < N), other=0)  # [NP, P, 1]
    y = tl.trans(tl.reshape(bc, (NP, P)))[None, :, :]  # [1, P, NP]
    t, s, inv, info, y = _lane_chol(t, r, c, y, N, NP, P, True)
    for kk in tl.static_range(N):
        k = N - 1 - kk
        # lane c: (z_k - sum_{r > k} t[r, c] x_r / s_c) / s_c; lane k's value is x_k
        dotc = tl.sum(tl.where(r > k, t * y, 0), axis=2)[:, :, None]  # [NP, P, 1]
        yk = tl.sum(tl.where(r == k, y, 0), axis=2)[:, :, None]  # [1, P, 1]
        val = (yk - dotc * inv) * inv
        xk = tl.sum(tl.where(c == k, val, 0), axis=0)[None, :, :]  # [1, P, 1]: lane k's, to all
        y = tl.where(r == k, xk, y)
    tl.store(X + pp * N + r, y, mask=(pp < batch) & (r < N))
    tl.store(INFO + pp, info, mask=pp < batch)
