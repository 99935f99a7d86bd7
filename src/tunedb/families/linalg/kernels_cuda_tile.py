"""The CUDA tier's tile kernel (`cudat_t{TS}`): potrf, posv and trsv for 33 <= n <= 128, one problem
a block, the lower triangle of the matrix held in registers as TS x TS tiles, one thread a tile.

Why: the row-per-thread block kernel (kernels_cuda_src.BLOCK) stops at n = 64 (a row of 64 in
registers) and spends two thirds of its updates on the upper triangle; the Triton packings at
n = 64/128 stay 3-30x above the memory floor (panel and pdot: a barrier chain per sub-panel and
the diagonal block through memory). Here thread (r, c), c <= r, holds A[r*TS : r*TS+TS,
c*TS : c*TS+TS]; threads are numbered down the tile columns, so the threads whose columns are
finished form a prefix of the block and whole warps fall idle as the factorization moves right.

Per pivot k (right-looking, one __syncthreads):
  - the owners of column k (tile column k / TS) write its entries at rows >= k, not yet scaled,
    into a double-buffered column in shared memory (the buffer of k's parity: the barrier of
    pivot k - 1 already orders this write after every read of pivot k - 2);
  - after the barrier every thread reads the pivot a_kk and takes 1/sqrt itself (a non-positive
    or NaN pivot sets info to k + 1, the first such, and is replaced by 1, as the other arms);
  - each thread right of column k reads its TS rows' and TS columns' entries as broadcasts, scales
    them and updates its tile: TS^2 FMAs for 2 TS shared-memory reads. Which entries of a tile move
    is known at compile time (the pivot's place within its tile column is an unrolled loop), so no
    register is indexed at run time.

posv borders the matrix with b as row n: the factorization of [[A, .], [b^T, .]] leaves
L^{-1} b in that row (the forward solve for free), then L^T x = y is solved by tile rows from
the bottom: the diagonal tile's thread solves its TS unknowns in registers, the threads left of
it in that tile row subtract their products from y in shared memory (two barriers a tile row).
trsv (L x = b, L lower; row-major, or column-major with COLMAJOR as torch.linalg.cholesky
returns it, read as given) runs the same solve forwards. Every input is read before the first
barrier and written after the last, so OUT may alias A (potrf) or B (posv, trsv).
"""
from __future__ import annotations

import re

PREFIX = "cudat"
OPS = ("potrf", "posv", "trsv")
DTYPES = ("fp32", "fp64")
MIN_N, MAX_N = 33, 128
TILES = (2, 4, 8)
MAX_THREADS = 1024
_ID = re.compile(r"cudat_t([1-9][0-9]*)")


def config_id(ts: int) -> str:
    return f"{PREFIX}_t{ts}"


def parse(config_id_: str) -> int | None:
    """TS of `cudat_t{TS}` (canonical: no leading zeros), or None for any other id."""
    match = _ID.fullmatch(config_id_)
    return int(match.group(1)) if match else None


