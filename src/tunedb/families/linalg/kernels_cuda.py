"""The CUDA C++ tier of the small linear-algebra family: potrf and posv for n <= 32 as hand-written
warp kernels, compiled at run time by NVRTC through torch (`torch.cuda._compile_kernel`).

Why not Triton: the shfl packing (kernels_shfl.py) broadcasts each pivot's column with one warp
shuffle per register, 640 shuffles a problem at fp32 n = 32, and at batch 65536 the SM's shuffle
pipe (one warp instruction a clock) is the bound: 46 M shuffles on 132 SMs is ~200 us against
the 66 us memory floor of posv there (shfl serves 298 us). Triton has no way to say "lane k
writes one value to shared memory and every lane reads the column back as 16-byte broadcasts";
CUDA does. Per pivot k here (one problem on NP = pow2(n) lanes of a warp, lane i holds row i of
the symmetric tile in registers):

  - the pivot a_kk reaches every lane of the problem by one shuffle from lane k;
  - each lane scales its own a_ik into l_ik and writes it to a per-warp column buffer (one 4/8-byte
    store), one __syncwarp (the buffer is double-buffered by k's parity, so this one barrier also
    orders the next pivot's writes after this pivot's reads);
  - lane i updates a_ij -= l_ik * l_jk for j > k, reading l_jk as 16-byte broadcast loads
    (every lane of a problem reads the same address: one wavefront each).

So a problem costs n shuffles and about n^2 / 8 (fp32) or n^2 / 4 (fp64) vector loads, not n^2 / 2
shuffles. posv fuses the forward solve (lane k publishes z_k = b_k / l_kk in its own slot of the
column buffer, which no lane reads as l_kk) and back-solves L^T x = z by columns of L from the
shared-memory tile, x_k handed on by one shuffle a step.

Memory: each warp stages its problems' contiguous n x n matrices through shared memory with
coalesced loads (rows padded to n + 1 elements so the row-per-lane reads are conflict-free), and
potrf stores L the same way (zeros above the diagonal). Each warp reads all its problems before
it writes any and warps own disjoint problems, so `out` may alias A (potrf) or b (posv).

Numerics as the Triton solvers: only the lower triangle of A is used (upper entries flow only
into upper entries, which are never read); a pivot that is not positive (or NaN) sets info to
its 1-based column (the first such) and is replaced by 1; 1/sqrt from rsqrt (fp32: one Newton
step; fp64: CUDA's rsqrt, within an ulp).

Config ids `cuda_p{P}_w{W}` and `cudas_p{P}_w{W}`: W warps a block (1, 2, 4, 8), each warp
Q = 32 / NP problems, so P = W * Q problems a block (the id names P as the other packings do).
`cuda_` pipelines the pivots: pivot k + 1's shuffle and rsqrt are issued before pivot k's column
goes through shared memory (lane k + 1 updates its own diagonal from its own register), and fp64
takes rsqrt from the hardware estimate and two Newton steps; `cudas_` runs them in series with
CUDA's rsqrt. Measured on the H200 (session 21, bench/cuda_probe.py): the pipelined form is up to
1.2x faster where a batch is one wave (latency), the serial one up to 10% faster at fp64 and
batch 65536 (fewer registers: 112 against 130 at posv n = 32). Static shared memory only
(<= 48 KiB a block), which bounds W at fp64 n = 32.

It is a tier of its own (configs.DEPENDENCIES): it needs NVRTC at run time, so the pick rule
takes it only past the dependency margin and every table entry keeps the native (Triton)
winners for a machine without it. Kernels compile on first use (NVRTC, in process, about a
second each), keyed by (op, dtype, n, W, device).
"""
from __future__ import annotations

import re
from typing import Any

PREFIX = "cuda"
OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
MAX_N = 32
WARPS = (1, 2, 4, 8)
STATIC_SMEM = 48 * 1024
_ID = re.compile(r"^cuda(s?)_p([0-9]+)_w([0-9]+)$")
_ITEM = {"fp32": 4, "fp64": 8}
_KERNELS: dict[tuple, Any] = {}
_AVAILABLE: dict[str, bool] = {}

