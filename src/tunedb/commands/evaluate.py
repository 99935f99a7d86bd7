"""`tunedb evaluate`: regret of each selector against the measured oracle (pipeline.evaluate_logs)."""
from __future__ import annotations

import argparse
import json
import sys

from tunedb import families
from tunedb.errors import BuildError


def _named(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--db takes NAME=PATH (e.g. new=~/.cache/tunedb/v1/sm90/<family>.json), "
                                         f"got {text!r}")
    return name, path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", action="append", required=True, metavar="LOG",
                        help="a measurement log (JSONL; repeatable): the oracle is the best ok arm per point")
    parser.add_argument("--db", action="append", type=_named, default=[], metavar="NAME=PATH",
                        help="a database file to score (repeatable)")
    parser.add_argument("--census", action="append", default=[], metavar="F",
                        help="census file(s): weights and eager shares per point (else uniform, 0)")
    parser.add_argument("--family", default=families.DEFAULT, help=f"kernel family (default {families.DEFAULT})")
    parser.add_argument("--arch", default=None, help="arch family (default: the first file's, else sm90)")
    parser.add_argument("--png", default=None, metavar="OUT.png",
                        help="draw regret per signature and each file's regions along M")
    parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")


def check_inputs(logs: list[str], dbs: list[tuple[str, str]]) -> None:
    """Every --log and --db names an existing file (before any is read), else one line why."""
    from pathlib import Path

    named = [("--log", text, text) for text in logs] + [("--db", f"{name}={text}", text) for name, text in dbs]
    for flag, given, text in named:
        path = Path(text).expanduser()
        if path.is_dir():
            what = ("a measurement log (DIR/measurements.jsonl)" if flag == "--log"
                    else "a database file (e.g. DIR/sm90/<family>.json)")
            raise BuildError(f"{flag} {given}: {path} is a directory; {flag} takes {what}")
        if not path.exists():
            raise BuildError(f"{flag} {given}: no such file {path}")


def _simulated(logs: list[str]) -> bool:
    """Whether a log's first measurement was taken by the fake timer (a `--simulate` build)."""
    for path in logs:
        try:
            with open(path, encoding="utf-8-sig") as f:  # the first line only: a log may be large
                first = next((line for line in f if line.strip()), "")
            if json.loads(first).get("env", {}).get("timer") == "fake":
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunedb import evaluate, pipeline

    check_inputs(args.log, args.db)
    if args.png:
        from tunedb.evaluate.regret import check_figure_path

        check_figure_path("--png", args.png)
    censuses = [pipeline.read_census(path) for path in args.census]
    ev, regions = pipeline.evaluate_logs(args.log, args.db, censuses, args.arch, args.family)
    if not ev.points:
        raise BuildError(f"no point of family {args.family!r} has an ok measurement in "
                         f"{', '.join(args.log)}")
    if args.json:
        print(json.dumps(ev.to_json(), indent=1))
    else:
        evaluate.render_table(ev, Console())
        if _simulated(args.log):
            print("--simulate logs (timer 'fake'): this oracle and every regret above come from the cost "
                  "model plus seeded noise, not a GPU")
    if args.png:
        rows = {f"{name}: {sig}": rs for name, per in regions.items() for sig, rs in per.items()}
        m_max = {}
        for p in ev.points:
            for name in regions:
                key = f"{name}: {p.signature}"
                m_max[key] = max(m_max.get(key, 1), p.m)
        evaluate.save_figure(args.png, ev, rows, m_max)
        print(f"wrote {args.png}", file=sys.stderr if args.json else sys.stdout)
    return 0
