"""Shuffle packing of potrf/posv: the lane packing's layout, every pivot broadcast by warp shuffles.

The lane packing (kernels_lane.py) lays a problem's columns across a warp's lanes and its rows in
each lane's registers; its one cross-lane step per pivot, the transpose of row j into a vector
every lane holds, is a shared-memory round trip with a barrier, and that round trip (not the
FMAs) is most of the 100-200 ns each of the n dependent pivots costs (docs/linalg_goal_gap.md:
lane_p1_w1 at fp32 n=32 batch 256 spends 190 ns a pivot). Here the same step is a warp-local
gather: colj[c, p, r] = t[j, p, r] (lane j's registers: column j of the symmetric trailing
matrix, i.e. t[r, j]) into every lane c of the problem, which Triton lowers to one `shfl.sync`
per register and no shared memory or barrier (checked on sm90 PTX, Triton 3.6: fp32 n=32 has
1024 shuffles, none of the loop's values pass through shared memory; only the load's mirror
does, once). The pivot t[j, j] is then a register pick of colj in every lane, and the whole
chain of a pivot is: shuffles (independent, pipelined), rsqrt + Newton, the rank-1 update.

Each lane holds exactly one column (P * NP == 32, one warp per program: the gather axis must lie
in the lanes alone; a column axis split across registers or warps makes the gather a select
over registers, or a shared-memory exchange, checked on TTGIR). So the packing has one config
per n: shfl_p{32/NP}_w1.

posv fuses the forward solve (z_j reaches every lane by a one-register gather of y) and solves
L^T x = z by rows of L with x across the lanes, x_k handed to every lane by the same gather (the
lane packing used a butterfly reduction there). Pivots, info and the deferred column scaling as
in kernels_lane.py: sqrt and its reciprocal from rsqrt and Newton steps; a pivot that is not
positive (or NaN) sets info to the first such column (1-based) and is replaced by 1.

info is carried in every lane of the problem (the pivot is every lane's after the gather) and
stored by the lane of column 0: reducing it to one value per problem would cost a cross-lane
reduction.
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_lane import _lane_load, _sqrt_rsqrt


@triton.jit
def _from_lane(x, j):
    """x[c, p, r] -> x[j, p, r] in every lane c of the problem (a warp-local gather on the
    column axis: one shuffle per register of x)."""
    return tl.gather(x, tl.full(x.shape, j, tl.int32), axis=0)


@triton.jit
def _shfl_chol(t, r, c, y, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, SOLVE: tl.constexpr):
    """Unrolled right-looking Cholesky of t[c, p, r] (deferred column scaling); with SOLVE,
    y ([NP, P, 1], lane c holds y_c) becomes z = L^-1 y. Returns (t, s, inv, info, y)."""
    info = tl.zeros([NP, P, 1], tl.int32)
    s = tl.zeros([NP, P, 1], t.dtype)
    inv = tl.zeros([NP, P, 1], t.dtype)
    for j in tl.static_range(N):
        colj = _from_lane(t, j)  # [NP, P, NP]: t[r, j] in every lane
        d = tl.sum(tl.where(r == j, colj, 0), axis=2, keep_dims=True)  # [NP, P, 1]: the pivot
        rowj = tl.sum(tl.where(r == j, t, 0), axis=2, keep_dims=True)  # [NP, P, 1]: t[c, j], own register
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        sj, ij = _sqrt_rsqrt(tl.where(bad, 1, d))
        s = tl.where(c == j, sj, s)
        inv = tl.where(c == j, ij, inv)
        right = tl.where(c > j, rowj * (ij * ij), 0)
        t = tl.where(r > j, t - colj * right, t)
        if SOLVE:
            # z_j = y_j / s_j from lane j; lane c > j takes L[c, j] z_j, L[c, j] = t[c, j] / s_j
            zj = _from_lane(y, j) * ij
            y = tl.where(c > j, y - rowj * (ij * zj), tl.where(c == j, zj, y))
    return t, s, inv, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_shfl(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, 1)
    t, s, inv, info, _ = _shfl_chol(t, r, c, t, N, NP, P, False)
    out = tl.where(r > c, t * inv, tl.where(r == c, s, 0))
    ok = (pp < batch) & (r < N) & (c < N)
    tl.store(L + pp * (N * N) + r * N + c, out, mask=ok)
    tl.store(INFO + pp + c * 0, info, mask=(pp < batch) & (c == 0))


@triton.jit(do_not_specialize=["batch"])
def posv_shfl(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """A x = b: factor with the forward solve fused, then L^T x = z by rows of L with x across
    the lanes (lane c holds x_c)."""
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, 1)
    w = tl.load(B + pp * N + c, mask=(pp < batch) & (c < N), other=0)  # [NP, P, 1]
    t, s, inv, info, w = _shfl_chol(t, r, c, w, N, NP, P, True)
    for kk in tl.static_range(N):
        k = N - 1 - kk
        # x_k = z_k / s_k from lane k; lane c < k: z_c -= L[k, c] x_k with L[k, c] = t[k, c] / s_c,
        # its own register k
        xk = _from_lane(w * inv, k)
        lk = tl.sum(tl.where(r == k, t, 0), axis=2, keep_dims=True)  # [NP, P, 1]
        w = tl.where(c < k, w - lk * inv * xk, tl.where(c == k, xk, w))
    tl.store(X + pp * N + c, w, mask=(pp < batch) & (c < N))
    tl.store(INFO + pp + c * 0, info, mask=(pp < batch) & (c == 0))
