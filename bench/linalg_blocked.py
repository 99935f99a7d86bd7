"""potrf/posv's new arms (session 18, kernels_shfl.py) beside torch and the shipped pick, where the goal falls short.

    python bench/linalg_blocked.py --quick --out linalg_blocked.json [--table PATH]   (repository root)
    python bench/linalg_blocked.py --quick --packings panel --ops potrf,posv,trsv --n 16,32,64,128

The second form (session 20) times the panel packing (kernels_panel.py) at every batch of the
grid for the named ops and n instead of the goal cells below.

The cells (docs/linalg_goal_gap.md): potrf and posv at n = 16 and 32 x batch 256, 4096, 65536 x
fp32, fp64 (24 cells) and potrf at n = 4 and 8, batch 256 (4 cells). Per cell: torch (the
capturable library arm), the arm the shipped table serves at that batch (its regions), and
every new arm the validity predicate admits there (the shfl packing: one config per n). Timed
with the family's own timer (gputimer.GraphTimer, as `tunedb linalg tune` times: CUDA graphs of
a ring of fresh SPD systems restored before every replay, outside the timed window), rounds in
a shuffled order, the median per arm. Each arm is first gated (residual against fp64 within
the family's verify factor of torch's; info 0 on SPD input): a failing arm is reported, not timed.

Printed per cell: us per call of each arm, x torch (torch's time over the arm's) and x floor
(the arm's time over max(bytes at 4.3 TB/s, 3 us), the goal's 3x rule: bench/linalg_ladder's
floor_us), the best new arm against the shipped pick, and the geomean x torch over the cells of
the shipped pick and of the better of (shipped, best new) per cell. The shipped table's own
recorded time of the served arm is printed beside (`table us`) to show drift between runs.

Every kernel is compiled first in a pool of processes (kernels_prebuild), untimed: the unrolled
n = 32 kernels take 10-30 s each to compile. Expected on an H200: --quick (5 rounds) about
40 s of compiling and 20-30 s of timing (under 90 s); without --quick 9 rounds, about 100 s.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))  # without PYTHONPATH=src too
from linalg_ladder import MIN_US, floor_us  # noqa: E402

DEFAULT_TABLE = Path(__file__).resolve().parents[1] / "src" / "tunedb" / "db" / "sm90" / "linalg.json"
NEW_PACKINGS = ("shfl",)


def cells(ops=None, ns=None) -> list[tuple[str, str, int, int]]:
    if ops or ns:
        return [(op, dt, n, b) for op in (ops or ("potrf", "posv")) for dt in ("fp32", "fp64")
                for n in (ns or (16, 32)) for b in (256, 4096, 65536)]
    out = [(op, dt, n, b) for op in ("potrf", "posv") for dt in ("fp32", "fp64") for n in (16, 32)
           for b in (256, 4096, 65536)]
    out += [("potrf", dt, n, 256) for dt in ("fp32", "fp64") for n in (4, 8)]
    return out


def shipped(table: dict, op: str, dt: str, n: int, batch: int) -> tuple[str, float | None]:
    """(served config id, the table's recorded ms of it at this batch or None)."""
    entry = table["entries"].get(f"linalg|op={op}|dt={dt}|n={n}")
    if entry is None:
        return "torch", None
    cid = next(c for hi, c in entry["regions"] if hi is None or batch <= hi)
    ev = entry.get("evidence", {}).get(f"M={batch}", {})
    rec = ev.get(cid)
    return cid, (rec[0] if isinstance(rec, list) else None)


def new_arms(op: str, dt: str, n: int, packings=NEW_PACKINGS) -> list[str]:
    from tunedb.families.linalg import kernels_space as space

    return [c.id for c in space.config_space(op, n, dt) if c.packing in packings]


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="linalg_blocked.json")
    ap.add_argument("--table", default=str(DEFAULT_TABLE))
    ap.add_argument("--quick", action="store_true", help="5 rounds a cell (default 9)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=15, help="compile processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--packings", default=",".join(NEW_PACKINGS), help="the new packings timed")
    ap.add_argument("--ops", default=None, help="with --n: every batch of these ops (default: the goal cells)")
    ap.add_argument("--n", default=None)
    args = ap.parse_args(argv)
    packings = tuple(args.packings.split(","))
    ops = tuple(args.ops.split(",")) if args.ops else None
    ns = tuple(int(x) for x in args.n.split(",")) if args.n else None
    rounds = args.rounds or (5 if args.quick else 9)

    import torch

    from tunedb.families.linalg import FAMILY, kernels_prebuild
    from tunedb.families.linalg.gputimer import GraphTimer
    from tunedb.families.linalg.ladder import Cell
    from tunedb.records import Status
    from tunedb.database.store import write_atomic

    table = json.loads(Path(args.table).read_text())
    plan = []
    for op, dt, n, b in cells(ops, ns):
        served, table_ms = shipped(table, op, dt, n, b)
        if served.startswith("nvmath"):  # the dependency tier (not timed here): its native pick
            native = table["entries"][f"linalg|op={op}|dt={dt}|n={n}"].get("regions_native") or [[None, "torch"]]
            served = next((c for hi, c in native if hi is None or b <= hi), "torch")
            table_ms = None  # the table's time was the tier's, not this arm's
        arms = list(dict.fromkeys(["torch", served, *new_arms(op, dt, n, packings)]))
        plan.append(((op, dt, n, b), served, table_ms, arms))
    t0 = time.time()
    fails = kernels_prebuild.compile_all([(op, a, n, dt) for (op, dt, n, _b), _s, _t, arms in plan
                                          for a in arms if a != "torch"], jobs=args.jobs)
    compile_s = time.time() - t0
    print(f"compiled in {compile_s:.0f} s; failures: {len(fails)}", flush=True)
    for line in fails:
        print("  " + line)
    timer = GraphTimer(FAMILY, seed=args.seed)
    rng = random.Random(args.seed)
    rows = []
    for (op, dt, n, b), served, table_ms, arms in plan:
        cell = Cell(op, dt, n, b)
        status, ok = {}, []
        for arm in arms:
            st, ratio = timer.gate(cell, arm)
            status[arm] = {"status": st.value if hasattr(st, "value") else str(st), "residual_x_torch": ratio,
                           "why": timer.failure(cell, arm)}
            if st == Status.OK:
                ok.append(arm)
        samples = {a: [] for a in ok}
        for _ in range(rounds):
            order = ok[:]
            rng.shuffle(order)
            for arm, v in timer.sample(cell, order).items():
                if isinstance(v, float):
                    samples[arm].append(v * b / 1000.0)  # ns per problem -> us per call
        us = {a: statistics.median(v) for a, v in samples.items() if v}
        floor = max(floor_us(op, dt, n, b), MIN_US)
        new = [a for a in arms if a.split("_")[0] in packings and a in us]
        best_new = min(new, key=us.get) if new else None
        tor = us.get("torch")
        row = {"op": op, "dtype": dt, "n": n, "batch": b, "torch_us": tor, "shipped": served,
               "shipped_us": us.get(served), "table_shipped_us": None if table_ms is None else table_ms * 1e3,
               "best_new": best_new, "best_new_us": us.get(best_new), "floor_us": floor, "us": us,
               "x_torch": {a: (tor / t if tor else None) for a, t in us.items()},
               "x_floor": {a: t / floor for a, t in us.items()}, "gate": status, "samples_us": samples}
        rows.append(row)
        print(f"{op:5s} {dt} n={n:2d} b={b:5d} | torch {tor or float('nan'):8.1f} | shipped {served:12s} "
              f"{us.get(served, float('nan')):7.1f} (table {row['table_shipped_us'] or float('nan'):6.1f}) "
              f"x{(tor or 0) / us.get(served, float('inf')):5.2f} xfl {us.get(served, float('nan')) / floor:4.2f} | "
              + " ".join(f"{a} {us[a]:7.1f} x{(tor or 0) / us[a]:5.2f} xfl {us[a] / floor:4.2f}" for a in new)
              + "".join(f" | {a} FAILED {status[a]['status']}: {status[a]['why']}" for a in arms if a not in ok),
              flush=True)
        torch.cuda.empty_cache()
    timer.close()

    def xt(r, arm):
        return r["torch_us"] / r["us"][arm] if r["torch_us"] and arm in r["us"] else None

    def best_of(r):
        cands = [a for a in (r["shipped"], r["best_new"]) if a and a in r["us"]]
        return min(cands, key=r["us"].get) if cands else None

    summary = {"cells": len(rows), "compile_s": round(compile_s, 1), "rounds": rounds,
               "geomean_x_torch_shipped": geomean([xt(r, r["shipped"]) for r in rows]),
               "geomean_x_torch_best_of": geomean([xt(r, best_of(r)) for r in rows if best_of(r)]),
               "new_wins": sum(1 for r in rows if r["best_new"] and best_of(r) == r["best_new"]
                               and r["best_new"] != r["shipped"]),
               "over_3x_floor_shipped": [f"{r['op']} {r['dtype']} n={r['n']} b={r['batch']}" for r in rows
                                         if r["shipped"] in r["us"] and r["us"][r["shipped"]] > 3 * r["floor_us"]],
               "over_3x_floor_best_of": [f"{r['op']} {r['dtype']} n={r['n']} b={r['batch']}" for r in rows
                                         if best_of(r) and r["us"][best_of(r)] > 3 * r["floor_us"]],
               "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(summary, indent=1))
    write_atomic(Path(args.out), json.dumps({"summary": summary, "rows": rows}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
