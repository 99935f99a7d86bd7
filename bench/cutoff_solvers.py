"""The fused cutoff solvers against the equivalent torch.linalg compositions, all in CUDA graphs.

    PYTHONPATH=src python bench/cutoff_solvers.py --out cutoff_solvers.json [--quick] [--dtypes fp32,fp64]

Per cell (dtype, n, T, batch): random well-conditioned SPD block-tridiagonal systems in the
[L | D | R] strip layout, and four solves, each captured alone in a CUDA graph and timed by
replays between CUDA events (warm-up replays first; median of --reps; warm L2: a solver in a
control loop re-reads its system):

    direct   fused: one Triton kernel over all T block steps (solvers.direct, kernels="fused")
    direct   torch: the same block Cholesky composed per block step from torch.linalg
                    (cholesky_ex, solve_triangular, matmuls; solvers.direct, kernels="torch")
    pcg      fused: block-Jacobi PCG, two launches (solvers.pcg, kernels="fused")
    pcg      torch: the same PCG as batched torch ops per iteration (kernels="torch")

PCG runs exactly --iters iterations on both sides (tol=0: nobody converges early, same work),
so its ratio is per iteration; the fused loop's early exit is extra and shows in the MPC example.
Every result is checked first: the direct solves against an fp64 torch.linalg.solve of the dense
equivalent (a 48-system slice), PCG fused against PCG torch at the same iteration count (5,
before convergence: past it, with tol=0, both iterate on rounding noise and may part).
Prints a table with the ratios (torch time / fused time) and writes JSON (--out).

Expected run time on the H200: 47 s measured (session 10) for both dtypes over the grid (n 4, 8,
16, 32; T 10, 30; batch 256, 4096): about 24 Triton compiles, building the batch-4096 systems on
the host, the captures; --quick about 20-30 s.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from graph_timing import replayed_ms  # bench/ is sys.path[0]; imports torch lazily


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="n 8, 32; T 30; batch 256, 4096; fp32")
    p.add_argument("--dtypes", default="fp32,fp64")
    p.add_argument("--ns", default="4,8,16,32")
    p.add_argument("--steps", default="10,30")
    p.add_argument("--batches", default="256,4096")
    p.add_argument("--iters", type=int, default=20, help="PCG iterations (both sides)")
    p.add_argument("--reps", type=int, default=15)
    return p.parse_args(argv)


def graph_time_us(fn, reps):
    """Median replay time (us) of fn captured alone in a CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # eager first call: Triton compiles here
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    us = replayed_ms(g, reps) * 1e3
    return us, out, g


