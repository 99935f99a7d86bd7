"""The CUDA C++ sources of the linalg family's CUDA tier (kernels_cuda.py compiles them with NVRTC).

Each kernel is one source specialised by macros (kernels_cuda.defines): N, NP (pow2 of n), WARPS
(a block's warps), DOUBLE, POSV, PIPE and COLMAJOR (trsv's L layout), and one entry point `tunedb_linalg(A, B, OUT, INFO,
batch)` whatever the op (potrf ignores B; trsv ignores INFO):
  COMMON  the element and vector types and the pivot's reciprocal square root;
  WARP    potrf / posv for n <= 32: Q = 32 / NP problems a warp, lane i holding row i, pivots by
          shuffles, columns through shared memory (kernels_cuda's docstring has the design);
  TRSV    L x = b for n <= 32 in the same layout: x_j from lane j by one shuffle a step, row i
          taking L[i, j] x_j from its own register j; L row-major, or with COLMAJOR each matrix
          column-major (what torch.linalg.cholesky returns), read as given with no copy;
  BLOCK   potrf / posv for 32 < n <= 64: one problem a block of NP threads, row i in thread i,
          the pivot with its column through shared memory and one barrier a pivot.
Inputs are row-major [batch, n, n] / [batch, n], contiguous. Only the lower triangle of A (L for
trsv) is used: each warp (block) stages its problems' matrices through shared memory with
coalesced loads, rows padded to n + 1 elements, and reads all its inputs before it writes, so
OUT may alias A (potrf) or B (posv, trsv).
"""

COMMON = r"""
#if DOUBLE
typedef double T;
typedef double2 V;
#define VEC 2
#else
typedef float T;
typedef float4 V;
#define VEC 4
#endif
#define ST (N + 1)
#define PER (N * N)

__device__ __forceinline__ T rsqrt_t(T a) {
#if DOUBLE && PIPE
  double r;  // the hardware estimate (subnormals kept) and two Newton steps: the error squares each
  asm("rsqrt.approx.f64 %0, %1;" : "=d"(r) : "d"(a));
  r = r * (1.5 - 0.5 * a * r * r);
  return r * (1.5 - 0.5 * a * r * r);
#elif DOUBLE
  return rsqrt(a);
#else
  T r = rsqrtf(a);
  return r * (1.5f - 0.5f * a * r * r);
#endif
}

"""

