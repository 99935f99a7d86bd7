"""`tunedb diff A.json B.json [--json]`: entries added, removed and changed, one line each.

Exit status follows diff(1): 0 when the files agree, 1 when they differ, 2 when one cannot be read.
A refitted cost model is reported but does not count (it is a measurement, like evidence).
"""
from __future__ import annotations

import argparse
import json
import sys

from tunedb.errors import DatabaseError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 the files agree, 1 they differ, 2 a file cannot be read"
    parser.add_argument("a", metavar="A.json", help="the old file")
    parser.add_argument("b", metavar="B.json", help="the new file")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def run(args: argparse.Namespace) -> int:
    from tunedb import database

    loaded = []
    for path in (args.a, args.b):
        try:
            loaded.append(database.load(path))
        except FileNotFoundError:
            stdin = " (a table is read from a file: standard input is not taken)" if path == "-" else ""
            print(f"tunedb diff: {path}: no such file{stdin}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"tunedb diff: {path}: unreadable: {exc.strerror or exc}", file=sys.stderr)
            return 2
        except DatabaseError as exc:
            print(f"tunedb diff: cannot read {exc}", file=sys.stderr)
            return 2
    changes = database.diff(*loaded)
    differ = any(c.counted for c in changes)
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "same": not differ,
                          "changes": [c.to_json() for c in changes]}, indent=2))
    else:
        for change in changes:
            print(change.line())
        if not differ:
            print(f"{args.a} and {args.b} agree")
    return 1 if differ else 0
