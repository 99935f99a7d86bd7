"""Does an arm's time follow the process or the cell? (issue 19's agreement goal)

Reads the raw samples of several `tunedb linalg tune --samples` runs of the same cells (one file a
process; samples are ns a problem) and prints, per cell and arm, the median ns a problem in each run and the spread across
runs (max / min of the medians), next to the spread inside each run (p90 / p10 of its samples).
An arm whose across-run spread far exceeds its within-run spread moves with the process.
    python bench/linalg_shift.py run0.jsonl run1.jsonl ... [--out shift.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def load_runs(paths: list[str]) -> list[dict[tuple, dict[str, list[float]]]]:
    runs = []
    for path in paths:
        cells: dict[tuple, dict[str, list[float]]] = {}
        for line in Path(path).read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                key = (rec["op"], rec["dt"], rec["n"], rec["batch"])
                cells[key] = {arm: list(vals) for arm, vals in rec["samples"].items() if vals}
        runs.append(cells)
    return runs


def spreads(runs: list[dict]) -> list[dict]:
    rows = []
    for key in sorted(set().union(*[set(r) for r in runs])):
        arms = set().union(*[set(r.get(key, {})) for r in runs])
        for arm in sorted(arms):
            per_run = [r[key][arm] for r in runs if arm in r.get(key, {})]
            if len(per_run) < 2:
                continue
            meds = [statistics.median(s) for s in per_run]
            inside = max(_quantile(s, 0.9) / _quantile(s, 0.1) for s in per_run)
            rows.append({"op": key[0], "dt": key[1], "n": key[2], "batch": key[3], "arm": arm,
                         "medians_ns": meds, "across": max(meds) / min(meds), "inside": inside})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = spreads(load_runs(args.runs))
    print("| op | dt | n | batch | arm | median ns a problem, each run | across runs | inside a run (p90/p10) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["across"]):
        meds = " / ".join(f"{m:.3f}" for m in r["medians_ns"])
        print(f"| {r['op']} | {r['dt']} | {r['n']} | {r['batch']} | {r['arm']} | {meds} | "
              f"{r['across']:.2f} | {r['inside']:.2f} |")
    moved = [r for r in rows if r["across"] > max(1.10, r["inside"])]
    print(f"\n{len(moved)} of {len(rows)} (cell, arm) pairs move more across runs than inside one "
          "(across > max(1.10, inside))")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
