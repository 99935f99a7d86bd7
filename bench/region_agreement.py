"""Count the signatures whose regions are byte-identical in two database files (a rebuild's
reproducibility: spec 003's margin rule should make a pure-noise re-run emit the same regions),
and the measured points (signature, M) at which both files serve the same config.

    python bench/region_agreement.py A.json B.json [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from tunedb import database
from tunedb.database import diffing


def served(regions, m: int) -> str:
    """The config a signature's regions serve at M (the first region whose m_hi reaches M)."""
    return next((r.config_id for r in regions if r.m_hi is None or m <= r.m_hi), "torch")


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
            same += served(a.entries[sig].regions, m) == served(b.entries[sig].regions, m)
    return {"shared": shared, "identical": shared - len(differ), "differ": differ,
            "points": cells, "points_same": same,
            "only_a": sorted(c.subject for c in regions if c.kind == "removed"),
            "only_b": sorted(c.subject for c in regions if c.kind == "added")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    got = agreement(database.load(args.a), database.load(args.b))
    if args.json:
        print(json.dumps(got, indent=1))
    else:
        print(f"{got['identical']} of {got['shared']} shared signatures have byte-identical regions; "
              f"{got['points_same']} of {got['points']} measured points serve the same config")
        for sig, both in got["differ"].items():
            print(f"  differ: {sig}\n    A {both['a']}\n    B {both['b']}")
    return 0 if got["identical"] == got["shared"] and not got["only_a"] and not got["only_b"] else 1


if __name__ == "__main__":
    sys.exit(main())
