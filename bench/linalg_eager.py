"""Small linear algebra called eagerly: tunedb's entry points against the torch forms a user
would call instead, per call, in one run; and where the host time of tunedb's eager call goes.

    PYTHONPATH=src python bench/linalg_eager.py [--quick] [--profile] [--out JSON]

The family's goals are measured in CUDA graphs, where a launch costs the host nothing. A robotics
or filtering loop written in plain PyTorch calls the ops eagerly, one launch after another from
Python; when a kernel takes a few microseconds the loop runs at the host's pace. Per cell
(op, fp32 unless named, n, batch), interleaved in shuffled rounds (drift hits every column):

- `wall`: eager calls back to back, the stream synchronised before and after a block of R calls;
  wall time of the block / R, median over rounds (what a loop of calls costs);
- `host`: perf_counter around one call with no sync inside (what the host spends issuing it);
- `arm`: the table's pick, `pick>torch` where the eager rule (families/linalg/eager.py) serves
  torch outside a capture;
- `graph`: the same call captured R times in a CUDA graph and replayed, CUDA events / R (the
  device time alone: the bound an eager loop approaches when the host keeps ahead).

Columns for tunedb (the `tunedb.families.linalg.ops.<op>` entry points, shipped sm90 table, TUNEDB_USER_DB=off)
and torch (the library arm's forms: torch.linalg.cholesky_ex; cholesky_ex then two
solve_triangular for posv; solve_triangular; bmm for gemv). `ratio` = torch wall / tunedb wall.
--unseen draws cells nobody tuned instead (seeded): n between and beyond the table's n = 4, 8, 16,
32, 64, 128 and batches off its power-of-two grid, so the graph columns say whether what the
default path serves at an unmeasured size beats torch's forms there.
--profile adds cProfile's top functions by own time over 2000 eager tunedb calls of potrf and
posv (n = 8, batch 4096), so the host path's cost shows by name.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import time

import torch
from op_host_cost import timed  # bench/: host us per call, synchronised every 32 calls

from tunedb.families.linalg import ops as lops
from tunedb.families.linalg import problems


def _spd(batch: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.randn(batch, n, n, device="cuda", dtype=torch.float64)
    return (g @ g.mT + n * torch.eye(n, device="cuda", dtype=torch.float64)).to(dtype)


def _inputs(op: str, n: int, batch: int, dtype: torch.dtype) -> tuple:
    a = _spd(batch, n, dtype)
    b = torch.randn(batch, n, device="cuda", dtype=dtype)
    if op == "trsv":
        return (torch.linalg.cholesky(a).contiguous(), b)
    return (a,) if op == "potrf" else (a, b)


def _fns(op: str, args: tuple) -> dict:
    entry = getattr(lops, op)
    return {"tunedb": lambda: entry(*args), "torch": lambda: problems.torch_arm(op, *args)}


def _wall(fn, reps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def _graph(fn, reps: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / reps)
    return statistics.median(times)


def cell(op: str, n: int, batch: int, dtype: torch.dtype, reps: int, rounds: int) -> dict:
    args = _inputs(op, n, batch, dtype)
    fns = _fns(op, args)
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn()
        walls: dict[str, list[float]] = {k: [] for k in fns}
        hosts: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            names = list(fns)
            random.shuffle(names)
            for k in names:
                walls[k].append(_wall(fns[k], reps))
                hosts[k].extend(timed(fns[k], reps))
        graphs = {}
        for k, fn in fns.items():
            try:
                graphs[k] = _graph(fn, reps)
            except RuntimeError as e:  # a form that syncs cannot be captured
                graphs[k] = None
                print(f"  [{op} n={n} b={batch} {k}: not capturable: {str(e).splitlines()[0][:80]}]")
    row = {"op": op, "dtype": str(dtype).removeprefix("torch."), "n": n, "batch": batch}
    for k in fns:
        row[f"{k}_wall_us"] = statistics.median(walls[k])
        row[f"{k}_host_us"] = statistics.median(hosts[k])
        row[f"{k}_graph_us"] = graphs[k]
    row["ratio"] = row["torch_wall_us"] / row["tunedb_wall_us"]
    if not problems_n_ok(n):  # past the family's n the entry point runs torch's forms
        row["arm"] = row["tier"] = row["eager_arm"] = "torch forms"
        return row
    bound = lops.bound_for(op, *args)
    row["arm"] = bound.config.id
    row["tier"] = bound.tier
    row["eager_arm"] = bound.eager or bound.config.id  # families/linalg/eager.py's rule
    return row


def problems_n_ok(n: int) -> bool:
    from tunedb.families.linalg import signatures

    return signatures.N_MIN <= n <= signatures.N_MAX


def unseen_cells(rng: random.Random, count: int) -> list[tuple]:
    """(op, n, batch, dtype) off the table's grid: n not a power of two (and 160, past the
    family, which the entry points hand to torch's forms), batches off the pow2 ladder, fp64 for
    a quarter.
    Large n keep the batch small enough for torch's forms to finish in a few seconds a cell."""
    cells = set()
    while len(cells) < count:
        op = rng.choice(("potrf", "posv", "trsv", "gemv"))
        n = rng.choice((3, 5, 6, 12, 20, 24, 40, 48, 96, 100, 160))
        batch = rng.choice((7, 100, 1000, 3000, 20000) if n <= 48 else (7, 100, 1000, 3000) if n <= 128 else (7, 100))
        cells.add((op, n, batch, torch.float64 if rng.random() < 0.25 else torch.float32))
    return list(cells)


