"""The CUDA C++ tier of the small linear-algebra family: potrf and posv for n <= 64 and trsv for
n <= 32 as hand-written kernels (kernels_cuda_src.py), all three for n = 33..128 as the tile
kernel (`cudat_t<TS>`, kernels_cuda_tile.py), and potrf / posv for n = 33..128 as the blocked
kernel (`cudab_b<NB>_w<W>`, kernels_cuda_blocked.py: tiles in shared memory, panels of NB
columns, the one that serves n = 128), compiled at run time by NVRTC through torch
(`torch.cuda._compile_kernel`).

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

trsv (n <= 32) keeps the layout: x_j reaches every lane of the problem by one shuffle a step and
row i takes L[i, j] x_j from its own register. From n = 33 to 64 (potrf, posv) one problem takes a
block of NP = 64 threads, row i in thread i, and the pivot travels with the column through shared
memory: one __syncthreads a pivot (kernels_cuda_src.BLOCK); or one warp, lane i holding rows i and
i + 32, with no block barrier (`cudaw_p<P>_w<W>`, kernels_cuda_wide.py, which also runs n = 17..32
at two problems a warp, lane i holding rows i and i + 16).

Config ids `cuda_p{P}_w{W}` and `cudas_p{P}_w{W}`: W warps a block (1, 2, 4, 8), each warp
Q = 32 / NP problems, so P = W * Q problems a block (the id names P as the other packings do);
past n = 32 one problem a block of NP / 32 warps (`cuda_p1_w2`).
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
second each), keyed by (op, dtype, n, config id, trsv's L layout, device).
"""
from __future__ import annotations

import re
from typing import Any

from tunedb.families.linalg import kernels_cuda_blocked as blocked
from tunedb.families.linalg import kernels_cuda_tile as tile
from tunedb.families.linalg import kernels_cuda_wide as wide

