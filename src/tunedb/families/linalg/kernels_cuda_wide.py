"""The CUDA tier's wide-warp kernel (`cudaw_p{P}_w{W}`): potrf and posv for 17 <= n <= 64, lane i
of a problem holding rows i and L + i, where L = 32 lanes a problem past n = 32 (one problem a
warp, P = W) and L = 16 from n = 17 to 32 (two problems a warp, P = 2 W).

Why: the block kernel (kernels_cuda_src.BLOCK) gives a problem 64 threads of a row each, joined by
one __syncthreads a pivot. Nsight Compute on the H200 (session 23, `bench/linalg_ncu.sh`, potrf
fp32 n = 64): 168 registers a thread, so 6 problems an SM; IPC 2.17 with a fifth of the stalls
waiting for instructions; two thirds of the row updates fall on finished rows or the upper
triangle. The warp kernel (kernels_cuda_src.WARP, a row a lane to n = 32) spends half of its
updates on finished rows too. Here a problem's L lanes carry it with no block barrier:

  - lane i keeps row i's lower triangle (columns < L: `r0`) and row L + i (`r1`), so the update of
    pivot k costs (L - 1 - k)^+ + (n - 1 - k) FMAs a lane, and the registers a row thread spent on
    bookkeeping serve two rows;
  - the pivot reaches the problem's lanes by one shuffle; the column goes through a per-problem
    double-buffered buffer with one __syncwarp a pivot, read back as 16-byte broadcasts (as the
    warp kernel); pivot k + 1 is shuffled and its rsqrt taken before pivot k's column goes
    through shared memory (the warp kernel's pipelining);
  - posv fuses the forward solve (the pivot lane publishes z_k where l_kk would go) and solves
    L^T x = z from the bottom, x_k handed on by one shuffle a step, L's rows read from the stage.

Memory: each warp stages L rows of each of its problems at a time through shared memory (rows
padded to n + 1), coalesced: rows 0..L-1 at columns 0..L-1 (the block holding their lower
triangle; the upper entries it brings are never read), then rows L..n-1 whole; potrf writes L
(zeros above the diagonal) back the same way. A warp's missing problems (the batch's tail) read
as the identity and are never written. Every input is read
before any output is written and warps own disjoint problems, so OUT may alias A (potrf) or B
(posv).
"""
from __future__ import annotations

import re

from tunedb.families.linalg.kernels_cuda_tile import cell_reason

PREFIX = "cudaw"
OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
MIN_N, MAX_N = 17, 64
WARPS = (1, 2, 4)
STATIC_SMEM = 48 * 1024
_ITEM = {"fp32": 4, "fp64": 8}
_ID = re.compile(r"cudaw_p([1-9][0-9]*)_w([1-9][0-9]*)")


def lanes(n: int) -> int:
    """Lanes a problem (L): 32 past n = 32, else 16."""
    return 32 if n > 32 else 16


def config_id(problems: int, warps: int) -> str:
    return f"{PREFIX}_p{problems}_w{warps}"


def parse(config_id_: str) -> tuple[int, int] | None:
    """(P, W) of `cudaw_p{P}_w{W}` (canonical: no leading zeros), or None for any other id."""
    match = _ID.fullmatch(config_id_)
    return (int(match.group(1)), int(match.group(2))) if match else None


