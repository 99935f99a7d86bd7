"""Count the signatures whose regions are byte-identical in two database files (a rebuild's
reproducibility: spec 003's margin rule should make a pure-noise re-run emit the same regions).

    python bench/region_agreement.py A.json B.json [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

from tunedb import database


def agreement(a: database.DatabaseFile, b: database.DatabaseFile) -> dict:
    shared = sorted(set(a.entries) & set(b.entries))
    same = [s for s in shared
            if json.dumps([r.to_json() for r in a.entries[s].regions])
            == json.dumps([r.to_json() for r in b.entries[s].regions])]
    differ = {s.format(): {"a": [r.to_json() for r in a.entries[s].regions],
                           "b": [r.to_json() for r in b.entries[s].regions]}
              for s in shared if s not in same}
    return {"shared": len(shared), "identical": len(same), "differ": differ,
            "only_a": sorted(s.format() for s in set(a.entries) - set(b.entries)),
            "only_b": sorted(s.format() for s in set(b.entries) - set(a.entries))}


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
