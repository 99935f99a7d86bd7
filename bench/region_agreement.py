"""Count the signatures whose regions are byte-identical in two database files (a rebuild's
reproducibility: spec 003's margin rule should make a pure-noise re-run emit the same regions),
and the measured points (signature, M) at which both files serve the same config.

    python bench/region_agreement.py A.json B.json [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from tunedb import database
from tunedb.database import diffing


def geomean(xs) -> float:
    """The geometric mean, 1.0 for no values (nothing moved)."""
    return statistics.geometric_mean(xs) if xs else 1.0


def agreement(a: database.DatabaseFile, b: database.DatabaseFile) -> dict:
    """From `tunedb diff`'s own comparison (database.diffing): its region changes only."""
    regions = [c for c in diffing.diff(a, b) if c.what == "regions"]
    differ = {c.subject: {"a": c.a, "b": c.b} for c in regions if c.kind == "changed"}
    shared = len(set(a.entries) & set(b.entries))
    cells = same = 0
    for sig in set(a.entries) & set(b.entries):
        ms = {int(k[2:]) for e in (a.entries[sig], b.entries[sig]) for k in e.evidence if k.startswith("M=")}
        for m in ms:
            cells += 1
            same += a.entries[sig].lookup(m) == b.entries[sig].lookup(m)
    return {"shared": shared, "identical": shared - len(differ), "differ": differ,
            "points": cells, "points_same": same,
            "only_a": sorted(c.subject for c in regions if c.kind == "removed"),
            "only_b": sorted(c.subject for c in regions if c.kind == "added")}


def cross_regret(a: database.DatabaseFile, a_log: str, b: database.DatabaseFile) -> dict:
    """What serving B's choices costs, timed by A's run (A's measurement log): per (signature, M)
    where both picks were measured there, B's pick over A's pick; geomean and worst over the
    points where the picks differ, and over all points. A disagreement between two builds that
    is a near-tie costs ~0; one that is not shows here."""
    t: dict[tuple[str, int], dict[str, float]] = {}
    with open(a_log) as fh:
        for line in fh:
            r = json.loads(line)
            if r.get("status") == "ok":
                t.setdefault((r["signature"], int(r["M"])), {})[r["config"]] = float(r["median_ms"])
    ratios, differ = [], []
    for sig in set(a.entries) & set(b.entries):
        name = sig.format()
        for (s, m), times in t.items():
            if s != name:
                continue
            pa, pb = a.entries[sig].lookup(m), b.entries[sig].lookup(m)
            if pa in times and pb in times:
                ratios.append(times[pb] / times[pa])
                if pa != pb:
                    differ.append((name, m, pa, pb, times[pb] / times[pa]))
    return {"points": len(ratios), "geomean": round(geomean(ratios), 4), "worst": round(max(ratios, default=1.0), 4),
            "differ": len(differ), "differ_geomean": round(geomean([d[-1] for d in differ]), 4),
            "differ_worst": max(differ, key=lambda d: d[-1], default=None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log-a", help="A's measurements.jsonl: also time B's picks by A's run (cross regret)")
    args = ap.parse_args(argv)
    got = agreement(database.load(args.a), database.load(args.b))
    if args.log_a:
        got["cross_regret"] = cross_regret(database.load(args.a), args.log_a, database.load(args.b))
    if args.json:
        print(json.dumps(got, indent=1))
    else:
        print(f"{got['identical']} of {got['shared']} shared signatures have byte-identical regions; "
              f"{got['points_same']} of {got['points']} measured points serve the same config")
        if "cross_regret" in got:
            c = got["cross_regret"]
            print(f"B's picks timed by A's run: {c['points']} points, geomean {c['geomean']:.4f}x A's pick, "
                  f"worst {c['worst']:.4f}x; at the {c['differ']} points where they differ, geomean "
                  f"{c['differ_geomean']:.4f}x, worst {c['differ_worst']}")
        for sig, both in got["differ"].items():
            print(f"  differ: {sig}\n    A {both['a']}\n    B {both['b']}")
    return 0 if got["identical"] == got["shared"] and not got["only_a"] and not got["only_b"] else 1


if __name__ == "__main__":
    sys.exit(main())