def ids_at(n: int) -> tuple[str, ...]:
    """The kernel's ids at n (any op, dtype): W warps of 32 / L problems each."""
    return tuple(config_id(w * (32 // lanes(n)), w) for w in WARPS)


def smem_bytes(n: int, dtype: str, warps: int) -> int:
    """Static shared memory a block: a 32-row stage and a double-buffered 64-entry column a warp."""
    return warps * (32 * (n + 1) + 2 * 64) * _ITEM.get(dtype, 8)


def invalid_reason(op: str, problems: int, warps: int, n: int, dtype: str) -> str | None:
    """Why `cudaw_p{problems}_w{warps}` cannot run op at (n, dtype), judged on the shape alone, or None."""
    cid = config_id(problems, warps)
    why = cell_reason(cid, op, OPS, dtype, DTYPES, n, MIN_N, MAX_N)
    if why:
        return why
    if warps not in WARPS:
        return f"{cid}: warps a block must be one of {WARPS}, got {warps}"
    per = 32 // lanes(n)
    if problems != warps * per:
        return (f"{cid}: a warp carries {per} problem{'s' if per > 1 else ''} at n={n} "
                f"({lanes(n)} lanes each), so P must be {warps * per} at {warps} warps, got P={problems}")
    need = smem_bytes(n, dtype, warps)
    if need > STATIC_SMEM:
        return f"{cid} at n={n} {dtype} needs {need} B of static shared memory a block (at most {STATIC_SMEM})"
    return None


def defines(op: str, n: int, dtype: str, warps: int) -> dict[str, int]:
    return {"N": n, "L": lanes(n), "WARPS": warps, "DOUBLE": int(dtype == "fp64"), "POSV": int(op == "posv"),
            "PIPE": 1}


SOURCE = r"""
#define G (32 / L)    // problems a warp
#define R1 (N - L)    // rows held in r1: lanes i < R1 of a problem
#define FULL 0xffffffffu

#if POSV && !DOUBLE && N > 56  // at most 168 registers: 12 warps an SM (session 23 C at n = 64: posv 1.06-1.12x; potrf lost, 0.79-0.84x)
extern "C" __global__ void __launch_bounds__(WARPS * 32, 12 / WARPS)
#else
extern "C" __global__ void __launch_bounds__(WARPS * 32)
#endif
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ T stage[WARPS][32 * ST];  // G problems a warp, L rows of each
  __shared__ __align__(16) T colbuf[WARPS][2][64];  // 2 L entries a problem
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long p0 = ((long long)blockIdx.x * WARPS + warp) * G;
  if (p0 >= batch) return;  // uniform across the warp; no block barrier below
  // one problem a warp (G == 1) folds every per-problem index and guard below to a constant
  const int q = G == 1 ? 0 : lane / L, i = G == 1 ? lane : lane % L, base = q * L;
  const long long p = p0 + q;
  const int nprob = G == 1 ? 1 : (int)min((long long)G, (long long)batch - p0);
  const bool live = G == 1 || q < nprob, live1 = i < R1;
  T* sw = stage[warp];
  T* sq = sw + q * L * ST;  // this lane's problem's part of the stage
  const T* Ag = A + p0 * PER;
#if POSV
  T b0 = live ? B[p * N + i] : T(0);
  T b1 = live && live1 ? B[p * N + L + i] : T(0);
#endif
  T r0[N], r1[N];  // r0: row i at columns < L (only those are used); r1: row L + i
  // rows 0..L-1 at columns 0..L-1 (the block holding their lower triangle), coalesced; a missing problem reads as I
#pragma unroll
  for (int m = 0; m < L; ++m) sq[m * ST + i] = live ? Ag[q * PER + m * N + i] : T(m == i);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < L; ++j) r0[j] = sq[i * ST + j];
  __syncwarp();
  // rows L..N-1 whole: element e = lane + 32 m of the warp's G blocks of R1 x N
#pragma unroll
  for (int m = 0; m < (G * R1 * N + 31) / 32; ++m) {
    const int e = lane + 32 * m;
    if (e < G * R1 * N) {
      const int qq = G == 1 ? 0 : e / (R1 * N), rem = e - qq * (R1 * N), row = rem / N, c = rem - row * N;
      sw[qq * L * ST + row * ST + c] = G == 1 || qq < nprob ? Ag[qq * PER + L * N + rem] : T(row + L == c);
    }
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < N; ++j) r1[j] = live1 ? sq[i * ST + j] : T(0);
  int info = 0;
  T rinv0 = T(1), rinv1 = T(1);
  T akk = __shfl_sync(FULL, r0[0], base);
  if (!(akk > T(0))) { info = 1; akk = T(1); }
  T rs = rsqrt_t(akk);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    T l0 = T(0);
    if (k < L) {
      l0 = r0[k] * rs;  // on lane k: a_kk * rsqrt(a_kk) = l_kk
      r0[k] = l0;
      if (i == k) rinv0 = rs;
    } else if (i == k - L) {
      rinv1 = rs;
    }
    const T l1 = r1[k] * rs;
    r1[k] = l1;
    // pivot k + 1 before this column goes through shared memory: its owner updates its own
    // diagonal with its own l (the value the column buffer would hand it, bit for bit)
    T rs_next = T(1);
    if (k + 1 < N) {
      const T v = (k + 1 < L) ? r0[k + 1] - l0 * l0 : r1[k + 1] - l1 * l1;
      T d = __shfl_sync(FULL, v, base + ((k + 1 < L) ? k + 1 : k + 1 - L));
      if (!(d > T(0))) {
        if (info == 0) info = k + 2;
        d = T(1);
      }
      rs_next = rsqrt_t(d);
    }
    T* c = colbuf[warp][k & 1] + q * 2 * L;  // c[j] = l_jk; the pivot's own slot carries z_k for posv
    if (k < L) {
#if POSV
      const T z = b0 * rs;
      if (i == k) b0 = z;
      c[i] = i == k ? z : l0;
#else
      c[i] = l0;
#endif
      c[L + i] = l1;
    } else {
#if POSV
      const T z = b1 * rs;
      if (i == k - L) b1 = z;
      c[L + i] = i == k - L ? z : l1;
#else
      c[L + i] = l1;
#endif
    }
    __syncwarp();
#if POSV
    {
      const T zk = c[k];
      if (k < L && i > k) b0 -= l0 * zk;
      if (L + i > k) b1 -= l1 * zk;
    }
#endif
#pragma unroll
    for (int v = (k + 1) / VEC; v < (N + VEC - 1) / VEC; ++v) {
      const V w = *reinterpret_cast<const V*>(c + v * VEC);
      const T* wp = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int t = 0; t < VEC; ++t) {
        const int j = v * VEC + t;
        if (j > k && j < N) {
          if (j < L) r0[j] -= l0 * wp[t];
          r1[j] -= l1 * wp[t];
        }
      }
    }
    rs = rs_next;
  }
#if POSV
  // L^T x = z from the bottom: rows L..N-1 of L through the stage, then rows 0..L-1
  __syncwarp();
  if (live1) {
#pragma unroll
    for (int j = 0; j < N; ++j) sq[i * ST + j] = r1[j];
  }
  __syncwarp();
#pragma unroll
  for (int k = N - 1; k >= L; --k) {
    const T xk = __shfl_sync(FULL, b1 * rinv1, base + k - L);
    b0 -= sq[(k - L) * ST + i] * xk;
    if (L + i < k) b1 -= sq[(k - L) * ST + L + i] * xk;
    if (L + i == k) b1 = xk;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < L; ++j) sq[i * ST + j] = r0[j];
  __syncwarp();
#pragma unroll
  for (int k = L - 1; k >= 0; --k) {
    const T xk = __shfl_sync(FULL, b0 * rinv0, base + k);
    if (i < k) b0 -= sq[k * ST + i] * xk;
    if (i == k) b0 = xk;
  }
  if (live) {
    OUT[p * N + i] = b0;
    if (live1) OUT[p * N + L + i] = b1;
  }
#else
  // L with zeros above the diagonal, L rows of each problem at a time through the stage, coalesced
  T* Og = OUT + p0 * PER;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < L; ++j) sq[i * ST + j] = j <= i ? r0[j] : T(0);
  __syncwarp();
#pragma unroll 4
  for (int m = 0; m < G * L * N / 32; ++m) {  // rows 0..L-1 of each problem, all N columns
    const int e = lane + 32 * m, qq = G == 1 ? 0 : e / (L * N), rem = e - qq * (L * N), row = rem / N,
              cc = rem - row * N;
    if (G == 1 || qq < nprob) Og[qq * PER + rem] = cc < L ? sw[qq * L * ST + row * ST + cc] : T(0);
  }
  __syncwarp();
  if (live1) {
#pragma unroll
    for (int j = 0; j < N; ++j) sq[i * ST + j] = j <= L + i ? r1[j] : T(0);
  }
  __syncwarp();
#pragma unroll 4
  for (int m = 0; m < (G * R1 * N + 31) / 32; ++m) {
    const int e = lane + 32 * m;
    if (e < G * R1 * N) {
      const int qq = G == 1 ? 0 : e / (R1 * N), rem = e - qq * (R1 * N), row = rem / N, cc = rem - row * N;
      if (G == 1 || qq < nprob) Og[qq * PER + L * N + rem] = sw[qq * L * ST + row * ST + cc];
    }
  }
#endif
  if (i == 0 && live) INFO[p] = info;
}
"""