def cell(dtype_name, n, steps, batch, iters, reps):
    import torch

    from tunedb.cutoff import layout, solvers

    dtype = torch.float32 if dtype_name == "fp32" else torch.float64
    strip, b = layout.random_system(batch, steps, n, dtype=dtype, device="cuda", seed=n * 1000 + steps + batch)
    x0 = torch.zeros_like(b)
    bound = 1e-4 if dtype == torch.float32 else 1e-9
    row = {"dtype": dtype_name, "n": n, "T": steps, "batch": batch, "pcg_iters": iters}
    k = min(batch, 48)
    ref = torch.linalg.solve(layout.to_dense(strip[:k].double()), b[:k].double().reshape(k, -1, 1)).reshape(k, steps, n)
    outs = {}
    for name, fn in (
        ("direct_fused", lambda: solvers.direct(strip, b, kernels="fused")[0]),
        ("direct_torch", lambda: solvers.direct(strip, b, kernels="torch")[0]),
        ("pcg_fused", lambda: solvers.pcg(strip, b, x0, tol=0.0, max_iter=iters, kernels="fused")[0]),
        ("pcg_torch", lambda: solvers.pcg(strip, b, x0, tol=0.0, max_iter=iters, kernels="torch")[0]),
    ):
        us, out, graph = graph_time_us(fn, reps)
        row[f"{name}_us"] = us
        outs[name] = out.clone()
        del graph
    scale = ref.abs().max().item()
    row["direct_fused_err"] = (outs["direct_fused"][:k].double() - ref).abs().max().item() / scale
    row["direct_torch_err"] = (outs["direct_torch"][:k].double() - ref).abs().max().item() / scale
    # PCG checked at 5 iterations, before convergence: past it (tol=0) both iterate on rounding
    # noise and their iterates may part for no fault of either; before it a wrong update shows
    few = min(iters, 5)
    xf = solvers.pcg(strip, b, x0, tol=0.0, max_iter=few, kernels="fused")[0]
    xt = solvers.pcg(strip, b, x0, tol=0.0, max_iter=few, kernels="torch")[0]
    row["pcg_fused_vs_torch"] = (xf.double() - xt.double()).abs().max().item() / scale
    row["pcg_timed_fused_vs_torch"] = (outs["pcg_fused"].double() - outs["pcg_torch"].double()).abs().max().item() / scale
    row["ok"] = row["direct_fused_err"] <= 50 * bound and row["pcg_fused_vs_torch"] <= 50 * bound
    row["direct_ratio"] = row["direct_torch_us"] / row["direct_fused_us"]
    row["pcg_ratio"] = row["pcg_torch_us"] / row["pcg_fused_us"]
    return row


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("cutoff_solvers: needs a CUDA GPU", file=sys.stderr)
        return 2
    ints = lambda s: [int(v) for v in s.split(",")]
    dtypes, ns, steps, batches = args.dtypes.split(","), ints(args.ns), ints(args.steps), ints(args.batches)
    if args.quick:
        dtypes, ns, steps, batches = ["fp32"], [8, 32], [30], [256, 4096]
    t0 = time.perf_counter()
    rows = []
    print(f"cutoff solvers on {torch.cuda.get_device_name()}: CUDA graphs, median of {args.reps} replays (us); "
          f"PCG {args.iters} iterations both sides; ratio = torch / fused")
    print(f"{'dtype':<6}{'n':>4}{'T':>4}{'batch':>7}{'direct fused':>14}{'direct torch':>14}{'ratio':>8}"
          f"{'pcg fused':>12}{'pcg torch':>12}{'ratio':>8}  check")
    for dt in dtypes:
        for n in ns:
            for t in steps:
                for bt in batches:
                    r = cell(dt, n, t, bt, args.iters, args.reps)
                    rows.append(r)
                    print(f"{dt:<6}{n:>4}{t:>4}{bt:>7}{r['direct_fused_us']:>14.1f}{r['direct_torch_us']:>14.1f}"
                          f"{r['direct_ratio']:>7.2f}x{r['pcg_fused_us']:>12.1f}{r['pcg_torch_us']:>12.1f}"
                          f"{r['pcg_ratio']:>7.2f}x  {'ok' if r['ok'] else 'FAIL'} "
                          f"(err {r['direct_fused_err']:.1e}, pcg {r['pcg_fused_vs_torch']:.1e})", flush=True)
                    torch.cuda.empty_cache()

    def geo(key):
        vals = [r[key] for r in rows]
        return float(torch.tensor(vals).log().mean().exp())

    summary = {"direct_geomean": geo("direct_ratio"), "direct_min": min(r["direct_ratio"] for r in rows),
               "pcg_geomean": geo("pcg_ratio"), "pcg_min": min(r["pcg_ratio"] for r in rows),
               "all_checked": all(r["ok"] for r in rows), "wall_s": time.perf_counter() - t0}
    print(f"direct: geomean {summary['direct_geomean']:.2f}x, min {summary['direct_min']:.2f}x; "
          f"pcg: geomean {summary['pcg_geomean']:.2f}x, min {summary['pcg_min']:.2f}x; "
          f"all checked: {summary['all_checked']}; wall {summary['wall_s']:.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "args": vars(args), "rows": rows,
                               "summary": summary}, indent=1) + "\n")
    return 0 if summary["all_checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
