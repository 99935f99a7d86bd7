"""`tunedb plot DB.json --out F.png`: each signature's regions along M (log axis), one row each."""
from __future__ import annotations

import argparse
from pathlib import Path

from tunedb.errors import DatabaseError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", metavar="DB.json", help="a database file")
    parser.add_argument("--out", required=True, metavar="F.png", help="where to write the PNG")


def run(args: argparse.Namespace) -> int:
    from tunedb import database, evaluate
    from tunedb.evaluate.regret import check_figure_path

    check_figure_path("--out", args.out)
    db = database.load(Path(args.db))
    if not db.entries:
        raise DatabaseError(f"{args.db} has no entries to plot")
    regions = {}
    m_max = {}
    for sig in sorted(db.entries, key=lambda s: s.format()):
        entry = db.entries[sig]
        regions[sig.format()] = entry.regions
        measured = [int(k[2:]) for k in entry.evidence if k.startswith("M=")]
        m_max[sig.format()] = max(measured, default=1)
    evaluate.save_figure(args.out, None, regions, m_max)
    print(f"wrote {args.out} ({len(regions)} signature(s))")
    return 0