def profile(op: str, iters: int = 2000) -> str:
    args = _inputs(op, 8, 4096, torch.float32)
    entry = getattr(lops, op)
    with torch.no_grad():
        for _ in range(10):
            entry(*args)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(iters):
            entry(*args)
            if i % 32 == 31:
                torch.cuda.synchronize()
        pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(22)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 8, 32; batch 16, 4096")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--unseen", action="store_true", help="cells off the table's grid (see the docstring)")
    ap.add_argument("--cells", type=int, default=36, help="with --unseen: how many")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default="potrf,posv,trsv,gemv", help="comma-separated subset of the grid's ops")
    ap.add_argument("--out")
    a = ap.parse_args()
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    ns = (8, 32) if a.quick else (4, 8, 16, 32)
    batches = (16, 4096) if a.quick else (16, 512, 4096, 65536)
    grid = [(op, n, batch, dtype) for op in a.ops.split(",") for n in ns for batch in batches
            for dtype in ((torch.float32,) if n != 8 else (torch.float32, torch.float64))]
    if a.unseen:
        grid = sorted((c for c in unseen_cells(random.Random(a.seed), a.cells) if c[0] in a.ops.split(",")), key=lambda c: ("potrf posv trsv gemv".index(c[0]), c[1], c[2]))
    rows = []
    hdr = (f"{'op':6} {'dtype':8} {'n':>3} {'batch':>6} {'arm':18} | {'tunedb wall':>11} {'host':>6} {'graph':>6}"
           f" | {'torch wall':>10} {'host':>6} {'graph':>6} | {'ratio':>6}")
    print(hdr)
    for op, n, batch, dtype in grid:
        r = cell(op, n, batch, dtype, a.reps, a.rounds)
        rows.append(r)

        def g(v):
            return f"{v:6.1f}" if v is not None else "     -"
        print(f"{op:6} {r['dtype']:8} {n:3d} {batch:6d} {(r['arm'] if r['eager_arm'] == r['arm'] else r['arm'] + '>' + r['eager_arm'])[:18]:18} | {r['tunedb_wall_us']:11.1f}"
              f" {r['tunedb_host_us']:6.1f} {g(r['tunedb_graph_us'])} | {r['torch_wall_us']:10.1f}"
              f" {r['torch_host_us']:6.1f} {g(r['torch_graph_us'])} | {r['ratio']:6.2f}x", flush=True)
    ratios = [r["ratio"] for r in rows]
    geo = statistics.geometric_mean(ratios)
    print(f"\ncells {len(rows)}; torch wall / tunedb wall: geomean {geo:.3f}x, min {min(ratios):.3f}x, "
          f"cells below 1.0x: {sum(x < 1 for x in ratios)}")
    graphs = [r["torch_graph_us"] / r["tunedb_graph_us"] for r in rows if r["torch_graph_us"] and r["tunedb_graph_us"]]
    if graphs:
        print(f"graph: torch / tunedb geomean {statistics.geometric_mean(graphs):.3f}x, min {min(graphs):.3f}x, "
              f"cells below 1.0x: {sum(x < 1 for x in graphs)} of {len(graphs)}")
    prof = {}
    if a.profile:
        for op in ("potrf", "posv"):
            prof[op] = profile(op)
            print(f"\n== cProfile, eager tunedb.linalg.{op} fp32 n=8 batch 4096, 2000 calls ==\n{prof[op]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "geomean": geo, "profile": prof,
                       "torch": torch.__version__, "device": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