SOURCE = r"""
#if DOUBLE
typedef double T;
typedef double2 V;
#define VEC 2
#else
typedef float T;
typedef float4 V;
#define VEC 4
#endif
#define Q (32 / NP)
#define ST (N + 1)
#define PER (N * N)
#define CHUNK (Q * PER)

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


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def per_warp(n: int) -> int:
    """Problems a warp carries: 32 / NP."""
    return 32 // max(2, next_pow2(n))


def config_id(problems: int, warps: int, pipe: bool = True) -> str:
    return f"{PREFIX}{'' if pipe else 's'}_p{problems}_w{warps}"


def parse(config_id_: str) -> tuple[int, int, bool] | None:
    """(P, W, pipelined) of `cuda_p{P}_w{W}` / `cudas_p{P}_w{W}`, or None for any other id."""
    match = _ID.match(config_id_)
    return (int(match.group(2)), int(match.group(3)), not match.group(1)) if match else None


def smem_bytes(n: int, dtype: str, warps: int) -> int:
    """Static shared memory a block: the staged tiles (rows padded to n + 1) and the column buffers."""
    q = per_warp(n)
    return warps * (q * n * (n + 1) + 2 * 32) * _ITEM.get(dtype, 8)


def invalid_reason(op: str, problems: int, warps: int, n: int, dtype: str, check_runtime: bool = True) -> str | None:
    """Why `cuda_p{problems}_w{warps}` cannot run op at (n, dtype) here, or None. With
    check_runtime=False only the shape is judged (the shipped table's arms on a machine without
    a GPU)."""
    cid = config_id(problems, warps)
    if op not in OPS:
        return f"{cid} runs {', '.join(OPS)} only, not {op}"
    if dtype not in DTYPES:
        return f"{cid} runs {', '.join(DTYPES)} only, not {dtype}"
    if not isinstance(n, int) or not 2 <= n <= MAX_N:
        return f"{cid} takes n in 2..{MAX_N} (a problem's rows across one warp's lanes), got n={n!r}"
    if warps not in WARPS:
        return f"{cid}: warps a block must be one of {WARPS}, got {warps}"
    if problems != warps * per_warp(n):
        return (f"{cid}: a warp carries 32 / NP = {per_warp(n)} problems at n={n}, so P must be "
                f"{warps * per_warp(n)} at {warps} warps, got P={problems}")
    need = smem_bytes(n, dtype, warps)
    if need > STATIC_SMEM:
        return f"{cid} at n={n} {dtype} needs {need} B of static shared memory a block (at most {STATIC_SMEM})"
    if check_runtime and not available():
        return f"{cid} needs a CUDA device and NVRTC (torch.cuda._compile_kernel), which are not available here"
    return None


def config_ids(op: str, n: int, dtype: str) -> tuple[str, ...]:
    """The tier's valid arms for a cell (none without a GPU and NVRTC)."""
    if not isinstance(n, int) or n < 2:
        return ()
    return tuple(config_id(w * per_warp(n), w, pipe) for pipe in (True, False) for w in WARPS
                 if invalid_reason(op, w * per_warp(n), w, n, dtype) is None)


def available() -> bool:
    """A CUDA device is visible and torch can compile with NVRTC (asked once a process: a tiny
    kernel is compiled, not launched)."""
    got = _AVAILABLE.get("nvrtc")
    if got is None:
        got = False
        try:
            import torch

            if torch.cuda.is_available() and hasattr(torch.cuda, "_compile_kernel") and torch.version.cuda:
                torch.cuda._compile_kernel('extern "C" __global__ void tunedb_probe(int* x) { *x = 1; }',
                                           "tunedb_probe")
                got = True
        except Exception:
            got = False
        _AVAILABLE["nvrtc"] = got
    return got


def defines(op: str, n: int, dtype: str, warps: int, pipe: bool = True) -> dict[str, int]:
    """The macros one kernel is compiled with."""
    return {"N": n, "NP": max(2, next_pow2(n)), "WARPS": warps, "DOUBLE": int(dtype == "fp64"),
            "POSV": int(op == "posv"), "PIPE": int(pipe)}


