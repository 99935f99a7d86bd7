"""Lane packing of potrf/posv: one matrix column per lane, its rows in that lane's registers.

A program carries P problems as a [NP(cols), P, NP(rows)] tile whose columns lie across lanes
(NP lanes per problem, 32 / NP problems per warp up to n = 32) and whose rows lie inside each
lane. The factorisation is unrolled over the pivot (`tl.static_range`), so every mask on the row
axis is a compile-time constant per register: extracting row j, the pivot or a vector entry is a
register pick, and the rank-1 update issues FMAs only for the rows below the pivot. The one
cross-lane step per pivot is the transpose of row j into a row-indexed vector every lane holds
(a shared-memory round trip Triton emits for the layout change): no butterfly reductions in
the factorisation at all. The pivot's square root and its reciprocal come from rsqrt and Newton
steps (a few instructions on every step's critical path, where IEEE sqrt and division take
about twenty); the residual gate bounds the result like any arm's. (fp32's rsqrt flushes a
subnormal pivot, below 1.2e-38, to zero: such a problem comes back non-finite with info 0.)

The tile is the full symmetric matrix: A's lower triangle is loaded coalesced (lane c reads
column c of each row; the upper triangle of A is never read) and mirrored by one transpose of
the tile; the trailing updates keep it symmetric, so row j of the trailing matrix is column j:
each lane reads it from its own registers. Column j's scaling is deferred (it is never touched
after step j): L[r, c] = t[r, c] / sqrt(d_c) is applied once at the end. A pivot that is not
positive (or NaN) sets info to the first such column (1-based) and is replaced by 1: nothing
loops on data, and the other problems of the program are untouched.

posv keeps b, then z = L^-1 b, then x spread across the lanes (lane c holds entry c). The
forward solve is fused into the factorisation: z_j reaches every lane by a transpose like row
j's, and lane c > j takes L[c, j] z_j with L[c, j] from its own register j (the trailing matrix
is symmetric). L^T x = z: at step k the lane of column k hands x_k to the others (one reduction
across the lanes) and lane c < k takes L[k, c] x_k from its own register k.

Layouts come from the loads and stores (Triton's coalescing): every global access is indexed
lane-wise by the column axis, so the loop keeps the column-per-lane layout; a value indexed by
the row axis at a load or store would pull the solve into a row-across-lanes layout with a
conversion in every step. Checked on sm90 PTX/SASS (Triton 3.6, ptxas): potrf fp32 n=32 at
P=1 has no shuffle, one barrier per pivot and 496 FMAs of update (n(n-1)/2), about 2000 SASS
instructions, 192 registers, no spill; posv fp32 n=32 about 2600 SASS instructions, 162
registers; posv fp64 n=32 196 registers, no spill.
"""
import triton
import triton.language as tl



@triton.jit
def _lane_load(A, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, COLS: tl.constexpr):
    """The mirrored symmetric tile t[c, p, r] = A[max(r, c), min(r, c)] and its indices."""
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    c = tl.arange(0, NP)[:, None, None]
    pp = p[None, :, None]
    r = tl.arange(0, NP)[None, None, :]
    ok = (pp < batch) & (r < N) & (c < N)
    # contiguous along a row for COLS (the columns each lane holds) only: with 16-byte aligned
    # pointers the coalescing pass would otherwise vectorise the load up to 16 bytes of a row
    # (at fp32 n=4 a whole row per thread, rows across lanes), and Triton 3.6's
    # TritonGPURemoveLayoutConversions then emits a use before its definition in posv
    # ("operand #0 does not dominate this use", PassManager::run failed on the H200). A vector
    # of the lane's own columns is the layout the loop wants anyway: on sm90 SASS it shortens
    # posv's one-column kernels (fp32 n=32 4176 -> 2608 instructions) and leaves potrf's as they
    # were (tests/unit/test_linalg_compile_sm90.py compiles every config)
    low = tl.load(A + tl.max_contiguous(pp * (N * N) + r * N + c, [COLS, 1, 1]), mask=ok & (r >= c), other=0)
    t = tl.where(r >= c, low, tl.permute(low, (2, 1, 0)))
    return p, pp, r, c, t


