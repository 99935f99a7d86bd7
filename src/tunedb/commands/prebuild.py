"""`tunedb prebuild`: compile a family's kernels for a target, without a GPU, into a persistent cache.

    tunedb prebuild --family gemm --arch sm90 --jobs 16         the compile set (TUNEDB_COMPILE_SET=all: the space)
    tunedb prebuild --census census.json --arch sm90 --jobs 16  every config a build of those signatures could measure
    tunedb prebuild --arch sm80 --arch sm89 --arch sm100        several targets, with a per-arch summary table
    tunedb prebuild --arch sm80,sm100 --dry-run                 the plan: what compiles, how to measure each tier

The family's `prebuild(args)` hook does the work (GEMM's: families/gemm/prebuild_cli.py, which
needs only Triton, no torch); a family without one has no prebuild step.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tunedb.errors import BuildError


def configure(parser: argparse.ArgumentParser) -> None:
    from tunedb import families

    parser.add_argument("--family", default=families.DEFAULT, help=f"kernel family to prebuild (default: {families.DEFAULT})")
    parser.add_argument("--census", type=Path, default=None,
                        help="a census (or database) file: compile what a build of its signatures could load")
    parser.add_argument("--arch", action="append", default=None,
                        help="target arch family, e.g. sm90; repeat it or list them (sm80,sm90,sm100) "
                             "to compile for several (default: sm90)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print, per arch, what would compile and how to measure its tier on such a GPU")
    parser.add_argument("--jobs", type=int, default=4, help="compile processes (default: 4)")
    parser.add_argument("--referenced", type=Path, default=None,
                        help="a database file whose referenced configs join the compile set")
    parser.add_argument("--json", action="store_true",
                        help="stdout is one JSON document: per arch the compile summary (with --dry-run, the "
                             "plan); progress and the table go to stderr")
    parser.add_argument("--thin", action="store_true", help="with --census: plan as `tunedb build --thin` would")
    parser.add_argument("--max-points", type=int, default=None, help="with --thin: as for `tunedb build`")
    parser.add_argument("--every-valid", action="store_true",
                        help="with --census: every valid config of each signature, not only the build plan's")


def run(args: argparse.Namespace) -> int:
    from tunedb import families
    from tunedb.families.contract import has_hook, hook

    family = families.get(args.family)  # unknown names raise, listing the registered ones
    if not has_hook(family, "prebuild"):
        raise BuildError(f"kernel family {args.family!r} has no prebuild step (it compiles no kernels ahead)")
    return int(hook(family, "prebuild")(args))