PREFIX = "cuda"
OPS = ("potrf", "posv", "trsv")
DTYPES = ("fp32", "fp64")
MAX_N = {"potrf": 64, "posv": 64, "trsv": 32}
WARP_MAX_N = 32  # up to here a problem fits one warp's lanes (kernels_cuda_src.WARP / TRSV)
SERIAL_OPS = ("potrf", "posv")  # the serial-pivot variant (cudas_) of the warp kernel
WARPS = (1, 2, 4, 8)
STATIC_SMEM = 48 * 1024
_ID = re.compile(r"^cuda(s?)_p([0-9]+)_w([0-9]+)$")
_ITEM = {"fp32": 4, "fp64": 8}
_KERNELS: dict[tuple, Any] = {}
_AVAILABLE: dict[str, bool] = {}


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
    item = _ITEM.get(dtype, 8)
    if n > WARP_MAX_N:  # one problem a block (BLOCK)
        return (n * (n + 1) + 2 * (next_pow2(n) + 16 // item)) * item
    return warps * (per_warp(n) * n * (n + 1) + 2 * 32) * item


def invalid_reason(op: str, problems: int, warps: int, n: int, dtype: str, check_runtime: bool = True,
                   pipe: bool = True) -> str | None:
    """Why `cuda_p{problems}_w{warps}` (`cudas_` with pipe=False) cannot run op at (n, dtype)
    here, or None. With check_runtime=False only the shape is judged (the shipped table's arms on
    a machine without a GPU)."""
    cid = config_id(problems, warps, pipe)
    if op not in OPS:
        return f"{cid} runs {', '.join(OPS)} only, not {op}"
    if dtype not in DTYPES:
        return f"{cid} runs {', '.join(DTYPES)} only, not {dtype}"
    if not isinstance(n, int) or not 2 <= n <= MAX_N[op]:
        return f"{cid} takes {op} at n in 2..{MAX_N[op]}, got n={n!r} (cudat_t<TS> takes n to {tile.MAX_N})"
    if warps not in WARPS:
        return f"{cid}: warps a block must be one of {WARPS}, got {warps}"
    if not pipe and (op not in SERIAL_OPS or n > WARP_MAX_N):
        return (f"{cid}: the serial-pivot form runs {', '.join(SERIAL_OPS)} at n <= {WARP_MAX_N} only "
                f"({config_id(problems, warps)} is the pipelined one)")
    if n > WARP_MAX_N:
        want = next_pow2(n) // 32
        if problems != 1 or warps != want:
            return (f"{cid}: past n={WARP_MAX_N} one problem takes a block of NP / 32 = {want} warps "
                    f"({config_id(1, want)}), got P={problems}, W={warps}")
    elif problems != warps * per_warp(n):
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
    shapes = [(1, next_pow2(n) // 32)] if n > WARP_MAX_N else [(w * per_warp(n), w) for w in WARPS]
    ids = [config_id(p, w, pipe) for pipe in (True, False) for p, w in shapes]
    ids += [*wide.ids_at(n), *(tile.config_id(ts) for ts in tile.TILES), *blocked.ids()]
    return tuple(cid for cid in ids if arm_invalid(op, cid, n, dtype) is None)


def all_ids() -> tuple[str, ...]:
    """Every id the tier has at some (op, n, dtype): validity is per cell (arm_invalid)."""
    shapes = {(w * q, w) for w in WARPS for q in (1, 2, 4, 8, 16)}
    shapes |= {(1, next_pow2(n) // 32) for n in range(WARP_MAX_N + 1, max(MAX_N.values()) + 1)}
    ids = {config_id(p, w, pipe) for p, w in shapes for pipe in (True, False)}
    ids |= {cid for n in (wide.MIN_N, wide.MAX_N) for cid in wide.ids_at(n)}
    return tuple(sorted(ids | {tile.config_id(ts) for ts in tile.TILES} | set(blocked.ids())))


def id_kind(cid: str) -> tuple[str, tuple] | None:
    """Which kernel of the tier an id names and its parameters, parsed once: ("tile", (TS,)),
    ("wide", (P, W)), ("blocked", (NB, W)), ("warp", (P, W, pipelined)); None for anything else."""
    for kind, parser in (("tile", tile.parse), ("wide", wide.parse), ("blocked", blocked.parse), ("warp", parse)):
        got = parser(cid)
        if got is not None:
            return kind, got if isinstance(got, tuple) else (got,)
    return None


def arm_invalid(op: str, cid: str, n: int, dtype: str, check_runtime: bool = True) -> str | None:
    """THE predicate for any id of the tier (warp/block `cuda_`/`cudas_`, wide-warp `cudaw_`, tile
    `cudat_`, blocked `cudab_`)."""
    kind = id_kind(cid)
    if kind is None:
        return (f"{cid!r} is not an arm of the CUDA tier (ids: cuda_p<P>_w<W>, cudas_p<P>_w<W>, cudaw_p<P>_w<W>, "
                "cudat_t<TS>, cudab_b<NB>_w<W>)")
    name, args = kind
    if name == "warp":
        return invalid_reason(op, args[0], args[1], n, dtype, check_runtime, args[2])
    why = {"tile": tile.invalid_reason, "wide": wide.invalid_reason, "blocked": blocked.invalid_reason}[name](
        op, *args, n, dtype)
    if why is None and check_runtime and not available():
        why = f"{cid} needs a CUDA device and NVRTC (torch.cuda._compile_kernel), which are not available here"
    return why


def arm_smem(op: str, cid: str, n: int, dtype: str) -> int:
    """Shared memory a block of the arm `cid` at (op, n, dtype) (static; dynamic for `cudab_`)."""
    name, args = id_kind(cid) or ("", ())
    if name == "blocked":
        return blocked.smem_bytes(op, n, dtype, args[0])
    if name == "tile":
        return tile.smem_bytes(op, n, dtype, args[0])
    if name == "wide":
        return wide.smem_bytes(n, dtype, args[1])
    return smem_bytes(n, dtype, args[1]) if name == "warp" else 0


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


def defines(op: str, n: int, dtype: str, warps: int, pipe: bool = True, colmajor: bool = False) -> dict[str, int]:
    """The macros one kernel is compiled with (colmajor: trsv's L given column-major)."""
    return {"N": n, "NP": max(2, next_pow2(n)), "WARPS": warps, "DOUBLE": int(dtype == "fp64"),
            "POSV": int(op == "posv"), "PIPE": int(pipe), "COLMAJOR": int(colmajor and op == "trsv")}


def source(op: str, n: int, dtype: str, warps: int, pipe: bool = True, colmajor: bool = False) -> str:
    """The full CUDA source of one warp/block kernel: its macros, the common part, then its kernel."""
    from tunedb.families.linalg import kernels_cuda_src as src

    head = "".join(f"#define {k} {v}\n" for k, v in defines(op, n, dtype, warps, pipe, colmajor).items())
    body = src.TRSV if op == "trsv" else src.BLOCK if n > WARP_MAX_N else src.WARP
    return head + src.COMMON + body


def arm_source(op: str, cid: str, n: int, dtype: str, colmajor: bool = False) -> str:
    """The full CUDA source of the arm `cid` at (op, n, dtype): its macros, the common part, its kernel."""
    from tunedb.families.linalg import kernels_cuda_blocked_src as bsrc
    from tunedb.families.linalg import kernels_cuda_src as src

    kind = id_kind(cid)
    if kind is None:
        raise ValueError(f"not an id of the CUDA tier: {cid!r}")
    name, args = kind
    if name == "warp":
        return source(op, n, dtype, args[1], args[2], colmajor)
    macros, body = {"tile": (lambda: tile.defines(op, n, dtype, args[0], colmajor), tile.SOURCE),
                    "wide": (lambda: wide.defines(op, n, dtype, args[1]), wide.SOURCE),
                    "blocked": (lambda: blocked.defines(op, n, dtype, *args), bsrc.SOURCE)}[name]
    return "".join(f"#define {k} {v}\n" for k, v in macros().items()) + src.COMMON + body


def _kernel(op: str, cid: str, n: int, dtype: str, device: int, cubin: Any = None, colmajor: bool = False) -> Any:
    """The loaded kernel (compiled here, or from `cubin`: (binary, lowered name) of NVRTC)."""
    key = (op, dtype, n, cid, colmajor, device)
    kern = _KERNELS.get(key)
    if kern is None:
        import torch

        with torch.cuda.device(device):
            if cubin is None:
                kern = torch.cuda._compile_kernel(arm_source(op, cid, n, dtype, colmajor), "tunedb_linalg")
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

    def one(item: tuple[str, str, int, str, bool]) -> tuple[Any, str | None]:
        op, cid, n, dtype, colmajor = item
        try:
            text = arm_source(op, cid, n, dtype, colmajor)
            if _nvrtc_compile is None:
                return None, None
            return _nvrtc_compile(text, "tunedb_linalg", arch), None
        except Exception as exc:  # reported to the caller, which decides
            return None, f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"

    # trsv in both of L's layouts (row-major; column-major as torch.linalg.cholesky returns it)
    todo = sorted({(op, cid, n, dt, cm) for op, cid, n, dt in items for cm in ((False, True) if op == "trsv" else (False,))})
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built = list(pool.map(one, todo))
    failed = []
    for (op, cid, n, dtype, colmajor), (cubin, err) in zip(todo, built):
        if err is None:
            try:
                _kernel(op, cid, n, dtype, device, cubin, colmajor)
            except Exception as exc:
                err = f"{op} {cid} n={n} {dtype}: {type(exc).__name__}: {exc}"
        if err:
            failed.append(err)
    return failed


def _allow_smem(kern: Any, nbytes: int) -> None:
    """Let `kern` take `nbytes` of dynamic shared memory (past 48 KiB the driver wants an opt-in);
    torch's `set_shared_memory_config` where this torch has it, else the driver call itself."""
    if getattr(kern, "_tunedb_smem", 0) >= nbytes:
        return
    if hasattr(kern, "set_shared_memory_config"):
        kern.set_shared_memory_config(nbytes)
    elif nbytes >= 48 * 1024:
        from torch.cuda._utils import _get_gpu_runtime_library

        max_dynamic_smem = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        if _get_gpu_runtime_library().cuFuncSetAttribute(kern.func, max_dynamic_smem, nbytes) != 0:
            raise RuntimeError(f"the driver refused {nbytes} B of dynamic shared memory for a linalg kernel")
    kern._tunedb_smem = nbytes


def geometry(op: str, cid: str, n: int, batch: int) -> tuple[int, int]:
    """(blocks, threads a block) of the arm `cid` over `batch` problems (a valid id)."""
    name, args = id_kind(cid)
    if name == "blocked":  # one problem a block of W warps
        return batch, 32 * args[1]
    if name == "tile":  # one problem a block of one thread a lower tile
        return batch, tile.block_threads(op, n, args[0])
    return -(-batch // args[0]), 32 * args[1]  # wide: 32 / L problems a warp; warp/block: P a block


def launch(op: str, cid: str, tensors: tuple, out: Any, n: int, batch: int, dtype: str) -> Any:
    """Run the tier's config `cid` on CUDA tensors (launch.py checked shapes and made `out`);
    returns (L or x, info), or x for trsv."""
    import torch

    why = arm_invalid(op, cid, n, dtype)
    if why:
        raise ValueError(why)
    a = tensors[0]
    if not a.is_cuda:
        raise ValueError(f"{cid} runs on CUDA tensors only, got {a.device}")
    if batch >= 2 ** 31:
        raise ValueError(f"{cid} takes batch < 2**31, got {batch}")
    info = torch.empty((batch,), dtype=torch.int32, device=a.device) if op != "trsv" else None
    if batch == 0:
        return out if info is None else (out, info)
    # trsv reads a column-major L as given (torch.linalg.cholesky's layout): no copy in its time
    colmajor = op == "trsv" and not a.is_contiguous() and a.mT.is_contiguous()
    args = [t if t.is_contiguous() or (k == 0 and colmajor) else t.contiguous() for k, t in enumerate(tensors)]
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    kern = _kernel(op, cid, n, dtype, device, colmajor=colmajor)
    b = args[1] if op in ("posv", "trsv") else args[0]  # potrf's kernel never reads B
    grid, threads = geometry(op, cid, n, batch)
    dynamic = arm_smem(op, cid, n, dtype) if id_kind(cid)[0] == "blocked" else 0
    if dynamic:
        _allow_smem(kern, dynamic)
    kern(grid=(grid, 1, 1), block=(threads, 1, 1),
         args=[args[0], b, out, info if info is not None else out, batch],  # trsv never touches INFO
         shared_mem=dynamic, stream=torch.cuda.current_stream(a.device))
    return out if info is None else (out, info)
