"""Rows packing of potrf/posv: a few threads per problem, each holding whole rows in registers.

For n = 16..32 the reg packing's one problem per thread no longer fits a thread's registers
(n(n+1)/2 = 528 values at n = 32) and the lane packing spends a whole warp on one problem: 32
threads x ~190 registers, so an SM holds about ten problems, too few bytes in flight, and each
step of the 32-step pivot chain waits on a barrier with little else to run. Here a program
carries P problems as a [P, NP(rows), NP(cols)] tile whose problem axis and row axis lie across
the lanes (G = 32 * num_warps / P threads per problem, rows dealt cyclically: thread g holds
rows g, g + G, ...) and whose column axis lies inside each thread. At fp32 n = 32 with G = 8 a
thread holds 4 rows x 32 columns: a problem costs 8 threads, a quarter of the lane packing's
registers, so about four times the problems stay resident.

The tile is the full symmetric matrix, mirrored at the load (thread row r, column c reads
A[max(r, c), min(r, c)]: the upper triangle of A is never read, and no transpose is needed).
The factorisation is right-looking and unrolled over the pivot (`tl.static_range`), with the
column scaling deferred (L[r, c] = t[r, c] / sqrt(d_c) at the end, as in kernels_lane.py):
  - column j, t[r, j] of the thread's own rows, is a register pick (the column axis lies in the
    thread, so c == j is a compile-time mask per register);
  - the trailing update t[r, c] -= t[r, j] t[c, j] / d_j needs t[c, j] for every column c in
    every thread of the problem: column j re-indexed along the column axis (`colj[:, None, :]`,
    a layout change Triton carries out once per pivot among the problem's G lanes); the pivot
    d_j is then a register pick of that vector;
  - the update runs only on columns c > j (compile-time masks: n^2/2 FMAs per row over the
    factorisation) and on every row: rows r <= j are finished, and their entries right of the
    pivot (the upper triangle, never stored) go to ~0 at their own step (t[r, c] - t[r, r]
    t[r, c] / d_r), so updating them changes nothing that is read. No row mask (a row index is a
    lane's, not known at compile time) is spent in the loop.

posv fuses the forward solve (z = L^-1 b, held along the column axis in every thread of the
problem, updated from the same re-indexed column) and then solves L^T x = z by columns of L:
x_k = (z_k - sum_{r > k} L[r, k] x_r) / L[k, k], x held along the row axis like the tile's rows,
one reduction across the problem's G lanes per step.

Pivots as in kernels_lane.py: sqrt and its reciprocal from rsqrt and Newton steps; a pivot that
is not positive (or NaN) sets info to the first such column (1-based) and is replaced by 1, so
nothing loops on data and the other problems are untouched. Picks add -0.0 for the registers
they drop (x + -0.0 is x, so the compiler may drop those adds).

The layout comes from the loads and stores: offsets declared non-contiguous (`tl.max_contiguous`
1 on every axis) leave the axes in their order, lanes on the problem axis first and the row axis
next, the column axis in registers (as in kernels_reg.py); the stores keep that layout, so the
tile never passes through shared memory as a whole.
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_lane import _sqrt_rsqrt


@triton.jit
def _rows_load(A, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """The mirrored symmetric tile t[p, r, c] = A[p, max(r, c), min(r, c)] and its indices."""
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    pp = p[:, None, None]
    r = tl.arange(0, NP)[None, :, None]
    c = tl.arange(0, NP)[None, None, :]
    offs = tl.max_contiguous(pp * (N * N) + tl.maximum(r, c) * N + tl.minimum(r, c), [1, 1, 1])
    t = tl.load(A + offs, mask=(pp < batch) & (r < N) & (c < N), other=0)
    return p, pp, r, c, t


@triton.jit
def _rows_chol(t, r, c, y, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, SOLVE: tl.constexpr):
    """Unrolled right-looking Cholesky of the symmetric tile t into L (its lower triangle; the
    diagonal holds 1 / L[j, j] instead when SOLVE, and -1 where the pivot failed); with SOLVE,
    y ([P, 1, NP], along the columns) becomes L^-1 y. Returns (t, y).

    Nothing the loop carries but the tile and y: a vector carried beside them (info, or the
    pivots for a deferred scaling) takes another layout from its own store or from tl.zeros (the
    columns across the lanes), and the compiler then reduces the pivot across the lanes and
    converts the column twice at every step (checked on sm90 TTGIR, Triton 3.6)."""
    for j in tl.static_range(N):
        colj = tl.sum(tl.where(c == j, t, -0.0), axis=2)  # [P, NP(rows)]: t[r, j], a register pick
        rowj = colj[:, None, :]  # [P, 1, NP(cols)]: t[c, j] in every thread of the problem
        d = tl.sum(tl.where(c == j, rowj, -0.0), axis=2)  # [P, 1]: the pivot t[j, j]
        bad = (d <= 0) | (d != d)
        sj, ij = _sqrt_rsqrt(tl.where(bad, 1, d))
        a = colj[:, :, None] * (ij * ij)[:, :, None]  # [P, NP, 1]: t[r, j] / d_j
        t = tl.where(c > j, t - a * rowj, t)
        # column j is final: L[r, j] = t[r, j] / s_j below the diagonal, s_j (or 1 / s_j) on it
        # a failed pivot leaves -1 on the diagonal (a kept one is positive): info is read off
        # the diagonal after the loop (_info_of)
        diag = tl.where(bad, -1.0, ij if SOLVE else sj)
        t = tl.where(c == j, tl.where(r == j, diag[:, :, None], t * ij[:, :, None]), t)
        if SOLVE:
            # z_j = y_j / s_j; y_c -= L[c, j] z_j for c > j, with L[c, j] = t[c, j] / s_j
            zj = tl.sum(tl.where(c == j, y, -0.0), axis=2)[:, :, None] * ij[:, :, None]  # [P, 1, 1]
            y = tl.where(c > j, y - rowj * (ij[:, :, None] * zj), tl.where(c == j, zj, y))
    return t, y


@triton.jit
def _store_info(INFO, t, p, r, c, batch, N: tl.constexpr):
    """info: the first column (1-based) whose diagonal holds the failed pivot's -1, else 0; one
    reduction across the problem's lanes after the loop."""
    first = tl.min(tl.min(tl.where((r == c) & (r < N) & (t < 0), c + 1, N + 1), axis=2), axis=1)
    tl.store(INFO + p, tl.where(first > N, 0, first), mask=p < batch)