@triton.jit
def _sqrt_rsqrt(d):
    """(sqrt(d), 1 / sqrt(d)) from the hardware reciprocal square root and Newton steps in
    d's precision: within an ulp or two of the IEEE pair (the residual gate checks the result)
    in a handful of instructions, where the IEEE square root and division take about twenty
    with a slow-path branch, on the critical path of every pivot step."""
    y = tl.math.rsqrt(d)  # rsqrt.approx: about 2^-23 relative error, in fp64 too
    y = y + 0.5 * y * (1 - d * y * y)
    if d.dtype == tl.float64:
        y = y + 0.5 * y * (1 - d * y * y)  # a second step (the error squares each time)
    s = d * y
    return s + 0.5 * y * (d - s * s), y  # one correction of the root itself (off the chain)


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
        sj, ij = _sqrt_rsqrt(tl.where(bad, 1, d))
        s = tl.where(c == j, sj, s)
        inv = tl.where(c == j, ij, inv)
        # t[r, c] -= t[r, j] t[j, c] / d for r, c > j; c <= j (finished columns) take a zero
        right = tl.where(c > j, rowj[:, :, None] * (ij * ij), 0)
        t = tl.where(r > j, t - colj * right, t)
        if SOLVE:
            # lane c holds y_c; z_j = y_j / s_j reaches every lane through a transpose of y like
            # row j's (only its entry j is used), and lane c > j takes L[c, j] z_j with L[c, j]
            # = t[j, c] / s_j, its own register j
            yr = tl.trans(tl.reshape(y, (NP, P)))[None, :, :]  # [1, P, NP]
            zj = tl.sum(tl.where(r == j, yr, 0), axis=2)[:, :, None] * ij  # [1, P, 1]
            y = tl.where(c > j, y - rowj[:, :, None] * (ij * zj), tl.where(c == j, zj, y))
    return t, s, inv, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_lane(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, COLS: tl.constexpr):
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, COLS)
    t, s, inv, info, _ = _lane_chol(t, r, c, t, N, NP, P, False)
    out = tl.where(r > c, t * inv, tl.where(r == c, s, 0))
    ok = (pp < batch) & (r < N) & (c < N)
    tl.store(L + pp * (N * N) + r * N + c, out, mask=ok)
    tl.store(INFO + pp, info, mask=pp < batch)


@triton.jit(do_not_specialize=["batch"])
def posv_lane(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, COLS: tl.constexpr):
    """A x = b: factor with the forward solve fused (z in every lane), then L^T x = z by rows of
    L with x spread across the lanes (lane c holds x_c)."""
    p, pp, r, c, t = _lane_load(A, batch, N, NP, P, COLS)
    # b lane-wise, as the tile's columns lie: lane c holds b_c, then z_c (= L^-1 b), then x_c
    w = tl.load(B + pp * N + c, mask=(pp < batch) & (c < N), other=0)  # [NP, P, 1]
    t, s, inv, info, w = _lane_chol(t, r, c, w, N, NP, P, True)
    for kk in tl.static_range(N):
        k = N - 1 - kk
        # x_k = z_k / s_k (lane k's, handed to all); then lane c < k: z_c -= L[k, c] x_k, with
        # L[k, c] = t[k, c] / s_c its own register k
        xk = tl.sum(tl.where(c == k, w * inv, 0), axis=0)[None, :, :]  # [1, P, 1]
        lk = tl.sum(tl.where(r == k, t, 0), axis=2)[:, :, None]  # [NP, P, 1]
        w = tl.where(c < k, w - lk * inv * xk, tl.where(c == k, xk, w))
    tl.store(X + pp * N + c, w, mask=(pp < batch) & (c < N))
    tl.store(INFO + pp, info, mask=pp < batch)
