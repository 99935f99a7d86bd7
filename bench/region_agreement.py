"""Count the signatures whose regions are byte-identical in two database files (a rebuild's
reproducibility: spec 003's margin rule should make a pure-noise re-run emit the same regions).

    python bench/region_agreement.py A.json B.json [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from tunedb import database
from tunedb.database import diffing


def agreement(a: database.DatabaseFile, b: database.DatabaseFile) -> dict:
    """From `tunedb diff`'s own comparison (database.diffing): its region changes only."""
    regions = [c for c in diffing.diff(a, b) if c.what == "regions"]
    differ = {c.subject: {"a": c.a, "b": c.b} for c in regions if c.kind == "changed"}
    shared = len(set(a.entries) & set(b.entries))
    return {"shared": shared, "identical": shared - len(differ), "differ": differ,
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
        print(f"{got['identical']} of {got['shared']} shared signatures have byte-identical regions")
        for sig, both in got["differ"].items():
            print(f"  differ: {sig}\n    A {both['a']}\n    B {both['b']}")
    return 0 if got["identical"] == got["shared"] and not got["only_a"] and not got["only_b"] else 1


if __name__ == "__main__":
    sys.exit(main())