def tiles(op: str, n: int, ts: int) -> tuple[int, int]:
    """(tile rows, tile columns): posv borders the matrix with b as row n."""
    rows = n + (op == "posv")
    return -(-rows // ts), -(-n // ts)


def threads(op: str, n: int, ts: int) -> int:
    """Threads that own a tile: the lower-triangular tiles, c <= r."""
    nr, nc = tiles(op, n, ts)
    return sum(nr - c for c in range(nc))


def smem_bytes(op: str, n: int, dtype: str, ts: int) -> int:
    """Static shared memory a block: the two column buffers and the solve's two vectors."""
    nr, _nc = tiles(op, n, ts)
    return 4 * nr * ts * (8 if dtype == "fp64" else 4) + 4


def cell_reason(cid: str, op: str, ops: tuple, dtype: str, dtypes: tuple, n: int, lo: int, hi: int) -> str | None:
    """The checks every CUDA kernel of one n range shares: the op, the dtype, n in lo..hi."""
    if op not in ops:
        return f"{cid} runs {', '.join(ops)} only, not {op}"
    if dtype not in dtypes:
        return f"{cid} runs {', '.join(dtypes)} only, not {dtype}"
    if not isinstance(n, int) or not lo <= n <= hi:
        return f"{cid} takes n in {lo}..{hi}, got n={n!r}"
    return None


def invalid_reason(op: str, ts: int, n: int, dtype: str) -> str | None:
    """Why `cudat_t{ts}` cannot run op at (n, dtype), judged on the shape alone, or None."""
    cid = config_id(ts)
    why = cell_reason(cid, op, OPS, dtype, DTYPES, n, MIN_N, MAX_N)
    if why:
        return why
    if ts not in TILES:
        return f"{cid}: the tile side must be one of {TILES}, got {ts}"
    need = threads(op, n, ts)
    if need > MAX_THREADS:
        return f"{cid} at n={n} needs {need} threads a block (one a lower tile), more than {MAX_THREADS}"
    return None


def defines(op: str, n: int, dtype: str, ts: int, colmajor: bool = False) -> dict[str, int]:
    nr, nc = tiles(op, n, ts)
    count = threads(op, n, ts)
    return {"N": n, "TS": ts, "NTR": nr, "NTC": nc, "NTHREADS": count, "BLOCKT": -(-count // 32) * 32,
            "DOUBLE": int(dtype == "fp64"), "POSV": int(op == "posv"), "TRSV": int(op == "trsv"),
            "PIPE": 1, "COLMAJOR": int(colmajor and op == "trsv")}


def block_threads(op: str, n: int, ts: int) -> int:
    return -(-threads(op, n, ts) // 32) * 32


SOURCE = r"""
#define NRP (NTR * TS)
#if COLMAJOR
#define AT(i, j) Ag[(long long)(j) * N + (i)]
#else
#define AT(i, j) Ag[(long long)(i) * N + (j)]
#endif

extern "C" __global__ void __launch_bounds__(BLOCKT, 1)
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ int sinfo;  // the first failed pivot's column + 1, set by the diagonal tile's thread
  __shared__ __align__(16) T buf[2][NRP];
  __shared__ __align__(16) T ys[NRP];
  __shared__ __align__(16) T xs[NRP];
  const int t = threadIdx.x;
  const long long p = blockIdx.x;
  if (p >= batch) return;  // uniform across the block
  int r = -1, c = -1;  // threads past the last tile own none (never equal to, never right of, a pivot's column)
  if (t < NTHREADS) {
    int rem = t;
    c = 0;
    while (rem >= NTR - c) { rem -= NTR - c; ++c; }
    r = c + rem;
  }
  const int R0 = r * TS, C0 = c * TS;
  const T* Ag = A + p * (long long)(N * N);
  T a[TS][TS];
  // each thread reads its own tile (the loads independent, all in flight at once), as 16-byte
  // vectors where whole tile rows (columns with COLMAJOR) are aligned, else element by element
#if N % TS == 0 && TS >= VEC && (POSV || TRSV)  // OUT takes x element by element
  const bool vec = ((((size_t)A) | ((size_t)B)) & 15) == 0;
#elif N % TS == 0 && TS >= VEC  // potrf: A read and L written in vectors
  const bool vec = ((((size_t)A) | ((size_t)OUT)) & 15) == 0;
#else
  const bool vec = false;
#endif
  if (vec) {
#pragma unroll
    for (int q = 0; q < TS; ++q)
#pragma unroll
      for (int v = 0; v < TS / VEC; ++v) {
        V w;
        T* wp = reinterpret_cast<T*>(&w);
#pragma unroll
        for (int e = 0; e < VEC; ++e) wp[e] = T(0);
#if COLMAJOR
        const int j = C0 + q, i0 = R0 + v * VEC;  // a tile column: rows i0 .. i0 + VEC - 1
        if (r >= 0 && i0 < N) w = *reinterpret_cast<const V*>(Ag + (long long)j * N + i0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[v * VEC + e][q] = j <= i0 + e ? wp[e] : T(0);
#else
        const int i = R0 + q, j0 = C0 + v * VEC;  // a tile row: columns j0 .. j0 + VEC - 1
        if (r >= 0 && i < N) w = *reinterpret_cast<const V*>(Ag + (long long)i * N + j0);
#if POSV
        else if (r >= 0 && i == N) w = *reinterpret_cast<const V*>(B + p * N + j0);
#endif
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[q][v * VEC + e] = j0 + e <= i ? wp[e] : T(0);
#endif
      }
  } else {
#pragma unroll
    for (int ii = 0; ii < TS; ++ii)
#pragma unroll
      for (int jj = 0; jj < TS; ++jj) {
        const int i = R0 + ii, j = C0 + jj;
        T v = T(0);
        if (r >= 0 && j <= i && j < N) {
          if (i < N) v = AT(i, j);
#if POSV
          else if (i == N) v = B[p * N + j];
#endif
        }
        a[ii][jj] = v;
      }
  }
#if TRSV
  for (int e = t; e < NRP; e += BLOCKT) ys[e] = e < N ? B[p * N + e] : T(0);
#else
#if POSV
  for (int e = t; e < NRP; e += BLOCKT) ys[e] = T(0);  // rows past n stay 0: their x is 0
#endif
  if (t == 0) sinfo = 0;
  for (int e = t; e < 2 * NRP; e += BLOCKT) buf[e / NRP][e % NRP] = T(0);
  __syncthreads();  // the zeros land before the first column is written
  T rinv[TS];
#pragma unroll
  for (int ii = 0; ii < TS; ++ii) rinv[ii] = T(0);
#pragma unroll 1
  for (int kc = 0; kc < NTC; ++kc) {
#pragma unroll
    for (int kk = 0; kk < TS; ++kk) {
      const int k = kc * TS + kk;
      if (k >= N) break;  // uniform: the last tile column may be partial
      T* col = buf[k & 1];
      if (c == kc) {
#pragma unroll
        for (int ii = 0; ii < TS; ++ii)
          if (r > kc || ii >= kk) col[R0 + ii] = a[ii][kk];
      }
      __syncthreads();
      if (c >= kc) {  // the threads left of the pivot's tile column are done: they only keep the barriers
        T d = col[k];
        if (!(d > T(0))) {
          if (c == kc && r == kc && sinfo == 0) sinfo = k + 1;
          d = T(1);
        }
        const T rs = rsqrt_t(d);
        T li[TS];
#pragma unroll
        for (int ii = 0; ii < TS; ++ii) li[ii] = col[R0 + ii] * rs;
        if (c == kc && r == kc) {  // the diagonal tile holding the pivot: entries right of and below it
          rinv[kk] = rs;
#pragma unroll
          for (int ii = 0; ii < TS; ++ii) {
            if (ii == kk) a[ii][kk] = d * rs;
            if (ii > kk) {
              a[ii][kk] = li[ii];
#pragma unroll
              for (int jj = kk + 1; jj <= ii; ++jj) a[ii][jj] -= li[ii] * li[jj];
            }
          }
        } else if (c == kc) {  // below the pivot's diagonal tile: its column k and the columns right of it
          T lj[TS];
#pragma unroll
          for (int jj = kk + 1; jj < TS; ++jj) lj[jj] = col[C0 + jj] * rs;
#pragma unroll
          for (int ii = 0; ii < TS; ++ii) {
            a[ii][kk] = li[ii];
#pragma unroll
            for (int jj = kk + 1; jj < TS; ++jj) a[ii][jj] -= li[ii] * lj[jj];
          }
        } else {  // right of the pivot's tile column: the whole tile (a diagonal one: its lower half)
          T lj[TS];
#pragma unroll
          for (int jj = 0; jj < TS; ++jj) lj[jj] = col[C0 + jj] * rs;
#pragma unroll
          for (int ii = 0; ii < TS; ++ii)
#pragma unroll
            for (int jj = 0; jj < TS; ++jj)
              if (r != c || jj <= ii) a[ii][jj] -= li[ii] * lj[jj];
        }
      }
    }
#if !POSV && !TRSV
    // potrf: the tiles of column kc are final once its pivots are done: their owners store them
    // now (L, zeros above the diagonal, and each tile's mirror above the diagonal as zeros), so
    // the stores drain while the columns to the right are factored (session 23)
    if (c == kc) {
      T* Og = OUT + p * (long long)(N * N);
      if (vec) {
#pragma unroll
        for (int ii = 0; ii < TS; ++ii)
#pragma unroll
          for (int v = 0; v < TS / VEC; ++v) {
            const int i = R0 + ii, j0 = C0 + v * VEC;
            V w, z;
            T* wp = reinterpret_cast<T*>(&w);
            T* zp = reinterpret_cast<T*>(&z);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              wp[e] = j0 + e <= i ? a[ii][v * VEC + e] : T(0);
              zp[e] = T(0);
            }
            if (i < N) {
              *reinterpret_cast<V*>(Og + (long long)i * N + j0) = w;
              if (r != c) *reinterpret_cast<V*>(Og + (long long)(C0 + ii) * N + R0 + v * VEC) = z;
            }
          }
      } else {
#pragma unroll
        for (int ii = 0; ii < TS; ++ii) {
#pragma unroll
          for (int jj = 0; jj < TS; ++jj) {
            const int i = R0 + ii, j = C0 + jj;
            if (i < N && j < N) {
              Og[(long long)i * N + j] = j <= i ? a[ii][jj] : T(0);
              if (r != c) Og[(long long)j * N + i] = T(0);
            }
          }
        }
      }
    }
#endif
  }
#endif
#if POSV || TRSV
  // the triangular solve by tile rows; y (the right-hand side being reduced) and x in shared memory
#if POSV
  __syncthreads();
  if (r == NTR - 1) {  // row n of the bordered factor holds y = L^{-1} b
#pragma unroll
    for (int jj = 0; jj < TS; ++jj)
      if (C0 + jj < N) ys[C0 + jj] = a[N - (NTR - 1) * TS][jj];
  }
#else
  T rinv[TS];
#pragma unroll
  for (int ii = 0; ii < TS; ++ii) rinv[ii] = (r >= 0 && r == c && R0 + ii < N) ? T(1) / a[ii][ii] : T(0);
#endif
  __syncthreads();
#pragma unroll 1
  for (int s = 0; s < NTC; ++s) {
#if POSV
    const int rc = NTC - 1 - s;  // L^T x = y from the bottom tile row up
#else
    const int rc = s;  // L x = b from the top
#endif
    if (r == rc && c == rc) {
      T y[TS];
#pragma unroll
      for (int ii = 0; ii < TS; ++ii) y[ii] = ys[R0 + ii];
#if POSV
#pragma unroll
      for (int ii = TS - 1; ii >= 0; --ii) {
        const T x = y[ii] * rinv[ii];
        y[ii] = x;
#pragma unroll
        for (int jj = 0; jj < ii; ++jj) y[jj] -= a[ii][jj] * x;
      }
#else
#pragma unroll
      for (int ii = 0; ii < TS; ++ii) {
        const T x = y[ii] * rinv[ii];
        y[ii] = x;
#pragma unroll
        for (int i2 = ii + 1; i2 < TS; ++i2) y[i2] -= a[i2][ii] * x;
      }
#endif
#pragma unroll
      for (int ii = 0; ii < TS; ++ii) {
        xs[R0 + ii] = y[ii];
        if (R0 + ii < N) OUT[p * N + R0 + ii] = y[ii];
      }
    }
    __syncthreads();
#if POSV
    if (r == rc && c < rc) {  // y_j -= L_ij x_i over this tile row, for the columns j of tile c
#pragma unroll
      for (int jj = 0; jj < TS; ++jj) {
        T acc = ys[C0 + jj];
#pragma unroll
        for (int ii = 0; ii < TS; ++ii) acc -= a[ii][jj] * xs[R0 + ii];
        ys[C0 + jj] = acc;
      }
    }
#else
    if (c == rc && r > rc) {  // b_i -= L_ij x_j down this tile column, for the rows i of tile r
#pragma unroll
      for (int ii = 0; ii < TS; ++ii) {
        T acc = ys[R0 + ii];
#pragma unroll
        for (int jj = 0; jj < TS; ++jj) acc -= a[ii][jj] * xs[C0 + jj];
        ys[R0 + ii] = acc;
      }
    }
#endif
    __syncthreads();
  }
#endif
#if !TRSV
  __syncthreads();  // the last pivot's report
  if (t == 0) INFO[p] = sinfo;
#endif
}
"""