WARP = r"""
#define Q (32 / NP)
#define CHUNK (Q * PER)

extern "C" __global__ void __launch_bounds__(WARPS * 32)
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ T tile[WARPS][CHUNK + Q * N];
  __shared__ __align__(16) T colbuf[WARPS][2][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long first = ((long long)blockIdx.x * WARPS + warp) * Q;
  if (first >= batch) return;  // uniform across the warp
  const int nprob = (int)min((long long)Q, (long long)batch - first);
  const int valid = nprob * PER;
  T* tw = tile[warp];
  const T* Ag = A + first * PER;
#pragma unroll
  for (int m = 0; m < (CHUNK + 31) / 32; ++m) {  // coalesced; every load in flight at once
    const int e = lane + 32 * m;
    if (e < CHUNK) {
      const int q = e / PER, rc = e - q * PER, row = rc / N, c = rc - row * N;
      tw[q * N * ST + row * ST + c] = e < valid ? Ag[e] : (row == c ? T(1) : T(0));
    }
  }
  __syncwarp();
  const int q = lane / NP, i = lane % NP, base = q * NP;
  const bool live = i < N;
  T r[N];
#pragma unroll
  for (int j = 0; j < N; ++j) r[j] = live ? tw[q * N * ST + i * ST + j] : T(0);
#if POSV
  T bi = (live && q < nprob) ? B[(first + q) * N + i] : T(0);
#endif
  int info = 0;
  T rinv = T(1);
  T akk = __shfl_sync(0xffffffffu, r[0], base);
  if (!(akk > T(0))) { info = 1; akk = T(1); }
  T rs = rsqrt_t(akk);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const T lk = r[k] * rs;  // on lane k a_kk * rsqrt(a_kk): l_kk (a failed pivot keeps its finite value)
    r[k] = lk;
    // Pivot k + 1 is issued before this pivot's column goes through shared memory: lane k + 1
    // updates its own diagonal with l_{k+1,k} from its own register (the same value the column
    // buffer would hand it, bit for bit), so the pivot chain is shuffle, rsqrt, multiply, FMA,
    // and the store, barrier and broadcast loads below run beside it.
    T akk_next = T(1), rs_next = T(1);
#if PIPE
    if (k + 1 < N) {
      akk_next = __shfl_sync(0xffffffffu, r[k + 1] - lk * lk, base + k + 1);
      if (!(akk_next > T(0))) {
        if (info == 0) info = k + 2;
        akk_next = T(1);
      }
      rs_next = rsqrt_t(akk_next);
    }
#endif
    if (i == k) rinv = rs;
    T* c = colbuf[warp][k & 1];
#if POSV
    const T zk = bi * rs;
    if (i == k) bi = zk;
    c[lane] = (i == k) ? zk : lk;
#else
    c[lane] = lk;
#endif
    __syncwarp();
#if POSV
    if (i > k) bi -= lk * c[base + k];
#endif
#if NP >= VEC
#pragma unroll
    for (int v = (k + 1) / VEC; v < (N + VEC - 1) / VEC; ++v) {
      const V w = *reinterpret_cast<const V*>(c + base + v * VEC);
      const T* wp = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int t = 0; t < VEC; ++t) {
        const int j = v * VEC + t;
        if (j > k && j < N) r[j] -= lk * wp[t];
      }
    }
#else
#pragma unroll
    for (int j = k + 1; j < N; ++j) r[j] -= lk * c[base + j];
#endif
#if PIPE
    akk = akk_next;
    rs = rs_next;
#else
    if (k + 1 < N) {  // the next pivot after this column's broadcast: shorter live ranges
      akk = __shfl_sync(0xffffffffu, r[k + 1], base + k + 1);
      if (!(akk > T(0))) {
        if (info == 0) info = k + 2;
        akk = T(1);
      }
      rs = rsqrt_t(akk);
    }
#endif
  }
  if (live) {
#pragma unroll
#if POSV  // the back-solve reads the lower triangle only
    for (int j = 0; j < N; ++j) tw[q * N * ST + i * ST + j] = r[j];
#else
    for (int j = 0; j < N; ++j) tw[q * N * ST + i * ST + j] = (j <= i) ? r[j] : T(0);
#endif
  }
  __syncwarp();
#if POSV
#pragma unroll
  for (int k = N - 1; k >= 0; --k) {
    const T xk = __shfl_sync(0xffffffffu, bi * rinv, base + k);
    if (i < k) bi -= tw[q * N * ST + k * ST + i] * xk;
    if (i == k) bi = xk;
  }
  if (live && q < nprob) OUT[(first + q) * N + i] = bi;
#else
  T* Og = OUT + first * PER;
#pragma unroll
  for (int m = 0; m < (CHUNK + 31) / 32; ++m) {
    const int e = lane + 32 * m;
    if (e < valid) {
      const int qq = e / PER, rc = e - qq * PER, row = rc / N, cc = rc - row * N;
      Og[e] = tw[qq * N * ST + row * ST + cc];
    }
  }
#endif
  if (i == 0 && q < nprob) INFO[first + q] = info;
}
"""

TRSV = r"""
#define Q (32 / NP)
#define CHUNK (Q * PER)

extern "C" __global__ void __launch_bounds__(WARPS * 32)
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ T tile[WARPS][CHUNK + Q * N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long first = ((long long)blockIdx.x * WARPS + warp) * Q;
  if (first >= batch) return;  // uniform across the warp
  const int nprob = (int)min((long long)Q, (long long)batch - first);
  const int valid = nprob * PER;
  T* tw = tile[warp];
  const T* Ag = A + first * PER;
#pragma unroll
  for (int m = 0; m < (CHUNK + 31) / 32; ++m) {  // coalesced; every load in flight at once
    const int e = lane + 32 * m;
    if (e < CHUNK) {
#if COLMAJOR  // each matrix column-major (as torch.linalg.cholesky returns L): element e is L[rc % N, rc / N]
      const int q = e / PER, rc = e - q * PER, c = rc / N, row = rc - c * N;
#else
      const int q = e / PER, rc = e - q * PER, row = rc / N, c = rc - row * N;
#endif
      tw[q * N * ST + row * ST + c] = e < valid ? Ag[e] : (row == c ? T(1) : T(0));
    }
  }
  __syncwarp();
  const int q = lane / NP, i = lane % NP, base = q * NP;
  const bool live = i < N;
  T r[N];  // row i of L; entries right of the diagonal are loaded but never used
#pragma unroll
  for (int j = 0; j < N; ++j) r[j] = live ? tw[q * N * ST + i * ST + j] : T(0);
  T y = (live && q < nprob) ? B[(first + q) * N + i] : T(0);
  const T inv = live ? T(1) / tw[q * N * ST + i * ST + i] : T(1);
#pragma unroll
  for (int j = 0; j < N; ++j) {  // x_j from lane j to every lane of the problem; row i takes L[i, j] x_j
    const T xj = __shfl_sync(0xffffffffu, y * inv, base + j);
    if (i > j) y -= r[j] * xj;
    else if (i == j) y = xj;
  }
  if (live && q < nprob) OUT[(first + q) * N + i] = y;
}
"""