@triton.jit(do_not_specialize=["batch"])
def potrf_rows(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p, pp, r, c, t = _rows_load(A, batch, N, NP, P)
    t, _ = _rows_chol(t, r, c, t, N, NP, P, False)
    out = tl.where(r >= c, t, 0)
    tl.store(L + tl.max_contiguous(pp * (N * N) + r * N + c, [1, 1, 1]), out,
             mask=(pp < batch) & (r < N) & (c < N))
    _store_info(INFO, t, p, r, c, batch, N)


@triton.jit(do_not_specialize=["batch"])
def posv_rows(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """A x = b: factor with the forward solve fused (z along the columns in every thread of the
    problem), then L^T x = z by columns of L with x along the rows."""
    p, pp, r, c, t = _rows_load(A, batch, N, NP, P)
    # b read by the threads of row 0 into the tile's layout, then handed along the problem's lanes
    # (one reduction over the row axis): y lies along the columns like the re-indexed pivot column
    # (offsets through a min, as A's through max/min: the compiler then sees no contiguity and
    # keeps the tile's layout; pp * N + c would be vectorised into another layout, and y with it)
    bt = tl.load(B + pp * N + tl.minimum(c, r + NP), mask=(pp < batch) & (c < N) & (r == 0), other=0)
    y = tl.sum(bt, axis=1, keep_dims=True)  # [P, 1, NP]
    t, y = _rows_chol(t, r, c, y, N, NP, P, True)
    # x along the rows ([P, NP, 1], the thread of row r holds x_r); a store of another shape or
    # contiguity would anchor x in another layout and every step's column would be converted
    for kk in tl.static_range(N):
        k = N - 1 - kk
        zk = tl.sum(tl.where(c == k, y, -0.0), axis=2, keep_dims=True)  # [P, 1, 1]: z_k, in every thread
        colk = tl.sum(tl.where(c == k, t, -0.0), axis=2, keep_dims=True)  # [P, NP, 1]: L[r, k]; 1 / L[k, k] at r = k
        if kk == 0:
            x = tl.where(r == k, zk * colk, 0.0)
        else:
            part = tl.sum(tl.where(r > k, colk * x, 0), axis=1, keep_dims=True)  # [P, 1, 1]: across the lanes
            x = tl.where(r == k, (zk - part) * colk, x)
    # stored through a tile-shaped pointer (column 0's lanes write), offsets through a min as above
    tl.store(X + pp * N + tl.minimum(r, c + NP), tl.broadcast_to(x, (P, NP, NP)), mask=(pp < batch) & (r < N) & (c == 0))
    _store_info(INFO, t, p, r, c, batch, N)
