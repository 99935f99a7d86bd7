"""Does the optional dependency tier of the small linear-algebra family (spec 003: nvmath-python's
cuSOLVERDx device API) run on the device, and how fast is it? A probe (issue 19), ONE run.

    python bench/nvmath_probe.py --out DIR [--ns 8,16,32] [--budget-s 200]

Needs nvmath-python >= 0.9 with its device extra importable (bench/device_s19.sh's nvmath stage
installs the carried wheels into a target directory first). For each (op in potrf/posv, dtype
fp32/fp64, n) it builds a cuSOLVERDx CholeskySolver (Block execution, lower fill, A row-major,
B column-major; batches_per_block and block_dim as the library suggests, and 1 problem a block),
a numba-cuda kernel that loads each problem from the caller's [batch, n, n] tensor into shared
memory, factorizes (and for posv solves), and stores L (zeros above the diagonal) or x and info;
launched on torch's current stream (numba external stream), so it captures into torch's CUDA
graphs. Per (op, dtype, n, batch in 256/4096/65536): the arm checked against fp64 torch
(relative residual), then timed beside the capturable torch arm (cholesky_ex, + two
solve_triangular for posv, as the family's `torch` arm) in the same process: a CUDA graph of
`reps` calls replayed 7 times, median / reps. Prints one row per cell and writes DIR/nvmath_probe.json
after every cell (compile seconds, versions, errors).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

if not hasattr(np, "row_stack"):  # numpy 2.4 removed it; numba-cuda 0.30 still overloads it at import
    np.row_stack = np.vstack

BATCHES = (256, 4096, 65536)
DISTS = ("numba", "numba-cuda", "cuda-core", "cuda-bindings", "cuda-python", "llvmlite", "nvmath-python",
         "nvidia-libmathdx-cu13", "nvidia-cuda-cccl", "nvidia-cuda-nvrtc", "nvidia-nvjitlink", "cuda-pathfinder",
         "nvidia-cuda-nvrtc-cu13", "nvidia-nvjitlink-cu13")


def trace() -> str:
    """The traceback without the library listings some loaders append, head and tail kept."""
    lines = [x for x in traceback.format_exc().splitlines() if not x.strip().startswith("lib") and x.strip() != "stubs"]
    text = "\n".join(lines)
    return text if len(text) <= 4000 else text[:2000] + "\n...\n" + text[-2000:]


def versions() -> dict:
    out = {}
    for d in DISTS:
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    return out


def build_kernel(op: str, dt: str, n: int, bpb):
    from numba import cuda
    from nvmath.device import CholeskySolver

    prec = {"fp32": np.float32, "fp64": np.float64}[dt]
    s = CholeskySolver(size=(n,), precision=prec, execution="Block", fill_mode="lower",
                       arrangement=("row_major", "col_major"), batches_per_block=bpb, block_dim="suggested")
    na, nb = s.a_size(), s.b_size()
    dyn = (na + nb) * np.dtype(prec).itemsize > 48 * 1024  # past the static limit: dynamic, opted in
    per = s.batches_per_block
    sa0, sa1, sa2 = s.a_strides()
    sb0, sb1, _ = s.b_strides()
    nn = n * n
    vt = s.value_type

    if op == "potrf":
        @cuda.jit
        def kernel(A, L, INFO, batch):
            if dyn:
                smem_a = cuda.shared.array(0, dtype=vt)[:na]
            else:
                smem_a = cuda.shared.array(na, dtype=vt)
            base = cuda.blockIdx.x * per
            tid = cuda.threadIdx.x
            nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
            tid = tid + cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.z * cuda.blockDim.x * cuda.blockDim.y
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                v = 1.0 if r == c else 0.0
                if base + p < batch:
                    v = A[base + p, r, c]
                smem_a[p * sa0 + r * sa1 + c * sa2] = v
            cuda.syncthreads()
            s.factorize(smem_a, INFO[base:])
            cuda.syncthreads()
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                if base + p < batch:
                    L[base + p, r, c] = smem_a[p * sa0 + r * sa1 + c * sa2] if c <= r else 0.0
    else:
        @cuda.jit
        def kernel(A, B, X, INFO, batch):
            if dyn:
                smem_d = cuda.shared.array(0, dtype=vt)
                smem_a = smem_d[:na]
                smem_b = smem_d[na:na + nb]
            else:
                smem_a = cuda.shared.array(na, dtype=vt)
                smem_b = cuda.shared.array(nb, dtype=vt)
            base = cuda.blockIdx.x * per
            tid = cuda.threadIdx.x
            nt = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
            tid = tid + cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.z * cuda.blockDim.x * cuda.blockDim.y
            for idx in range(tid, per * nn, nt):
                p = idx // nn
                r = (idx // n) % n
                c = idx % n
                v = 1.0 if r == c else 0.0
                if base + p < batch:
                    v = A[base + p, r, c]
                smem_a[p * sa0 + r * sa1 + c * sa2] = v
            for idx in range(tid, per * n, nt):
                p = idx // n
                r = idx % n
                v = 0.0
                if base + p < batch:
                    v = B[base + p, r]
                smem_b[p * sb0 + r * sb1] = v
            cuda.syncthreads()
            s.factorize(smem_a, INFO[base:])
            cuda.syncthreads()
            s.solve(smem_a, smem_b)
            cuda.syncthreads()
            for idx in range(tid, per * n, nt):
                p = idx // n
                r = idx % n
                if base + p < batch:
                    X[base + p, r] = smem_b[p * sb0 + r * sb1]
    return kernel, s, ((na + nb) * np.dtype(prec).itemsize if dyn else 0)


def opt_in_smem(kernel, args, nbytes):
    """Raise the kernel's dynamic shared memory limit past 48 KiB (cuFuncSetAttribute)."""
    import numba
    from cuda.bindings import driver

    compiled = kernel.compile(tuple(numba.typeof(a) for a in args))
    handle = compiled.library.get_cufunc().handle
    handle = getattr(handle, "value", handle)
    res = driver.cuFuncSetAttribute(handle, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    nbytes)
    if res[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuFuncSetAttribute: {res[0]}")


def launcher(kernel, solver, op, dyn_bytes):
    from numba import cuda

    opted = []

    def call(a, b, out, info):
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        batch = a.shape[0]
        grid = -(-batch // solver.batches_per_block)
        args = [cuda.as_cuda_array(a)] + ([cuda.as_cuda_array(b)] if op == "posv" else []) + [
            cuda.as_cuda_array(out), cuda.as_cuda_array(info), batch]
        if dyn_bytes and not opted:
            opt_in_smem(kernel, args, dyn_bytes)
            opted.append(True)
        kernel[grid, solver.block_dim, stream, dyn_bytes](*args)
    return call


def torch_call(op):
    def call(a, b, out, info):
        factor, inf = torch.linalg.cholesky_ex(a)
        if op == "potrf":
            return factor
        y = torch.linalg.solve_triangular(factor, b.unsqueeze(2), upper=False)
        return torch.linalg.solve_triangular(factor.mT, y, upper=True).squeeze(2)
    return call


def graph_us(fn, reps: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        times.append(st.elapsed_time(en) * 1000.0 / reps)
    return statistics.median(times)


def spd(batch, n, dt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = {"fp32": torch.float32, "fp64": torch.float64}[dt]
    m = torch.randn((batch, n, n), generator=g, device="cuda", dtype=torch.float64)
    a = (m @ m.mT / n + torch.eye(n, device="cuda", dtype=torch.float64)).to(dtype)
    b = torch.randn((batch, n), generator=g, device="cuda", dtype=torch.float64).to(dtype)
    return a, b


def residual(op, a, b, res) -> float:
    a64 = a.double()
    if op == "potrf":
        l = res.double()
        return ((l @ l.mT - a64).flatten(1).norm(dim=1) / a64.flatten(1).norm(dim=1)).max().item()
    x = res.double()
    r = (a64 @ x.unsqueeze(2)).squeeze(2) - b.double()
    return (r.norm(dim=1) / (a64.flatten(1).norm(dim=1) * x.norm(dim=1))).max().item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ns", default="8,16,32")
    ap.add_argument("--ops", default="potrf,posv")
    ap.add_argument("--dts", default="fp32,fp64")
    ap.add_argument("--bpbs", default="suggested,1")
    ap.add_argument("--budget-s", type=float, default=200.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"versions": versions(), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": [],
           "errors": []}
    print(json.dumps(doc["versions"]), flush=True)
    t_start = time.time()
    try:
        t0 = time.time()
        import nvmath.device  # noqa: F401
        doc["import_s"] = time.time() - t0
    except Exception:
        doc["errors"].append({"stage": "import", "trace": trace()})
        print(doc["errors"][-1]["trace"], flush=True)
        (out / "nvmath_probe.json").write_text(json.dumps(doc, indent=1))
        return 1
    for op in args.ops.split(","):
        for dt in args.dts.split(","):
            for n in map(int, args.ns.split(",")):
                for bpb_s in args.bpbs.split(","):
                    if time.time() - t_start > args.budget_s:
                        doc["errors"].append({"stage": "budget", "cell": [op, dt, n, bpb_s]})
                        continue
                    bpb = bpb_s if bpb_s == "suggested" else int(bpb_s)
                    try:
                        t0 = time.time()
                        kernel, solver, dyn_bytes = build_kernel(op, dt, n, bpb)
                        call = launcher(kernel, solver, op, dyn_bytes)
                        a, b = spd(256, n, dt, 1)
                        res = torch.empty_like(a) if op == "potrf" else torch.empty_like(b)
                        info = torch.empty(256, dtype=torch.int32, device="cuda")
                        call(a, b, res, info)
                        torch.cuda.synchronize()
                        compile_s = time.time() - t0
                    except Exception:
                        doc["errors"].append({"stage": "compile", "cell": [op, dt, n, bpb_s],
                                              "trace": trace()})
                        print(doc["errors"][-1]["trace"], flush=True)
                        continue
                    for batch in BATCHES:
                        row = {"op": op, "dtype": dt, "n": n, "bpb": bpb_s, "batches_per_block": solver.batches_per_block,
                               "block_dim": list(solver.block_dim), "batch": batch, "compile_s": round(compile_s, 2)}
                        try:
                            a, b = spd(batch, n, dt, batch + n)
                            res = torch.empty_like(a) if op == "potrf" else torch.empty_like(b)
                            info = torch.full((batch,), -7, dtype=torch.int32, device="cuda")
                            call(a, b, res, info)
                            torch.cuda.synchronize()
                            tres = torch_call(op)(a, b, None, None)
                            row["residual"] = residual(op, a, b, res)
                            row["residual_torch"] = residual(op, a, b, tres)
                            row["info_nonzero"] = int((info != 0).sum().item())
                            reps = 20 if batch <= 4096 else 5
                            row["us"] = graph_us(lambda: call(a, b, res, info), reps)
                            row["torch_us"] = graph_us(lambda: torch_call(op)(a, b, None, None), reps)
                            row["x_torch"] = row["torch_us"] / row["us"]
                        except Exception:
                            row["error"] = trace()
                        doc["rows"].append(row)
                        print(f"{op} {dt} n={n} bpb={bpb_s}->{row['batches_per_block']} block={row['block_dim']} "
                              f"b={batch}: nvmath {row.get('us', float('nan')):.2f} us, torch "
                              f"{row.get('torch_us', float('nan')):.2f} us, x{row.get('x_torch', float('nan')):.2f}, "
                              f"res {row.get('residual', float('nan')):.2e} (torch {row.get('residual_torch', float('nan')):.2e}) "
                              f"info!=0 {row.get('info_nonzero')}, compile {compile_s:.1f} s"
                              + (f" ERROR {row['error'][-300:]}" if "error" in row else ""), flush=True)
                        (out / "nvmath_probe.json").write_text(json.dumps(doc, indent=1))
                        torch.cuda.empty_cache()
    doc["wall_s"] = time.time() - t_start
    (out / "nvmath_probe.json").write_text(json.dumps(doc, indent=1))
    ok = [r for r in doc["rows"] if "x_torch" in r]
    if ok:
        best = {}
        for r in ok:
            k = (r["op"], r["dtype"], r["n"], r["batch"])
            if k not in best or r["us"] < best[k]["us"]:
                best[k] = r
        g = math.exp(sum(math.log(r["x_torch"]) for r in best.values()) / len(best))
        print(f"geomean x torch over {len(best)} cells (best bpb each): {g:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
