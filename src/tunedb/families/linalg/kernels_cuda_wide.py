"""The CUDA tier's wide-warp kernel (`cudaw_p{W}_w{W}`): potrf and posv for 33 <= n <= 64, one
problem a warp (W problems a block of W warps), lane i holding rows i and i + 32.

Why: the block kernel (kernels_cuda_src.BLOCK) gives a problem 64 threads of a row each, joined by
one __syncthreads a pivot. Nsight Compute on the H200 (session 23, `bench/linalg_ncu.sh`, potrf
fp32 n = 64): 168 registers a thread, so 6 problems an SM; IPC 2.17 with a fifth of the stalls
waiting for instructions; two thirds of the row updates fall on finished rows or the upper
triangle. Here one warp carries the problem with no block barrier:

  - lane i keeps row i's lower triangle (columns < 32: `r0`) and row i + 32 (`r1`), so the update
    of pivot k costs (31 - k)^+ + (n - 1 - k) FMAs a lane, not 2 (n - 1 - k) on two threads, and
    the registers that a row thread spent on bookkeeping serve two rows;
  - the pivot reaches every lane by one shuffle; the column goes through a per-warp
    double-buffered buffer with one __syncwarp a pivot, read back as 16-byte broadcasts (as the
    warp kernel, kernels_cuda_src.WARP); pivot k + 1 is shuffled and its rsqrt taken before
    pivot k's column goes through shared memory (the warp kernel's pipelining);
  - posv fuses the forward solve (the pivot lane publishes z_k where l_kk would go) and solves
    L^T x = z from the bottom, x_k handed on by one shuffle a step, L's rows read from the stage.

Memory: each warp stages 32 rows at a time through shared memory (rows padded to n + 1),
coalesced: rows 0..31 in columns 0..31 only (their lower triangle), rows 32..n-1 whole; potrf
writes L (zeros above the diagonal) back the same way. Every input is read before any output is
written and warps own disjoint problems, so OUT may alias A (potrf) or B (posv).
"""
from __future__ import annotations

import re

PREFIX = "cudaw"
OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
MIN_N, MAX_N = 33, 64
WARPS = (1, 2, 4)
STATIC_SMEM = 48 * 1024
_ITEM = {"fp32": 4, "fp64": 8}
_ID = re.compile(r"cudaw_p([1-9][0-9]*)_w([1-9][0-9]*)")


def config_id(warps: int) -> str:
    return f"{PREFIX}_p{warps}_w{warps}"


def parse(config_id_: str) -> int | None:
    """W of `cudaw_p{W}_w{W}` (canonical: P == W, no leading zeros), or None for any other id."""
    match = _ID.fullmatch(config_id_)
    if match is None or match.group(1) != match.group(2):
        return None
    return int(match.group(2))


def smem_bytes(n: int, dtype: str, warps: int) -> int:
    """Static shared memory a block: a 32-row stage and a double-buffered 64-entry column a warp."""
    return warps * (32 * (n + 1) + 2 * 64) * _ITEM.get(dtype, 8)


def invalid_reason(op: str, warps: int, n: int, dtype: str) -> str | None:
    """Why `cudaw_p{warps}_w{warps}` cannot run op at (n, dtype), judged on the shape alone, or None."""
    cid = config_id(warps)
    if op not in OPS:
        return f"{cid} runs {', '.join(OPS)} only, not {op}"
    if dtype not in DTYPES:
        return f"{cid} runs {', '.join(DTYPES)} only, not {dtype}"
    if not isinstance(n, int) or not MIN_N <= n <= MAX_N:
        return f"{cid} takes n in {MIN_N}..{MAX_N}, got n={n!r}"
    if warps not in WARPS:
        return f"{cid}: warps (problems) a block must be one of {WARPS}, got {warps}"
    need = smem_bytes(n, dtype, warps)
    if need > STATIC_SMEM:
        return f"{cid} at n={n} {dtype} needs {need} B of static shared memory a block (at most {STATIC_SMEM})"
    return None


def defines(op: str, n: int, dtype: str, warps: int) -> dict[str, int]:
    return {"N": n, "WARPS": warps, "DOUBLE": int(dtype == "fp64"), "POSV": int(op == "posv"), "PIPE": 1}


