"""The small batched linear-algebra ladder (issue 19): every arm on one ns-per-problem axis.

    PYTHONPATH=src python bench/linalg_ladder.py --out ladder.json [--ops potrf,posv] [--n 4,8]
        [--batch 4096] [--dtypes fp32] [--cap 5] [--rounds 9] [--budget-s 230] [--plan] [--quick|--goal]

--goal: exactly the goal cells of "potrf and posv, n <= 32: >= 10x geomean over torch" (potrf,
posv x n 4, 8, 16, 32 x batch 256, 4096, 65536 x fp32, fp64: 48 cells), --cap 14 (by the prior's
rotation: three lane configs, three warp, two block, one thread where valid, two reg configs
where reg runs: fp32 n <= 16, fp64 n <= 12, and two rows configs where rows runs (n <= 32, from the second turn of the rotation on where reg does not run),
kernels_rows.py, session 15; the 14th turn is the shfl config, kernels_shfl.py, session 18, timed
in the best Triton arm and the best-overall columns) and --budget-s 200 unless given. Each cell reports
the best of the older packings (thread/warp/block), the best lane config (kernels_lane.py,
session 13), the best reg config (kernels_reg.py, session 14) and the best rows config
(kernels_rows.py, session 15) beside torch, and the summary
their geomeans over the cells, with the geomean of the best arm without reg (what the table
served before reg and rows). `--goal --n 16,32` is the rows packing's half (24 cells, about
60-100 s with its compile). Expected on an H200: about 40 s compiling (the lane and reg kernels are
unrolled), then 48 cells in 70-140 s.

--quick: only the goal cells (potrf, posv, gemm, gemv at n in 4, 8, 16, 32 x batch 4096, 65536
x fp32, fp64: 64 cells), with --cap 6 and --budget-s 100 unless given; an explicit --ops/--n/--batch/--dtypes
still narrows it. About 60-90 s on an H200 (the full grid's 216 cells took 142 s, 9 s of it
compiling; the quick cells are the heavier half of the batches).

Per cell (op, dtype, n, batch): the torch arm (the capturable forms, in CUDA graphs: bmm for
dot/gemv/gemm, cholesky_ex, solve_triangular, cholesky_ex + two solve_triangular for posv),
for potrf/posv also the checked eager forms a user of the obvious API pays (torch.linalg.cholesky,
torch.cholesky_solve; timed eagerly, never servable in a graph), and the Triton configs the
validity predicate admits (at most --cap per cell, by kernels_prior.candidates' prior for the
cell's batch, every packing kept). All arms go through launch.launch.

Timing: each arm is a CUDA graph of R launches, launch i on ring slot i; the ring's slots are
refilled from a pristine copy before every replay, outside the timed region, so an in-place
arm (potrf, posv, trsv are timed in place for Triton, as a user's in-place solver call) always
consumes a fresh valid system. R is what fits --ring-gib (2..32). Rounds (>= 9) shuffle the arm
order; the per-launch median is reported, and every raw sample is written to the JSON.
Before timing, each arm is checked on the cell's inputs (first 2048 problems): residual within
8x of torch's (kernels_check.within_torch); a failing arm is reported and never the winner.

Floors: bytes moved at 4.3 TB/s, or flops at an assumed peak (fp32 60, fp64 45 TFLOP/s),
whichever is larger; cells are reported against max(floor, 3 us).
Expected run time on an H200 (estimated, not yet measured): compiling the grid's ~450 kernels
in 15 processes about 1 minute, then about 0.3-1.5 s per cell (216 cells), so the full grid
may not fit 4 minutes: --budget-s (default 230) stops starting new cells (goal cells first:
potrf/posv n <= 32, then gemm/gemv n <= 16, then the rest) and the JSON lists what was skipped;
split the grid over two calls with --ops when it does not fit.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time

OPS = ("potrf", "posv", "gemm", "gemv", "trsv", "dot")
NS = (4, 8, 16, 32, 64, 128)
BATCHES = (256, 4096, 65536)
DTYPES = ("fp32", "fp64")
BW_BYTES_PER_US = 4.3e6
PEAK_FLOP_PER_US = {"fp32": 60e6, "fp64": 45e6, "fp16": 60e6, "bf16": 60e6}
MIN_US = 3.0
INPLACE = ("potrf", "posv", "trsv")
QUICK = {"ops": ("potrf", "posv", "gemm", "gemv"), "n": (4, 8, 16, 32), "batch": (4096, 65536),
         "dtypes": ("fp32", "fp64"), "budget_s": 100.0, "cap": 6}
GOAL = {"ops": ("potrf", "posv"), "n": (4, 8, 16, 32), "batch": (256, 4096, 65536),
        "dtypes": ("fp32", "fp64"), "budget_s": 200.0, "cap": 14}
NEW_PACKINGS = ("lane_", "reg_", "rows_", "shfl_")  # config-id prefixes of the packings added in sessions 13, 14, 15, 18


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False, default="linalg_ladder.json")
    ap.add_argument("--md", default=None, help="markdown table path (default: --out with .md)")
    ap.add_argument("--ops", type=_csv(str), default=None)
    ap.add_argument("--n", type=_csv(int), default=None)
    ap.add_argument("--batch", type=_csv(int), default=None)
    ap.add_argument("--dtypes", type=_csv(str), default=None)
    ap.add_argument("--quick", action="store_true", help="the s9 quick cells (see above)")
    ap.add_argument("--goal", action="store_true", help="potrf/posv n <= 32, all three batches (see above)")
    ap.add_argument("--cap", type=int, default=None, help="Triton configs per cell (0: every valid one; default 5, --quick: 6)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--budget-s", type=float, default=None, help="default 230 (--quick: 100)")
    ap.add_argument("--ring-gib", type=float, default=4.0)
    ap.add_argument("--jobs", type=int, default=None, help="compile processes")
    ap.add_argument("--plan", action="store_true", help="print the cells and arms, measure nothing")
    args = ap.parse_args(argv)
    fill = GOAL if args.goal else QUICK if args.quick else {"ops": OPS, "n": NS, "batch": BATCHES, "dtypes": DTYPES, "budget_s": 230.0, "cap": 5}
    for name, value in fill.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    from tunedb.families.linalg import kernels_space as space
    from tunedb.families.linalg import kernels_prior as prior

    for op in args.ops:
        if op not in space.OPS:
            ap.error(f"--ops: {op!r} is not one of {', '.join(space.OPS)}")
    for dt in args.dtypes:
        if dt not in ("fp32", "fp64", "fp16", "bf16"):
            ap.error(f"--dtypes: {dt!r} is not one of fp32, fp64, fp16, bf16")
    for n in args.n:
        if not space.N_MIN <= n <= space.N_MAX:
            ap.error(f"--n: {n} is outside {space.N_MIN}..{space.N_MAX}")
    if args.rounds < 9:
        ap.error(f"--rounds {args.rounds}: at least 9 rounds")
    return args


def priority(cell):
    op, dt, n, batch = cell
    goal = 0 if op in ("potrf", "posv") and n <= 32 else 1 if op in ("gemm", "gemv") and n <= 16 else 2
    return (goal, DTYPES.index(dt) if dt in DTYPES else 2, OPS.index(op), n, batch)


def plan(args):
    """[(cell, [config ids])] in measuring order; cells with an op/dtype pair that cannot run dropped."""
    from tunedb.families.linalg import kernels_space as space

    cells = []
    for op in args.ops:
        for dt in args.dtypes:
            if dt in ("fp16", "bf16") and op not in space.HALF_OPS:
                continue
            for n in args.n:
                for b in args.batch:
                    ids = [c.id for c in prior.candidates(op, n, dt, cap=args.cap or None, batch=b)]
                    cells.append(((op, dt, n, b), ids))
    return sorted(cells, key=lambda c: priority(c[0]))


def floor_us(op, dt, n, batch):
    size = {"fp32": 4, "fp64": 8, "fp16": 2, "bf16": 2}[dt]
    mat, vec = n * n, n
    elems = {"dot": 2 * vec + 1, "gemv": mat + 2 * vec, "gemm": 3 * mat, "potrf": 2 * mat,
             "trsv": mat + 2 * vec, "posv": mat + 2 * vec}[op]
    flops = {"dot": 2 * n, "gemv": 2 * n * n, "gemm": 2 * n ** 3, "potrf": n ** 3 / 3,
             "trsv": n * n, "posv": n ** 3 / 3 + 2 * n * n}[op]
    return max(elems * size * batch / BW_BYTES_PER_US, flops * batch / PEAK_FLOP_PER_US[dt])


class Cell:
    """One cell's ring of inputs and its arms' graphs."""

    def __init__(self, cell, ring_gib, seed):
        import torch

        from tunedb.families.linalg import kernels_check as check

        self.op, self.dt, self.n, self.batch = cell
        self.pristine = check.make_inputs(self.op, self.batch, self.n, self.dt, device="cuda", seed=seed)
        slot = sum(t.numel() * t.element_size() for t in self.pristine)
        self.R = int(max(2, min(32, ring_gib * 2 ** 30 // max(slot, 1))))
        self.ring = [t.new_empty((self.R, *t.shape)) for t in self.pristine]
        self.refill()
        self.pool = torch.cuda.graph_pool_handle()

    def refill(self):
        for r, t in zip(self.ring, self.pristine):
            r.copy_(t.unsqueeze(0).expand_as(r))

    def body(self, arm):
        from tunedb.families.linalg.launch import launch

        inplace = self.op in INPLACE and not arm.startswith("torch")

        def run():
            for i in range(self.R):
                launch(self.op, arm, *(r[i] for r in self.ring), inplace=inplace)
        return run

    def graph(self, arm):
        import torch

        run = self.body(arm)
        run()  # first launches (handles, workspaces) stay out of the capture
        torch.cuda.synchronize()
        self.refill()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            run()
        torch.cuda.synchronize()
        return g


def check_arm(cell, arm, ref_cache):
    """(ok, worst residual, bound) on the first 2048 problems of the cell's inputs."""
    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    ins = tuple(t[:2048].clone() for t in cell.pristine)
    if "torch" not in ref_cache:
        ref_ins = ins if cell.dt in ("fp32", "fp64") else tuple(t.float() for t in ins)
        ref_cache["torch"] = launch(cell.op, "torch", *ref_ins)
    res = launch(cell.op, arm, *tuple(t.clone() for t in ins))
    ok, worst, bound = check.within_torch(cell.op, cell.dt, ins, res, ref_cache["torch"])
    if cell.op in ("potrf", "posv") and bool(res[1].any()):
        ok = False
    return ok, worst, bound


