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

import torch

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


def launcher(op: str, dt: str, n: int, bpb):
    """(call(a, b, out, info), solver): the family's cuSOLVERDx kernel (kernels_nvmath._build:
    problems loaded into shared memory, A's lower triangle only, factorize or factorize +
    solve, a NaN pivot found on L's diagonal) at any batches_per_block, launched on torch's
    current stream. Calls B and D (session 19) ran this script's own copy of the kernel, which
    loaded all of A and had no NaN scan (this file at 7fc1103); the timed work is the
    library's factorize/solve either way."""
    from tunedb.families.linalg import kernels_nvmath as nv

    kernel, solver, dyn = nv._build(op, dt, n, bpb)
    cuda = nv._numba_cuda()
    opted = []

    def call(a, b, out, info):
        args = [cuda.as_cuda_array(a)] + ([cuda.as_cuda_array(b)] if op == "posv" else []) + [
            cuda.as_cuda_array(out), cuda.as_cuda_array(info), a.shape[0]]
        if dyn and not opted:
            nv._opt_in(kernel, args, dyn, torch.cuda.current_device())
            opted.append(True)
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        kernel[-(-a.shape[0] // solver.batches_per_block), solver.block_dim, stream, dyn](*args)
    return call, solver


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
        from tunedb.families.linalg import kernels_nvmath

        kernels_nvmath._numba_cuda()  # numba.cuda after the family's row_stack alias
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
                        call, solver = launcher(op, dt, n, bpb)
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