def source(op: str, n: int, dtype: str, warps: int, pipe: bool = True) -> str:
    """The full CUDA source of one kernel (macros, then SOURCE)."""
    head = "".join(f"#define {k} {v}\n" for k, v in defines(op, n, dtype, warps, pipe).items())
    return head + SOURCE


def _kernel(op: str, n: int, dtype: str, warps: int, pipe: bool, device: int, cubin: Any = None) -> Any:
    """The loaded kernel (compiled here, or from `cubin`: (binary, lowered name) of NVRTC)."""
    key = (op, dtype, n, warps, pipe, device)
    kern = _KERNELS.get(key)
    if kern is None:
        import torch

        with torch.cuda.device(device):
            if cubin is None:
                kern = torch.cuda._compile_kernel(source(op, n, dtype, warps, pipe), "tunedb_linalg")
            else:
                from torch.cuda._utils import _cuda_load_module

                loaded = _cuda_load_module(cubin[0], [cubin[1]])
                kern = loaded[cubin[1]] if isinstance(loaded, dict) else getattr(loaded, cubin[1])
        _KERNELS[key] = kern
    return kern


def compile_all(items: list[tuple[str, str, int, str]], jobs: int = 8) -> list[str]:
    """Compile the tier's (op, config id, n, dtype) kernels for this process's current device:
    NVRTC `jobs` at a time in threads (it runs outside the GIL), then each module loaded here, in
    the calling thread (a fresh thread has no CUDA context current for the driver's module load).
    Where this torch lacks the split NVRTC helpers, one at a time. Returns the failures as lines."""
    import concurrent.futures as cf

    import torch

    device = torch.cuda.current_device()
    arch = "".join(map(str, torch.cuda.get_device_capability(device)))
    try:
        from torch.cuda._utils import _cuda_load_module, _nvrtc_compile  # noqa: F401
    except ImportError:
        _nvrtc_compile = None

    def one(item: tuple[str, str, int, str]) -> tuple[Any, str | None]:
        op, cid, n, dtype = item
        try:
            shape = parse(cid)
            if shape is None:
                raise ValueError(f"not an id of the CUDA tier: {cid!r}")
            if _nvrtc_compile is None:
                return None, None
            return _nvrtc_compile(source(op, n, dtype, shape[1], shape[2]), "tunedb_linalg", arch), None
        except Exception as exc:  # reported to the caller, which decides
            return None, f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"

    todo = sorted(set(items))
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = list(pool.map(one, todo))
    failed = []
    for (op, cid, n, dtype), (cubin, err) in zip(todo, built):
        if err is None:
            try:
                shape = parse(cid)
                _kernel(op, n, dtype, shape[1], shape[2], device, cubin)
            except Exception as exc:
                err = f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"
        if err:
            failed.append(err)
    return failed


def launch(op: str, cid: str, tensors: tuple, out: Any, n: int, batch: int, dtype: str) -> tuple[Any, Any]:
    """Run the tier's config `cid` on CUDA tensors (launch.py checked shapes and made `out`);
    returns (L or x, info)."""
    import torch

    shape = parse(cid)
    if shape is None:
        raise ValueError(f"unknown config {cid!r}: the CUDA tier's ids are cuda_p<P>_w<W> and cudas_p<P>_w<W>")
    problems, warps, pipe = shape
    why = invalid_reason(op, problems, warps, n, dtype)
    if why:
        raise ValueError(why)
    a = tensors[0]
    if not a.is_cuda:
        raise ValueError(f"{cid} runs on CUDA tensors only, got {a.device}")
    info = torch.empty((batch,), dtype=torch.int32, device=a.device)
    if batch == 0:
        return out, info
    args = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    if batch >= 2 ** 31:
        raise ValueError(f"{cid} takes batch < 2**31, got {batch}")
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    kern = _kernel(op, n, dtype, warps, pipe, device)
    b = args[1] if op == "posv" else args[0]  # potrf's kernel never reads B
    grid = -(-batch // problems)
    kern(grid=(grid, 1, 1), block=(32 * warps, 1, 1), args=[args[0], b, out, info, batch],
         stream=torch.cuda.current_stream(a.device))
    return out, info
