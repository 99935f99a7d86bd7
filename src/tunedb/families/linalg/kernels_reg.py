"""Register packing of potrf/posv: one problem per thread, its whole lower triangle in registers.

A program carries P = 32 * num_warps * k problems as a [P, NP(rows), NP(cols)] tile whose
problem axis lies across the lanes and warps and whose two matrix axes lie inside each thread.
The factorisation is unrolled over the pivot (`tl.static_range`), so every row and column mask
is a compile-time constant per register: extracting column j, the pivot or a vector entry is a
register pick, the rank-1 update issues FMAs only for the trailing lower triangle (n^3 / 6 per
problem, none on the upper half or on finished columns), and nothing crosses a lane: no
shuffle, no barrier, no shared memory in the factorisation or the solves. That is the point at
n = 8..16, where the lane packing (kernels_lane.py) issues every step's update in every lane of
a problem (the columns left of the pivot idle) and pays a cross-lane transpose per pivot, and
posv's back substitution a butterfly reduction per step: here a warp's 32 problems share each
instruction. The price is registers (n(n+1)/2 values per problem: the validity predicate bounds
it, so n stops at 16 in fp32 and below that in fp64) and uncoalesced loads (lane p reads
problem p: each load instruction touches 32 sectors, the rest of each sector is read from L1
by the next loads).

The layout comes from the load: its offsets are declared non-contiguous (`tl.max_contiguous`
1 on every axis), so the coalescing pass keeps the axes in their given order and puts the lanes
on the first, the problem axis, one element per thread per register (checked on sm90 SASS of
Triton 3.6: no shuffle, barrier or shared memory at one problem per thread). The stores keep that layout too:
potrf's L through a coalesced layout would stage the whole tile in shared memory and, at n=16,
spill (255 registers + 60 bytes); thread-per-problem stores write 4 or 8 bytes of 32 sectors per
instruction instead, which L2 merges (the ladder measures what that costs).

Pivots as in kernels_lane.py: the square root and its reciprocal from rsqrt and Newton steps;
a pivot that is not positive (or NaN) sets info to the first such column (1-based) and is
replaced by 1, so nothing loops on data and the other problems are untouched. Reductions that
pick one register add -0.0 for the rest (x + -0.0 is x for every x, so the compiler may drop
those adds; with +0.0 it may not, -0.0 + 0.0 being +0.0).
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_lane import _sqrt_rsqrt


@triton.jit
def _reg_load(A, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """The lower triangle t[p, r, c] = A[p, r, c] (r >= c; zeros above) and its indices."""
    p = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    pp = p[:, None, None]
    r = tl.arange(0, NP)[None, :, None]
    c = tl.arange(0, NP)[None, None, :]
    # contiguity 1 on every axis: the coalescing pass then gives the lanes to the problem axis
    offs = tl.max_contiguous(pp * (N * N) + r * N + c, [1, 1, 1])
    t = tl.load(A + offs, mask=(pp < batch) & (r < N) & (c <= r), other=0)
    return p, pp, r, c, t


@triton.jit
def _reg_chol(t, r, c, y, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr, SOLVE: tl.constexpr):
    """Unrolled right-looking Cholesky of the lower tile t into L; with SOLVE, y = L^-1 y.

    Returns (t, inv, info, y): inv [P, NP] holds each column's pivot reciprocal 1 / L[j, j]."""
    rv = tl.arange(0, NP)[None, :]  # [1, NP]: the row index of a [P, NP] column vector
    info = tl.zeros([P], tl.int32)
    inv = tl.zeros([P, NP], t.dtype)
    for j in tl.static_range(N):
        col = tl.sum(tl.where(c == j, t, -0.0), axis=2)  # [P, NP]: t[:, j]
        d = tl.sum(tl.where(rv == j, col, -0.0), axis=1)  # [P]: the pivot t[j, j]
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        sj, ij = _sqrt_rsqrt(tl.where(bad, 1, d))
        inv = tl.where(rv == j, ij[:, None], inv)
        lj = col * ij[:, None]  # rows > j: L[:, j]
        # trailing lower triangle: t[r, c] -= L[r, j] L[c, j] for r >= c > j (compile-time masks)
        upd = (r > j) & (c > j) & (r >= c)
        t = tl.where(upd, t - lj[:, :, None] * lj[:, None, :], t)
        t = tl.where((c == j) & (r > j), lj[:, :, None], tl.where((c == j) & (r == j), sj[:, None, None], t))
        if SOLVE:
            zj = tl.sum(tl.where(rv == j, y, -0.0), axis=1) * ij  # [P]
            y = tl.where(rv == j, zj[:, None], tl.where(rv > j, y - lj * zj[:, None], y))
    return t, inv, info, y


@triton.jit(do_not_specialize=["batch"])
def potrf_reg(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    p, pp, r, c, t = _reg_load(A, batch, N, NP, P)
    t, _, info, _ = _reg_chol(t, r, c, t, N, NP, P, False)
    tl.store(L + tl.max_contiguous(pp * (N * N) + r * N + c, [1, 1, 1]), t, mask=(pp < batch) & (r < N) & (c < N))
    tl.store(INFO + p, info, mask=p < batch)


@triton.jit(do_not_specialize=["batch"])
def posv_reg(A, B, X, INFO, batch, N: tl.constexpr, NP: tl.constexpr, P: tl.constexpr):
    """A x = b: factor with the forward solve fused, then L^T x = z by rows of L, all in the
    thread that holds the problem."""
    p, pp, r, c, t = _reg_load(A, batch, N, NP, P)
    rv = tl.arange(0, NP)[None, :]
    pv = p[:, None]
    okv = (pv < batch) & (rv < N)
    y = tl.load(B + tl.max_contiguous(pv * N + rv, [1, 1]), mask=okv, other=0)  # [P, NP]
    t, inv, info, y = _reg_chol(t, r, c, y, N, NP, P, True)
    for kk in tl.static_range(N):
        k = N - 1 - kk
        xk = tl.sum(tl.where(rv == k, y * inv, -0.0), axis=1)  # [P]: x_k = z_k / L[k, k]
        lk = tl.sum(tl.where(r == k, t, -0.0), axis=1)  # [P, NP(cols)]: L[k, :]
        y = tl.where(rv == k, xk[:, None], tl.where(rv < k, y - lk * xk[:, None], y))
    tl.store(X + tl.max_contiguous(pv * N + rv, [1, 1]), y, mask=okv)
    tl.store(INFO + p, info, mask=p < batch)
