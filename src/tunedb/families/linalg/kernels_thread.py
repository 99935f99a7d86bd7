"""Thread packing: each lane carries one problem and walks it sequentially along n.

A program holds P problems as [P] vectors (P >= 32*num_warps, so no lane is replicated: the
validity predicate enforces it). The working set lives in the output buffer, which a lane
re-reads right after writing it (same thread, same address: ordered without a barrier; the
lines stay in L1). Problem offsets are int64 (batch * n * n may pass 2**31).

Contracts shared with kernels_tile.py: potrf reads only the lower triangle of A, writes the
full L (zeros above the diagonal) and info (0, or the 1-based first column whose pivot is not
positive or is NaN; that pivot is replaced by 1 so the rest stays finite and nothing hangs).
"""
import triton
import triton.language as tl


# IEEE-rounded sqrt and division in fp32 too: Triton's defaults there are sqrt.approx.ftz and
# div.full (up to 2 ulp), which would put the factorisations' residuals above torch's.
@triton.jit
def sqrt_ieee(x):
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def div_ieee(x, y):
    if x.dtype == tl.float32:
        return tl.div_rn(x, y)
    else:
        return x / y


@triton.jit
def _problems(batch, P: tl.constexpr):
    prob = tl.program_id(0).to(tl.int64) * P + tl.arange(0, P).to(tl.int64)
    return prob, prob < batch


@triton.jit(do_not_specialize=["batch"])
def dot_thread(X, Y, OUT, batch, N: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    prob, ok = _problems(batch, P)
    base = prob * N
    acc = tl.zeros([P], ACC)
    for k in range(N):
        x = tl.load(X + base + k, mask=ok, other=0).to(ACC)
        y = tl.load(Y + base + k, mask=ok, other=0).to(ACC)
        acc += x * y
    tl.store(OUT + prob, acc.to(OUT.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["batch"])
def gemv_thread(A, X, OUT, batch, N: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    prob, ok = _problems(batch, P)
    abase = prob * (N * N)
    vbase = prob * N
    for i in range(N):
        acc = tl.zeros([P], ACC)
        for k in range(N):
            a = tl.load(A + abase + i * N + k, mask=ok, other=0).to(ACC)
            x = tl.load(X + vbase + k, mask=ok, other=0).to(ACC)
            acc += a * x
        tl.store(OUT + vbase + i, acc.to(OUT.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["batch"])
def gemm_thread(A, B, OUT, batch, N: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    prob, ok = _problems(batch, P)
    base = prob * (N * N)
    for i in range(N):
        for j in range(N):
            acc = tl.zeros([P], ACC)
            for k in range(N):
                a = tl.load(A + base + i * N + k, mask=ok, other=0).to(ACC)
                b = tl.load(B + base + k * N + j, mask=ok, other=0).to(ACC)
                acc += a * b
            tl.store(OUT + base + i * N + j, acc.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _chol_lanes(A, L, base, ok, N: tl.constexpr, P: tl.constexpr):
    """Left-looking Cholesky of each lane's problem into L (L may alias A); returns info."""
    info = tl.zeros([P], tl.int32)
    for j in range(N):
        d = tl.load(A + base + j * N + j, mask=ok, other=1)
        for k in range(j):
            v = tl.load(L + base + j * N + k, mask=ok, other=0)
            d -= v * v
        bad = (d <= 0) | (d != d)
        info = tl.where(bad & (info == 0), j + 1, info)
        s = sqrt_ieee(tl.where(bad, 1, d))
        tl.store(L + base + j * N + j, s, mask=ok)
        for i in range(j + 1, N):
            v = tl.load(A + base + i * N + j, mask=ok, other=0)
            for k in range(j):
                v -= tl.load(L + base + i * N + k, mask=ok, other=0) * tl.load(L + base + j * N + k, mask=ok, other=0)
            tl.store(L + base + i * N + j, div_ieee(v, s), mask=ok)
    return info


@triton.jit(do_not_specialize=["batch"])
def potrf_thread(A, L, INFO, batch, N: tl.constexpr, P: tl.constexpr):
    prob, ok = _problems(batch, P)
    base = prob * (N * N)
    info = _chol_lanes(A, L, base, ok, N, P)
    zero = tl.zeros([P], L.dtype.element_ty)
    for i in range(N):
        for j in range(i + 1, N):
            tl.store(L + base + i * N + j, zero, mask=ok)
    tl.store(INFO + prob, info, mask=ok)


@triton.jit
def _forward_lanes(L, B, X, base, vbase, ok, N: tl.constexpr):
    """x = L^-1 b by rows; X may alias B (b_i is read before x_i overwrites it)."""
    for i in range(N):
        acc = tl.load(B + vbase + i, mask=ok, other=0)
        for k in range(i):
            acc -= tl.load(L + base + i * N + k, mask=ok, other=0) * tl.load(X + vbase + k, mask=ok, other=0)
        tl.store(X + vbase + i, div_ieee(acc, tl.load(L + base + i * N + i, mask=ok, other=1)), mask=ok)


@triton.jit(do_not_specialize=["batch"])
def trsv_thread(L, B, X, batch, N: tl.constexpr, P: tl.constexpr):
    prob, ok = _problems(batch, P)
    _forward_lanes(L, B, X, prob * (N * N), prob * N, ok, N)


@triton.jit(do_not_specialize=["batch"])
def posv_thread(A, B, X, W, INFO, batch, N: tl.constexpr, P: tl.constexpr):
    """Cholesky into the workspace W (may alias A), then L y = b and L^T x = y in X (may alias B)."""
    prob, ok = _problems(batch, P)
    base = prob * (N * N)
    vbase = prob * N
    info = _chol_lanes(A, W, base, ok, N, P)
    _forward_lanes(W, B, X, base, vbase, ok, N)
    for ii in range(N):
        i = N - 1 - ii
        acc = tl.load(X + vbase + i, mask=ok, other=0)
        for k in range(i + 1, N):
            acc -= tl.load(W + base + k * N + i, mask=ok, other=0) * tl.load(X + vbase + k, mask=ok, other=0)
        tl.store(X + vbase + i, div_ieee(acc, tl.load(W + base + i * N + i, mask=ok, other=1)), mask=ok)
    tl.store(INFO + prob, info, mask=ok)