def measure_cell(cell_key, arms, args, seed):
    import torch

    cell = Cell(cell_key, args.ring_gib, seed)
    op = cell.op
    all_arms = ["torch"] + (["torch_checked"] if op in ("potrf", "posv") else []) + list(arms)
    info = {}
    ref_cache = {}
    graphs = {}
    for arm in all_arms:
        rec = {"kind": "eager" if arm == "torch_checked" else "graph"}
        try:
            rec["ok"], rec["residual"], rec["bound"] = check_arm(cell, arm, ref_cache)
            if arm != "torch_checked":
                graphs[arm] = cell.graph(arm)
        except Exception as exc:  # an arm that cannot run is reported, not fatal
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        rec["samples_us"] = []
        info[arm] = rec
    timed = [a for a in all_arms if "error" not in info[a]]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        order = timed[:]
        random.shuffle(order)
        for arm in order:
            cell.refill()
            torch.cuda.synchronize()
            start.record()
            if arm in graphs:
                graphs[arm].replay()
            else:
                cell.body(arm)()
            end.record()
            end.synchronize()
            info[arm]["samples_us"].append(start.elapsed_time(end) * 1000.0 / cell.R)
    fl = floor_us(op, cell.dt, cell.n, cell.batch)
    target = max(fl, MIN_US)
    base = None
    for arm in timed:
        med = statistics.median(info[arm]["samples_us"])
        info[arm].update(median_us=med, ns_per_problem=med * 1000.0 / cell.batch, x_floor=med / target)
        if arm == "torch":
            base = med
    for arm in timed:
        info[arm]["speedup_vs_torch"] = base / info[arm]["median_us"] if base else None
    servable = [a for a in timed if info[a]["ok"] and info[a]["kind"] == "graph"]
    triton = [a for a in servable if not a.startswith("torch")]
    best_triton = min(triton, key=lambda a: info[a]["median_us"]) if triton else None
    old = [a for a in triton if not a.startswith(NEW_PACKINGS)]
    new = [a for a in triton if a.startswith("lane_")]
    reg = [a for a in triton if a.startswith("reg_")]
    rows = [a for a in triton if a.startswith("rows_")]
    best_old = min(old, key=lambda a: info[a]["median_us"]) if old else None
    best_new = min(new, key=lambda a: info[a]["median_us"]) if new else None
    best_reg = min(reg, key=lambda a: info[a]["median_us"]) if reg else None
    best_rows = min(rows, key=lambda a: info[a]["median_us"]) if rows else None
    before = [a for a in servable if not a.startswith(("reg_", "rows_", "shfl_"))]  # what could be served before reg
    best_before = min(before, key=lambda a: info[a]["median_us"]) if before else None
    best = min(servable, key=lambda a: info[a]["median_us"]) if servable else None
    del graphs, cell
    torch.cuda.empty_cache()
    return {"op": op, "dtype": cell_key[1], "n": cell_key[2], "batch": cell_key[3], "floor_us": fl,
            "target_us": target, "arms": info, "best_triton": best_triton, "best": best,
            "best_old": best_old, "best_new": best_new, "best_reg": best_reg, "best_rows": best_rows,
            "best_before_reg": best_before,
            "wrong": [a for a in all_arms if not info[a]["ok"]]}


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summarize(cells):
    def speed(c):
        bt = c["best_triton"]
        return c["arms"][bt]["speedup_vs_torch"] if bt else None

    def speed_of(c, key):
        arm = c.get(key)
        return c["arms"][arm]["speedup_vs_torch"] if arm else None

    goal = [c for c in cells if c["op"] in ("potrf", "posv") and c["n"] <= 32]
    fact = [speed(c) for c in goal]
    small = [speed(c) for c in cells if c["op"] in ("gemm", "gemv") and c["n"] <= 16]
    served = [c["arms"][c["best"]]["x_floor"] for c in cells if c["best"]]
    return {
        "cells": len(cells),
        "potrf_posv_n_le_32_geomean_speedup": geomean(fact), "potrf_posv_cells": len(fact),
        "potrf_posv_geomean_old_packings": geomean([speed_of(c, "best_old") for c in goal]),
        "potrf_posv_geomean_lane_packing": geomean([speed_of(c, "best_new") for c in goal]),
        "potrf_posv_cells_lane_wins": sum(1 for c in goal if c.get("best_new") and c["best_new"] == c["best_triton"]),
        "potrf_posv_geomean_reg_packing": geomean([speed_of(c, "best_reg") for c in goal]),
        "potrf_posv_cells_with_reg": sum(1 for c in goal if c.get("best_reg")),
        "potrf_posv_cells_reg_wins": sum(1 for c in goal if c.get("best_reg") and c["best_reg"] == c["best_triton"]),
        "potrf_posv_geomean_rows_packing": geomean([speed_of(c, "best_rows") for c in goal]),
        "potrf_posv_cells_with_rows": sum(1 for c in goal if c.get("best_rows")),
        "potrf_posv_cells_rows_wins": sum(1 for c in goal if c.get("best_rows") and c["best_rows"] == c["best_triton"]),
        "potrf_posv_geomean_best_without_reg": geomean([speed_of(c, "best_before_reg") for c in goal]),
        "potrf_posv_cells_within_3x_target_without_reg": sum(
            1 for c in goal if c.get("best_before_reg") and c["arms"][c["best_before_reg"]]["x_floor"] <= 3.0),
        "potrf_posv_cells_within_3x_target": sum(1 for c in goal if c["best"] and c["arms"][c["best"]]["x_floor"] <= 3.0),
        "gemm_gemv_n_le_16_geomean_speedup": geomean(small), "gemm_gemv_cells": len(small),
        "cells_triton_slower_than_torch": sum(1 for c in cells if (speed(c) or 0) < 1.0),
        "cells_best_within_3x_target": sum(1 for x in served if x <= 3.0), "cells_with_best": len(served),
        "wrong_arms": sorted({f"{c['op']} {c['dtype']} n={c['n']}: {a}" for c in cells for a in c["wrong"]}),
    }