SOURCE = r"""
#define R1 (N - 32)  // rows held in r1: lanes i < R1
#define FULL 0xffffffffu

#if POSV && !DOUBLE && N > 56  // at most 168 registers: 12 warps an SM (session 23 C at n = 64: posv 1.06-1.12x; potrf lost, 0.79-0.84x)
extern "C" __global__ void __launch_bounds__(WARPS * 32, 12 / WARPS)
#else
extern "C" __global__ void __launch_bounds__(WARPS * 32)
#endif
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ T stage[WARPS][32 * ST];
  __shared__ __align__(16) T colbuf[WARPS][2][64];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long p = (long long)blockIdx.x * WARPS + warp;
  if (p >= batch) return;  // uniform across the warp; no block barrier below
  T* sw = stage[warp];
  const T* Ag = A + p * PER;
  const bool live1 = lane < R1;
#if POSV
  T b0 = B[p * N + lane];
  T b1 = live1 ? B[p * N + 32 + lane] : T(0);
#endif
  T r0[N], r1[N];  // r0: row lane at columns < 32 (only those are used); r1: row lane + 32
  // rows 0..31 at columns 0..31 (lane = column), coalesced; then rows 32..N-1 whole
#pragma unroll
  for (int m = 0; m < 32; ++m) sw[m * ST + lane] = Ag[m * N + lane];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 32; ++j) r0[j] = sw[lane * ST + j];
  __syncwarp();
#pragma unroll
  for (int m = 0; m < (R1 * N + 31) / 32; ++m) {  // element e = lane + 32 m of rows 32..N-1
    const int e = lane + 32 * m;
    if (e < R1 * N) {
      const int row = e / N, c = e - row * N;
      sw[row * ST + c] = Ag[32 * N + e];
    }
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < N; ++j) r1[j] = live1 ? sw[lane * ST + j] : T(0);
  int info = 0;
  T rinv0 = T(1), rinv1 = T(1);
  T akk = __shfl_sync(FULL, r0[0], 0);
  if (!(akk > T(0))) { info = 1; akk = T(1); }
  T rs = rsqrt_t(akk);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    T l0 = T(0);
    if (k < 32) {
      l0 = r0[k] * rs;  // on lane k: a_kk * rsqrt(a_kk) = l_kk
      r0[k] = l0;
      if (lane == k) rinv0 = rs;
    } else if (lane == k - 32) {
      rinv1 = rs;
    }
    const T l1 = r1[k] * rs;
    r1[k] = l1;
    // pivot k + 1 before this column goes through shared memory: its owner updates its own
    // diagonal with its own l (the value the column buffer would hand it, bit for bit)
    T rs_next = T(1);
    if (k + 1 < N) {
      const T v = (k + 1 < 32) ? r0[k + 1] - l0 * l0 : r1[k + 1] - l1 * l1;
      T d = __shfl_sync(FULL, v, (k + 1) & 31);
      if (!(d > T(0))) {
        if (info == 0) info = k + 2;
        d = T(1);
      }
      rs_next = rsqrt_t(d);
    }
    T* c = colbuf[warp][k & 1];  // c[j] = l_jk; the pivot's own slot carries z_k for posv
    if (k < 32) {
#if POSV
      const T z = b0 * rs;
      if (lane == k) b0 = z;
      c[lane] = lane == k ? z : l0;
#else
      c[lane] = l0;
#endif
      c[32 + lane] = l1;
    } else {
#if POSV
      const T z = b1 * rs;
      if (lane == k - 32) b1 = z;
      c[32 + lane] = lane == k - 32 ? z : l1;
#else
      c[32 + lane] = l1;
#endif
    }
    __syncwarp();
#if POSV
    {
      const T zk = c[k];
      if (k < 32 && lane > k) b0 -= l0 * zk;
      if (lane + 32 > k) b1 -= l1 * zk;
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
          if (j < 32) r0[j] -= l0 * wp[t];
          r1[j] -= l1 * wp[t];
        }
      }
    }
    rs = rs_next;
  }
#if POSV
  // L^T x = z from the bottom: rows 32..N-1 of L through the stage, then rows 0..31
  __syncwarp();
  if (live1) {
#pragma unroll
    for (int j = 0; j < N; ++j) sw[lane * ST + j] = r1[j];
  }
  __syncwarp();
#pragma unroll
  for (int k = N - 1; k >= 32; --k) {
    const T xk = __shfl_sync(FULL, b1 * rinv1, k - 32);
    b0 -= sw[(k - 32) * ST + lane] * xk;
    if (lane + 32 < k) b1 -= sw[(k - 32) * ST + 32 + lane] * xk;
    if (lane + 32 == k) b1 = xk;
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 32; ++j) sw[lane * ST + j] = r0[j];
  __syncwarp();
#pragma unroll
  for (int k = 31; k >= 0; --k) {
    const T xk = __shfl_sync(FULL, b0 * rinv0, k);
    if (lane < k) b0 -= sw[k * ST + lane] * xk;
    if (lane == k) b0 = xk;
  }
  OUT[p * N + lane] = b0;
  if (live1) OUT[p * N + 32 + lane] = b1;
#else
  // L with zeros above the diagonal, 32 rows at a time through the stage, coalesced
  T* Og = OUT + p * PER;
  __syncwarp();
#pragma unroll
  for (int j = 0; j < 32; ++j) sw[lane * ST + j] = j <= lane ? r0[j] : T(0);
  __syncwarp();
#pragma unroll 4
  for (int m = 0; m < N; ++m) {  // rows 0..31, all N columns: element e = lane + 32 m
    const int e = lane + 32 * m, row = e / N, c = e - row * N;
    Og[e] = c < 32 ? sw[row * ST + c] : T(0);
  }
  __syncwarp();
  if (live1) {
#pragma unroll
    for (int j = 0; j < N; ++j) sw[lane * ST + j] = j <= lane + 32 ? r1[j] : T(0);
  }
  __syncwarp();
#pragma unroll 4
  for (int m = 0; m < (R1 * N + 31) / 32; ++m) {
    const int e = lane + 32 * m;
    if (e < R1 * N) {
      const int row = e / N, c = e - row * N;
      Og[32 * N + e] = sw[row * ST + c];
    }
  }
#endif
  if (lane == 0) INFO[p] = info;
}
"""
