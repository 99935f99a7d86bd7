"""The CUDA source of the tier's blocked kernel (`cudab_b{NB}_w{W}`; kernels_cuda_blocked.py has the
design, the ids and the macros): after kernels_cuda_src.COMMON, specialised by N, NB, NT,
NTHREADS, DOUBLE, POSV and MINB, one entry point `tunedb_linalg(A, B, OUT, INFO, batch)` launched
one problem a block with the dynamic shared memory kernels_cuda_blocked.smem_bytes names."""

SOURCE = r"""
#define NTILE (NT * (NT + 1) / 2)
#define TSZ (NB * NB)
#define CPR (NB / VEC)                // 16-byte chunks a tile row
#define NPAD (NT * NB)
#define RC (NPAD / VEC)               // chunks a padded matrix row
#define RCL ((RC + 31) / 32)          // of them a lane
#define WARPS (NTHREADS / 32)
#define FULL 0xffffffffu
#define UNR 8                         // rows a warp loads before it stores them

__device__ __forceinline__ int tbase(int I, int J) { return (I * (I + 1) / 2 + J) * TSZ; }

// element (r, c) of a tile: row r's 16-byte chunks permuted, chunk ^ SWZ(r), SWZ(r) = G(r / 4) ^
// H(r % 4), so that the rows 4 m + q (m = 0..3) the update reads at one chunk fall on distinct
// bank groups, and so do 8 (fp64 NB = 16: 16) consecutive rows read a row a lane; SWZ(0) = 0, so
// a plain vector reads as row 0 of a tile
#if CPR == 8
#define SWG(m) ((((m) & 1) << 2) | (((m) >> 1) & 1))
#define SWH(q) ((q) & 3)
#elif CPR == 4
#define SWG(m) ((m) & 3)
#define SWH(q) ((q) & 2)
#else
#define SWG(m) ((m) & 1)
#define SWH(q) 0
#endif
#define SWZ(r) (SWG((r) >> 2) ^ SWH((r) & 3))
#ifndef LOOKAHEAD
#define LOOKAHEAD 1  // warp 0 factors panel P + 1's diagonal tile beside panel P's bulk update
#endif

__device__ __forceinline__ int sw(int r, int c) {
  return r * NB + ((((c / VEC) ^ SWZ(r)) * VEC) + (c % VEC));
}

__device__ __forceinline__ void unpack(const V& w, T* out) {
  const T* wp = reinterpret_cast<const T*>(&w);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = wp[e];
}

__device__ __forceinline__ V vzero() {
  V w;
  T* wp = reinterpret_cast<T*>(&w);
#pragma unroll
  for (int e = 0; e < VEC; ++e) wp[e] = T(0);
  return w;
}

__device__ __forceinline__ V pack(const T* in) {
  V w;
  T* wp = reinterpret_cast<T*>(&w);
#pragma unroll
  for (int e = 0; e < VEC; ++e) wp[e] = in[e];
  return w;
}

// 1. the diagonal tile (P, P), warp 0, lane r holding row r: pivot k by one shuffle, L's column k
// through shared memory (two buffers), one __syncwarp a pivot; 1 / l_kk kept in rinv
__device__ __forceinline__ void diag_tile(T* S, T* rinv, T* col, int* sinfo, int P, int r) {
  T* D = S + tbase(P, P);
  T d[NB];
#pragma unroll
  for (int v = 0; v < CPR; ++v) {
    V w = vzero();
    if (r < NB) w = *reinterpret_cast<const V*>(D + sw(r, v * VEC));
    unpack(w, d + v * VEC);
  }
#pragma unroll
  for (int k = 0; k < NB; ++k) {
    T piv = __shfl_sync(FULL, d[k], k);
    if (!(piv > T(0))) {
      if (r == k && *sinfo == 0) *sinfo = P * NB + k + 1;
      piv = T(1);
    }
    const T rs = rsqrt_t(piv);
    const T l = (r == k ? piv : d[k]) * rs;
    d[k] = l;
    T* c = col + (k & 1) * NB;
    if (r < NB) c[r] = l;
    if (r == k) rinv[k] = rs;
    __syncwarp();
#pragma unroll
    for (int v = (k + 1) / VEC; v < CPR; ++v) {
      T lj[VEC];
      unpack(*reinterpret_cast<const V*>(c + v * VEC), lj);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int j = v * VEC + e;
        if (j > k && j <= r) d[j] -= l * lj[e];
      }
    }
  }
  if (r < NB) {
#pragma unroll
    for (int v = 0; v < CPR; ++v) *reinterpret_cast<V*>(D + sw(r, v * VEC)) = pack(d + v * VEC);
  }
}

// 2. the tiles below (P, P): each row a of them solves o L_PP^T = a by substitution (posv: b's
// rows as one more). Solving through the diagonal tile's inverse instead (warp 0 inverting it
// beside the factorization, no chain here) lost 1.15-1.8x (session 24, bench/blocked_variants.py)
__device__ __forceinline__ void panel_rows(T* S, T* ys, const T* rinv, int P, int w0, int step) {
  const T* D = S + tbase(P, P);
  const int below = (NT - 1 - P) * NB;
#pragma unroll 1
  for (int w = w0; w < below + POSV; w += step) {
    T* R = w < below ? S + tbase(P + 1 + w / NB, P) : ys + P * NB;
    const int r = w < below ? w % NB : 0;
    T a[NB], o[NB];
#pragma unroll
    for (int v = 0; v < CPR; ++v) unpack(*reinterpret_cast<const V*>(R + sw(r, v * VEC)), a + v * VEC);
#pragma unroll
    for (int k = 0; k < NB; ++k) {  // o_k = (a_k - sum_{m < k} l_km o_m) / l_kk
      T s0 = a[k], s1 = T(0);
#pragma unroll
      for (int v = 0; v * VEC < k; ++v) {
        T lk[VEC];
        unpack(*reinterpret_cast<const V*>(D + sw(k, v * VEC)), lk);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int mm = v * VEC + e;
          if (mm < k) {
            if (mm & 1) s1 -= lk[e] * o[mm];
            else s0 -= lk[e] * o[mm];
          }
        }
      }
      o[k] = (s0 + s1) * rinv[k];
    }
#pragma unroll
    for (int v = 0; v < CPR; ++v) *reinterpret_cast<V*>(R + sw(r, v * VEC)) = pack(o + v * VEC);
  }
}

// 3. the trailing update A_IJ -= L_IP L_JP^T, 4 x 4 outputs an item: over the lower triangle of
// tiles J0 <= J <= I < NT (tri), or the one tile column J = J0 (posv: y_J -= L_JP y_P for the
// triangle's tile rows J, or J0's alone, as more items); items w0, w0 + step, ...
__device__ __forceinline__ void update(T* S, T* ys, int P, int J0, bool tri, int w0, int step) {
  const int m = NT - J0;
  const int nsy = (tri ? m * (m + 1) / 2 : m) * (NB / 4) * (NB / 4);
#pragma unroll 1
  for (int w = w0; w < nsy + POSV * (tri ? m : 1) * NB; w += step) {
    if (w < nsy) {
      int tt = w / ((NB / 4) * (NB / 4)), ii = 0;
      const int u = w % ((NB / 4) * (NB / 4)), mi = u / (NB / 4), mj = u % (NB / 4);
      if (tri) {
        while (tt > ii) { tt -= ii + 1; ++ii; }
      } else {
        ii = tt;
        tt = 0;
      }
      const int I = J0 + ii, J = J0 + tt;
      if (I == J && mj > mi) continue;  // wholly above the diagonal
      // row 4 mi + q's chunk c sits at chunk c ^ SWG(mi) ^ SWH(q): one offset a chunk c' = c ^ SWH(q)
      // (CPR of them, c' known at compile time for each (c, q)) serves the four rows
      const int La = tbase(I, P) + 4 * mi * NB, Lb = tbase(J, P) + 4 * mj * NB;
      int oa[CPR], ob[CPR];
#pragma unroll
      for (int c = 0; c < CPR; ++c) {
        oa[c] = La + (c ^ SWG(mi)) * VEC;
        ob[c] = Lb + (c ^ SWG(mj)) * VEC;
      }
      T acc[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = T(0);
#pragma unroll
      for (int v = 0; v < CPR; ++v) {
        T xa[4][VEC], xb[4][VEC];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          unpack(*reinterpret_cast<const V*>(S + oa[v ^ SWH(q)] + q * NB), xa[q]);
          unpack(*reinterpret_cast<const V*>(S + ob[v ^ SWH(q)] + q * NB), xb[q]);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[a][b] += xa[a][e] * xb[b][e];
      }
      T* C = S + tbase(I, J) + 4 * mi * NB;
#pragma unroll
      for (int h = 0; h < 4 / VEC; ++h) {
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          T* cp = C + a * NB + ((((4 * mj) / VEC + h) ^ SWG(mi) ^ SWH(a)) * VEC);
          V cv = *reinterpret_cast<const V*>(cp);
          T* c = reinterpret_cast<T*>(&cv);
#pragma unroll
          for (int e = 0; e < VEC; ++e) c[e] -= acc[a][h * VEC + e];
          *reinterpret_cast<V*>(cp) = cv;
        }
      }
    } else {
#if POSV
      const int w2 = w - nsy, J = J0 + w2 / NB, r = w2 % NB;
      const T* Lr = S + tbase(J, P);
      T s0 = T(0), s1 = T(0);
#pragma unroll
      for (int v = 0; v < CPR; ++v) {
        T l[VEC], y[VEC];
        unpack(*reinterpret_cast<const V*>(Lr + sw(r, v * VEC)), l);
        unpack(*reinterpret_cast<const V*>(ys + P * NB + v * VEC), y);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (e & 1) s1 += l[e] * y[e];
          else s0 += l[e] * y[e];
        }
      }
      ys[J * NB + r] -= s0 + s1;
#endif
    }
  }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MINB)
tunedb_linalg(const T* A, const T* B, T* OUT, int* INFO, int batch) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* S = reinterpret_cast<T*>(smem_raw);  // the lower tiles
  T* rinv = S + NTILE * TSZ;              // 1 / l_kk of the panel's pivots
  T* col = rinv + NB;                     // the diagonal factor's column, two buffers
  T* ys = col + 2 * NB;                   // posv: b, then y = L^-1 b, then x
  int* sinfo = reinterpret_cast<int*>(ys + POSV * NPAD);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const long long p = blockIdx.x;
  if (p >= batch) return;  // uniform across the block
  const T* Ag = A + p * (long long)PER;
#if POSV
  const bool vec = N % VEC == 0 && (((size_t)A) & 15) == 0;
#else
  const bool vec = N % VEC == 0 && ((((size_t)A) | ((size_t)OUT)) & 15) == 0;
#endif
  // the lower tiles: a warp a padded row at a time (lane -> column chunks), UNR rows in flight;
  // the identity past n
#pragma unroll 1
  for (int i0 = warp * UNR; i0 < NPAD; i0 += WARPS * UNR) {
    V v[UNR][RCL];
#pragma unroll
    for (int u = 0; u < UNR; ++u)
#pragma unroll
      for (int h = 0; h < RCL; ++h) {
        const int i = i0 + u, j0 = (lane + 32 * h) * VEC;
        T* vp = reinterpret_cast<T*>(&v[u][h]);
#pragma unroll
        for (int q = 0; q < VEC; ++q) vp[q] = T(i == j0 + q);
        if (i < N && j0 < NPAD && j0 / NB <= i / NB) {
          if (vec) {
            if (j0 < N) v[u][h] = *reinterpret_cast<const V*>(Ag + (long long)i * N + j0);
          } else {
#pragma unroll
            for (int q = 0; q < VEC; ++q)
              if (j0 + q < N) vp[q] = Ag[(long long)i * N + j0 + q];
          }
        }
      }
#pragma unroll
    for (int u = 0; u < UNR; ++u)
#pragma unroll
      for (int h = 0; h < RCL; ++h) {
        const int i = i0 + u, j0 = (lane + 32 * h) * VEC;
        if (i < NPAD && j0 < NPAD && j0 / NB <= i / NB)
          *reinterpret_cast<V*>(S + tbase(i / NB, j0 / NB) + sw(i % NB, j0 % NB)) = v[u][h];
      }
  }
#if POSV
  for (int i = t; i < NPAD; i += NTHREADS) ys[i] = i < N ? B[p * N + i] : T(0);
#endif
  if (t == 0) *sinfo = 0;
  __syncthreads();

#if LOOKAHEAD
  // panel P + 1's column is updated first, so warp 0 factors its diagonal tile while the other
  // warps update the rest of the trailing matrix
  if (t < 32) diag_tile(S, rinv, col, sinfo, 0, t);
  __syncthreads();
  panel_rows(S, ys, rinv, 0, t, NTHREADS);
  __syncthreads();
#pragma unroll 1
  for (int P = 0; P + 1 < NT; ++P) {
    update(S, ys, P, P + 1, false, t, NTHREADS);
    __syncthreads();
    if (t < 32) diag_tile(S, rinv, col, sinfo, P + 1, t);
    else if (P + 2 < NT) update(S, ys, P, P + 2, true, t - 32, NTHREADS - 32);
    __syncthreads();
    panel_rows(S, ys, rinv, P + 1, t, NTHREADS);
    __syncthreads();
  }
#else
#pragma unroll 1
  for (int P = 0; P < NT; ++P) {
    if (t < 32) diag_tile(S, rinv, col, sinfo, P, t);
    __syncthreads();
    panel_rows(S, ys, rinv, P, t, NTHREADS);
    __syncthreads();
    if (P + 1 < NT) update(S, ys, P, P + 1, true, t, NTHREADS);
    __syncthreads();
  }
#endif

#if POSV
  // L^T x = y by tile rows from the bottom: warp 0 the diagonal tile, then y above it
#pragma unroll 1
  for (int P = NT - 1; P >= 0; --P) {
    const T* D = S + tbase(P, P);
    if (t < 32) {
      const int r = t;
      T y = r < NB ? ys[P * NB + r] : T(0);
      const T rr = r < NB ? T(1) / D[sw(r, r)] : T(0);
#pragma unroll
      for (int k = NB - 1; k >= 0; --k) {
        const T xk = __shfl_sync(FULL, y * rr, k);
        if (r == k) y = xk;
        else if (r < k) y -= D[sw(k, r)] * xk;
      }
      if (r < NB) {
        ys[P * NB + r] = y;
        if (P * NB + r < N) OUT[p * N + P * NB + r] = y;
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int i = t; i < P * NB; i += NTHREADS) {
      const T* Lt = S + tbase(P, i / NB);
      const int c = i % NB;
      T s0 = T(0), s1 = T(0);
#pragma unroll
      for (int r = 0; r < NB; ++r) {
        if (r & 1) s1 += Lt[sw(r, c)] * ys[P * NB + r];
        else s0 += Lt[sw(r, c)] * ys[P * NB + r];
      }
      ys[i] -= s0 + s1;
    }
    __syncthreads();
  }
#else
  // L, zeros above the diagonal: a warp a row at a time, coalesced
  T* Og = OUT + p * (long long)PER;
#pragma unroll 1
  for (int i = warp; i < N; i += WARPS) {
    const int I = i / NB;
    const T* Srow = S + tbase(I, 0);  // tile (I, J) at Srow + J * TSZ
    if (vec) {
#pragma unroll
      for (int h = 0; h < (N / VEC + 31) / 32; ++h) {
        const int j0 = (lane + 32 * h) * VEC, J = j0 / NB;
        if (j0 < N) {
          V w = vzero();
          if (J <= I) {
            w = *reinterpret_cast<const V*>(Srow + J * TSZ + sw(i % NB, j0 % NB));
#pragma unroll
            for (int q = 0; q < VEC; ++q)
              if (j0 + q > i) reinterpret_cast<T*>(&w)[q] = T(0);
          }
          *reinterpret_cast<V*>(Og + (long long)i * N + j0) = w;
        }
      }
    } else {
#pragma unroll 1
      for (int j = lane; j < N; j += 32)
        Og[(long long)i * N + j] = j <= i ? S[tbase(I, j / NB) + sw(i % NB, j % NB)] : T(0);
    }
  }
#endif
  if (t == 0) INFO[p] = *sinfo;
}
"""