def markdown(cells, summary):
    lines = ["| op | dtype | n | batch | torch us | checked us | best Triton | us | ns/problem | speedup | x max(floor,3us) | best old | x | best lane | x | best reg | x | best rows | x |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        a = c["arms"]
        t = a["torch"].get("median_us")
        chk = a.get("torch_checked", {}).get("median_us")
        bt = c["best_triton"]
        b = a[bt] if bt else {}
        lines.append(f"| {c['op']} | {c['dtype']} | {c['n']} | {c['batch']} | {t and f'{t:.1f}'} | "
                     f"{chk and f'{chk:.1f}' or '-'} | {bt or '-'} | {b.get('median_us', 0):.1f} | "
                     f"{b.get('ns_per_problem', 0):.2f} | {(b.get('speedup_vs_torch') or 0):.2f}x | "
                     f"{b.get('x_floor', 0):.2f} | {_arm_cell(c, 'best_old')} | {_arm_cell(c, 'best_new')} | "
                     f"{_arm_cell(c, 'best_reg')} | {_arm_cell(c, 'best_rows')} |")
    lines += ["", "```", json.dumps(summary, indent=1), "```"]
    return "\n".join(lines) + "\n"


def _arm_cell(c, key):
    arm = c.get(key)
    if not arm:
        return "- | -"
    a = c["arms"][arm]
    return f"{arm} {a['median_us']:.1f} us | {(a.get('speedup_vs_torch') or 0):.2f}x"


def main(argv=None):
    args = parse_args(argv)
    cells = plan(args)
    if args.plan:
        for key, ids in cells:
            print(*key, ",".join(ids))
        print(f"{len(cells)} cells, {len({(k[0], k[1], k[2], i) for k, ids in cells for i in ids})} kernels")
        return 0
    import torch

    from tunedb.families.linalg import kernels_prebuild

    if not torch.cuda.is_available():
        print("linalg_ladder: needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    items = sorted({(k[0], i, k[2], k[1]) for k, ids in cells for i in ids})
    compile_failures = kernels_prebuild.compile_all(items, args.jobs)
    compile_s = time.time() - t0
    print(f"compiled {len(items)} kernels in {compile_s:.1f} s ({len(compile_failures)} failed)", flush=True)
    done, skipped = [], []
    for i, (key, ids) in enumerate(cells):
        if time.time() - t0 > args.budget_s:
            skipped.append(list(key))
            continue
        res = measure_cell(key, ids, args, seed=i)
        done.append(res)
        bt = res["best_triton"]
        t = res["arms"]["torch"].get("median_us")
        b = res["arms"][bt] if bt else {}
        print(f"{key[0]:5s} {key[1]} n={key[2]:3d} b={key[3]:5d}: torch {t and round(t, 1)} us, "
              f"best {bt} {bt and round(b['median_us'], 1)} us {bt and round(b['ns_per_problem'], 2)} ns/problem "
              f"({bt and round(b['speedup_vs_torch'], 2)}x torch, {bt and round(b['x_floor'], 2)}x floor); "
              f"old {_arm_cell(res, 'best_old')}; lane {_arm_cell(res, 'best_new')}; reg {_arm_cell(res, 'best_reg')}; "
              f"rows {_arm_cell(res, 'best_rows')}"
              f"{' WRONG ' + str(res['wrong']) if res['wrong'] else ''}", flush=True)
    summary = summarize(done)
    summary.update(compile_s=compile_s, compile_failures=compile_failures, skipped_cells=len(skipped),
                   wall_s=time.time() - t0)
    try:
        from tunedb.bench.provenance import collect

        prov = collect().__dict__
    except Exception as exc:  # provenance is best effort; the measurements stand without it
        prov = {"error": str(exc)}
    out = {"provenance": prov, "args": {k: v for k, v in vars(args).items()}, "summary": summary,
           "cells": done, "skipped": skipped}
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f)
    import os

    os.replace(args.out + ".tmp", args.out)
    md = args.md or (args.out.rsplit(".", 1)[0] + ".md")
    with open(md, "w") as f:
        f.write(markdown(done, summary))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