BLOCK = r"""
// One problem a block, NP = 32 * WARPS threads, thread i holding row i: the warp kernel's
// right-looking factorization with the pivot and the column handed on through shared memory and
// one __syncthreads a pivot (a shuffle does not cross warps). Pivot k + 1 travels with column k:
// thread k + 1 updates its own diagonal with l_{k+1,k} from its own register and writes it to
// the column buffer's extra slot before the barrier, so each pivot costs one barrier.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  __shared__ T tw[N * ST];
  __shared__ __align__(16) T colbuf[2][NP + VEC];
  const int i = threadIdx.x;
  const long long p = blockIdx.x;
  if (p >= batch) return;  // uniform across the block
  const T* Ag = A + p * PER;
#pragma unroll
  for (int m = 0; m < (PER + NP - 1) / NP; ++m) {  // coalesced
    const int e = i + NP * m;
    if (e < PER) {
      const int row = e / N, c = e - row * N;
      tw[row * ST + c] = Ag[e];
    }
  }
  __syncthreads();
  const bool live = i < N;
  T r[N];
#pragma unroll
  for (int j = 0; j < N; ++j) r[j] = live ? tw[i * ST + j] : T(0);
#if POSV
  T bi = live ? B[p * N + i] : T(0);
#endif
  int info = 0;
  T rinv = T(1);
  T akk = tw[0];
  if (!(akk > T(0))) { info = 1; akk = T(1); }
  T rs = rsqrt_t(akk);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const T lk = r[k] * rs;
    r[k] = lk;
    if (i == k) rinv = rs;
    T* c = colbuf[k & 1];
#if POSV
    const T zk = bi * rs;
    if (i == k) bi = zk;
    c[i] = (i == k) ? zk : lk;
#else
    c[i] = lk;
#endif
    if (k + 1 < N && i == k + 1) c[NP] = r[k + 1] - lk * lk;
    __syncthreads();
    if (k + 1 < N) {
      akk = c[NP];
      if (!(akk > T(0))) {
        if (info == 0) info = k + 2;
        akk = T(1);
      }
      rs = rsqrt_t(akk);
    }
#if POSV
    if (i > k) bi -= lk * c[k];
#endif
#pragma unroll
    for (int v = (k + 1) / VEC; v < (N + VEC - 1) / VEC; ++v) {
      const V w = *reinterpret_cast<const V*>(c + v * VEC);
      const T* wp = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int t = 0; t < VEC; ++t) {
        const int j = v * VEC + t;
        if (j > k && j < N) r[j] -= lk * wp[t];
      }
    }
  }
  __syncthreads();  // every thread is past its last read of the tile's input rows
  if (live) {
#pragma unroll
#if POSV
    for (int j = 0; j < N; ++j) tw[i * ST + j] = r[j];
#else
    for (int j = 0; j < N; ++j) tw[i * ST + j] = (j <= i) ? r[j] : T(0);
#endif
  }
  __syncthreads();
#if POSV
  // L^T x = z: x_k from thread k to all through a double-buffered slot, one barrier a step
#pragma unroll
  for (int k = N - 1; k >= 0; --k) {
    if (i == k) colbuf[k & 1][0] = bi * rinv;
    __syncthreads();
    const T xk = colbuf[k & 1][0];
    if (i < k) bi -= tw[k * ST + i] * xk;
    if (i == k) bi = xk;
  }
  if (live) OUT[p * N + i] = bi;
#else
  T* Og = OUT + p * PER;
#pragma unroll
  for (int m = 0; m < (PER + NP - 1) / NP; ++m) {
    const int e = i + NP * m;
    if (e < PER) {
      const int row = e / N, cc = e - row * N;
      Og[e] = tw[row * ST + cc];
    }
  }
#endif
  if (i == 0) INFO[p] = info;
}
"""
