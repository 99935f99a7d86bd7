"""What a linalg table serves on the goal cells, from its own evidence (no GPU needed).

    PYTHONPATH=src python bench/linalg_served.py [--table src/tunedb/db/sm90/linalg.json]
        [--ops potrf,posv] [--max-n 32] [--out served.json]

Per cell (op, dtype, n, batch): torch's median (the capturable form the ladder timed), the
served arm (the entry's region for that batch) and its median, the memory floor at 4.3 TB/s
(bench/linalg_ladder.floor_us: read A, write L or x), what 10x over torch needs, and the served
time over max(floor, 3 us). Then the geomeans over all cells, without batch 256, per batch and
per n, and the geomean the best arm the cell timed would give (served below best: the pick rule's
tie band, or nothing faster was timed). The issue-19 goal: >= 10x geomean over torch on potrf
and posv at n <= 32 (48 cells), every cell within 3x of max(floor, 3 us).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from linalg_ladder import MIN_US, floor_us  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "src" / "tunedb" / "db" / "sm90" / "linalg.json"


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def rows(table: dict, ops, max_n: int) -> list[dict]:
    out = []
    for key, entry in sorted(table["entries"].items()):
        parts = dict(p.split("=", 1) for p in key.split("|")[1:])
        op, dt, n = parts["op"], parts["dt"], int(parts["n"])
        if op not in ops or n > max_n:
            continue
        for label, ev in entry["evidence"].items():
            batch = int(label.split("=", 1)[1])
            served = next(cid for hi, cid in entry["regions"] if hi is None or batch <= hi)
            times = {a: v[0] * 1e3 for a, v in ev.items() if not a.startswith("_") and isinstance(v, list)}
            if "torch" not in times or served not in times:
                continue
            best = min((a for a in times if a != "torch_checked"), key=times.get)
            fl = floor_us(op, dt, n, batch)
            out.append({"op": op, "dtype": dt, "n": n, "batch": batch, "torch_us": times["torch"],
                        "served": served, "served_us": times[served], "best": best, "best_us": times[best],
                        "floor_us": fl, "need_10x_us": times["torch"] / 10,
                        "x_torch": times["torch"] / times[served],
                        "x_target": times[served] / max(fl, MIN_US), "arms_timed": sorted(times)})
    return sorted(out, key=lambda r: (r["op"], r["dtype"], r["n"], r["batch"]))


def summary(cells: list[dict]) -> dict:
    def gm(pred):
        return geomean([c["x_torch"] for c in cells if pred(c)])

    return {
        "cells": len(cells),
        "geomean_x_torch": gm(lambda c: True),
        "geomean_x_torch_without_batch_256": gm(lambda c: c["batch"] != 256),
        "geomean_if_best_timed_arm_served": geomean([c["torch_us"] / c["best_us"] for c in cells]),
        "by_batch": {b: gm(lambda c, b=b: c["batch"] == b) for b in sorted({c["batch"] for c in cells})},
        "by_n": {n: gm(lambda c, n=n: c["n"] == n) for n in sorted({c["n"] for c in cells})},
        "by_dtype": {d: gm(lambda c, d=d: c["dtype"] == d) for d in sorted({c["dtype"] for c in cells})},
        "cells_within_3x_target": sum(1 for c in cells if c["x_target"] <= 3.0),
        "cells_at_10x": sum(1 for c in cells if c["x_torch"] >= 10.0),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=str(DEFAULT))
    ap.add_argument("--ops", default="potrf,posv")
    ap.add_argument("--max-n", type=int, default=32)
    ap.add_argument("--out", default=None, help="write the cells and the summary as JSON here")
    args = ap.parse_args(argv)
    table = json.loads(Path(args.table).read_text())
    cells = rows(table, tuple(args.ops.split(",")), args.max_n)
    if not cells:
        print(f"linalg_served: no {args.ops} cells with n <= {args.max_n} in {args.table}", file=sys.stderr)
        return 2
    print("| op | dt | n | batch | torch us | served | us | x torch | 10x needs us | floor us | x max(floor,3us) | best timed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        print(f"| {c['op']} | {c['dtype']} | {c['n']} | {c['batch']} | {c['torch_us']:.1f} | {c['served']} | "
              f"{c['served_us']:.1f} | {c['x_torch']:.2f} | {c['need_10x_us']:.1f} | {c['floor_us']:.1f} | "
              f"{c['x_target']:.2f} | {c['best']} {c['best_us']:.1f} |")
    summ = summary(cells)
    print(json.dumps(summ, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"table": args.table, "summary": summ, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
