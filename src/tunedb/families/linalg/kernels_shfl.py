"""Shuffle packing of potrf/posv/trsv: the lane packing's layout, every pivot broadcast by warp shuffles.

The lane packing (kernels_lane.py) lays a problem's columns across a warp's lanes and its rows in
each lane's registers; its one cross-lane step per pivot, the transpose of row j into a vector
every lane holds, is a shared-memory round trip with a barrier, and that round trip (not the
FMAs) is most of the 100-200 ns each of the n dependent pivots costs (docs/linalg_goal_gap.md:
lane_p1_w1 at fp32 n=32 batch 256 spends 190 ns a pivot). Here the same step is a warp-local
gather: colj[c, p, r] = t[j, p, r] (lane j's registers: column j of the symmetric trailing
matrix, i.e. t[r, j]) into every lane c of the problem, which Triton lowers to one `shfl.sync`
per register and no shared memory or barrier (checked on sm90 PTX, Triton 3.6: none of the
loop's values pass through shared memory; only the load's mirror and the split into row chunks
do, once). The pivot t[j, j] is then a register pick of colj in every lane, and the whole
chain of a pivot is: shuffles (independent, pipelined), rsqrt + Newton, the rank-1 update.

The pivot's gather only needs the rows at or below it, but a gather moves whole tensors: the tile
is held as row chunks of CH = 8 rows (NP / CH = 1, 2 or 4 tensors [NP, P, CH], split once after
the load), and pivot j gathers only the chunks that hold rows >= j, so a chunk of finished rows
costs no shuffle (fp32 n=32: 640 shuffles for the whole tile's 1024; fp64 1344 for 2176).

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
from tunedb.families.linalg.kernels_thread import div_ieee


@triton.jit
def _from_lane(x, j):
    """x[c, p, r] -> x[j, p, r] in every lane c of the problem (a warp-local gather on the
    column axis: one shuffle per register of x)."""
    return tl.gather(x, tl.full(x.shape, j, tl.int32), axis=0)


@triton.jit
def _chunks(t, NP: tl.constexpr, P: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr):
    """The tile's rows as NCH (1, 2 or 4) chunks of CH rows, [NP, P, CH] each (rows k*CH..),
    in registers (a reshape of the row axis each lane holds); unused slots repeat chunk 0."""
    if NCH == 1:
        return t, t, t, t
    elif NCH == 2:
        t0, t1 = tl.split(tl.permute(tl.reshape(t, (NP, P, 2, CH)), (0, 1, 3, 2)))
        return t0, t1, t0, t0
    else:
        u0, u1 = tl.split(tl.permute(tl.reshape(t, (NP, P, 2, 2, CH)), (0, 1, 4, 2, 3)))
        t0, t2 = tl.split(u0)
        t1, t3 = tl.split(u1)
        return t0, t1, t2, t3


@triton.jit
def _pick(t0, t1, t2, t3, K: tl.constexpr):
    if K == 0:
        return t0
    elif K == 1:
        return t1
    elif K == 2:
        return t2
    else:
        return t3


@triton.jit
def _update(tk, cj, right, rr, K: tl.constexpr, j: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr):
    """Chunk K's rank-1 update by pivot j: rows below j only; a chunk wholly above the pivot
    (finished rows) takes no gather and no FMA, a chunk below it gathers its own rows of column j."""
    if K < NCH:
        if K == j // CH:
            tk = tl.where(rr + K * CH > j, tk - cj * right, tk)
        elif K > j // CH:
            tk = tl.where(rr + K * CH > j, tk - _from_lane(tk, j) * right, tk)
    return tk


@triton.jit
def _shfl_chol(t, c, y, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, CH: tl.constexpr,
               NCH: tl.constexpr, SOLVE: tl.constexpr):
    """Unrolled right-looking Cholesky of t[c, p, r] (deferred column scaling) on its row
    chunks; with SOLVE, y ([NP, P, 1], lane c holds y_c) becomes z = L^-1 y.
    Returns (t0, t1, t2, t3, s, inv, info, y)."""
    t0, t1, t2, t3 = _chunks(t, NP, P, CH, NCH)
    rr = tl.arange(0, CH)[None, None, :]
    info = tl.zeros([NP, P, 1], tl.int32)
    s = tl.zeros([NP, P, 1], t.dtype)
    inv = tl.zeros([NP, P, 1], t.dtype)
    for j in tl.static_range(N):
        tj = _pick(t0, t1, t2, t3, j // CH)
        at_j = rr + (j // CH) * CH == j
        cj = _from_lane(tj, j)  # [NP, P, CH]: column j's rows of the pivot's chunk, every lane
        d = tl.sum(tl.where(at_j, cj, 0), axis=2, keep_dims=True)  # [NP, P, 1]: the pivot
        rowj = tl.sum(tl.where(at_j, tj, 0), axis=2, keep_dims=True)  # [NP, P, 1]: t[c, j], own register
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        sj, ij = _sqrt_rsqrt(tl.where(bad, 1, d))
        s = tl.where(c == j, sj, s)
        inv = tl.where(c == j, ij, inv)
        right = tl.where(c > j, rowj * (ij * ij), 0)
        t0 = _update(t0, cj, right, rr, 0, j, CH, NCH)
        t1 = _update(t1, cj, right, rr, 1, j, CH, NCH)
        t2 = _update(t2, cj, right, rr, 2, j, CH, NCH)
        t3 = _update(t3, cj, right, rr, 3, j, CH, NCH)
        if SOLVE:
            # z_j = y_j / s_j from lane j; lane c > j takes L[c, j] z_j, L[c, j] = t[c, j] / s_j
            zj = _from_lane(y, j) * ij
            y = tl.where(c > j, y - rowj * (ij * zj), tl.where(c == j, zj, y))
    return t0, t1, t2, t3, s, inv, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_shfl(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, CH: tl.constexpr):
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, 1)
    t0, t1, t2, t3, s, inv, info, _ = _shfl_chol(t, c, t, N, NP, P, CH, NP // CH, False)
    rr = tl.arange(0, CH)[None, None, :]
    for k in tl.static_range(NP // CH):
        rk = rr + k * CH
        out = tl.where(rk > c, _pick(t0, t1, t2, t3, k) * inv, tl.where(rk == c, s, 0))
        tl.store(L + pp * (N * N) + rk * N + c, out, mask=(pp < batch) & (rk < N) & (c < N))
    tl.store(INFO + pp + c * 0, info, mask=(pp < batch) & (c == 0))


@triton.jit(do_not_specialize=["batch"])
def posv_shfl(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, CH: tl.constexpr):
    """A x = b: factor with the forward solve fused, then L^T x = z by rows of L with x across
    the lanes (lane c holds x_c)."""
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, 1)
    w = tl.load(B + pp * N + c, mask=(pp < batch) & (c < N), other=0)  # [NP, P, 1]
    t0, t1, t2, t3, s, inv, info, w = _shfl_chol(t, c, w, N, NP, P, CH, NP // CH, True)
    rr = tl.arange(0, CH)[None, None, :]
    for kk in tl.static_range(N):
        k = N - 1 - kk
        # x_k = z_k / s_k from lane k; lane c < k: z_c -= L[k, c] x_k with L[k, c] = t[k, c] / s_c,
        # its own register k
        xk = _from_lane(w * inv, k)
        lk = tl.sum(tl.where(rr + (k // CH) * CH == k, _pick(t0, t1, t2, t3, k // CH), 0), axis=2, keep_dims=True)
        w = tl.where(c < k, w - lk * inv * xk, tl.where(c == k, xk, w))
    tl.store(X + pp * N + c, w, mask=(pp < batch) & (c < N))
    tl.store(INFO + pp + c * 0, info, mask=(pp < batch) & (c == 0))


@triton.jit(do_not_specialize=["batch"])
def trsv_shfl(L, B, X, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, CH: tl.constexpr):
    """L x = b (L lower; its upper triangle never read) by columns, one row of L a lane: lane c
    holds row c in registers and y_c; step j hands x_j = y_j / L[j, j] from lane j to every lane
    of the problem (one shuffle) and lane c > j takes L[c, j] x_j from its own register j. The
    chain of a step is a multiply, a shuffle and an FMA (trsv_tile reduces a row across the lanes
    at every step instead). X may alias B (b is read before x is written). CH is unused (the
    packing's launch passes it)."""
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    c = tl.arange(0, NP)[:, None, None]
    pp = p[None, :, None]
    r = tl.arange(0, NP)[None, None, :]
    ok = (pp < batch) & (c < N)
    # no contiguity declared: a vectorised row would put lanes along the row (the coalescing
    # pass), and the gather needs the row index c in the lanes alone
    row = tl.load(L + tl.max_contiguous(pp * (N * N) + c * N + r, [1, 1, 1]), mask=ok & (r <= c), other=0)
    d = tl.sum(tl.where(r == c, row, 0), axis=2, keep_dims=True)  # [NP, P, 1]: L[c, c]
    inv = div_ieee(tl.full(d.shape, 1, d.dtype), tl.where(c < N, d, 1))
    y = tl.load(B + tl.max_contiguous(pp * N + c, [1, 1, 1]), mask=ok, other=0)  # [NP, P, 1]
    for j in tl.static_range(N):
        xj = _from_lane(y * inv, j)
        lj = tl.sum(tl.where(r == j, row, 0), axis=2, keep_dims=True)  # L[c, j]: own register j
        y = tl.where(c > j, y - lj * xj, tl.where(c == j, xj, y))
    tl.store(X + tl.max_contiguous(pp * N + c, [1, 1, 1]), y, mask=ok)
