"""`tunedb linalg ...`: the small batched linear-algebra family's commands.

    tunedb linalg recommend OP DTYPE N BATCH [--deps native|all] [--json]
        the execution plan of one cell, where it came from and why
    tunedb linalg plot --out F.png [--deps native|all]
        the winner of every cell (ops x n x batch, one panel per dtype), measured or heuristic
    tunedb linalg tune [--prebuild] [--quick] [--legs ladder,solver] [--ops ..] [--dtypes ..] [--n ..]
                       [--margin M] [--pick low|median|paired] [--max-rounds N] [--samples F.jsonl]
                       [--dry-run] [--out DIR|FILE.json|system|user]
        re-measure this GPU's table (the ladder), regenerate it under the pick rule and write it
        (--base FILE: start from that table instead of the --out file)
        (--dry-run: regenerate and diff against the current file, write nothing; --prebuild:
        compile every kernel (in --build-jobs processes) and measure nothing)
    tunedb linalg repick --table FILE.json [--out FILE.json] [--margin M] [--dry-run]
        re-decide a measured table under the current pick rule from the statistic each point
        recorded (no GPU, nothing measured; repick.py)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tunedb.errors import TunedbError


def _selector() -> Any:
    try:
        from tunedb.runtime import selector  # the seam's layout
    except ImportError:
        from tunedb import selector
    return selector


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="linalg_command", metavar="SUBCOMMAND")
    rec = sub.add_parser("recommend", help="the execution plan of one cell, and why")
    rec.add_argument("op")
    rec.add_argument("dtype")
    rec.add_argument("n", type=int)
    rec.add_argument("batch", type=int)
    rec.add_argument("--deps", default="native", help="native (default) or all")
    rec.add_argument("--arch", default="sm90")
    rec.add_argument("--json", action="store_true", help="print the plan as JSON")
    plot = sub.add_parser("plot", help="draw the winner of every cell as a PNG")
    plot.add_argument("--out", required=True, metavar="F.png")
    plot.add_argument("--deps", default="native")
    plot.add_argument("--arch", default="sm90")
    tune = sub.add_parser("tune", help="re-measure this GPU's linalg table (the one-command retune)")
    tune.add_argument("--prebuild", action="store_true", help="compile every kernel, time nothing")
    tune.add_argument("--quick", action="store_true", help="one throughput point: batch 4096, n 4..32, fp32")
    tune.add_argument("--legs", default=None, help="comma-separated: ladder (dot, gemv, gemm), solver "
                                                   "(potrf, trsv, posv); default both")
    tune.add_argument("--ops", default=None, help="comma-separated ops within the legs (default all)")
    tune.add_argument("--dtypes", default=None, help="comma-separated dtypes (default fp32,fp64)")
    tune.add_argument("--n", default=None, help="comma-separated n within the grid (default all)")
    tune.add_argument("--margin", type=float, default=None, help="the tie band, a fraction (default 0.02)")
    tune.add_argument("--rounds", type=int, default=9, help="paired rounds per cell (at least 9)")
    tune.add_argument("--max-rounds", type=int, default=None,
                      help="while a cell is open, --rounds more rounds, up to this many (low: a burst "
                           "took much of it or its pick sits within the noise of the band's edge, each "
                           "further block on fresh CUDA graphs; paired, median: an arm's paired interval "
                           "straddles the band edge). Default: 5 x --rounds under low, else --rounds")
    tune.add_argument("--pick", default="low", choices=("low", "median", "paired"),
                      help="low (default): each arm's lower quartile (the median over blocks), the band "
                           "widened to --launch-jitter-ns a call (pick.decide_low); median: the tie band "
                           "on the medians (sessions 9-15); paired: an arm ties when its per-round ratio's "
                           "90%% interval is within the band")
    tune.add_argument("--launch-jitter-ns", type=float, default=None,
                      help="--pick low: the run-to-run jitter of one call's time, ns (default "
                           "pick.LAUNCH_JITTER_NS, 150); a cell's band is max(margin, this / the "
                           "fastest arm's ns a call); 0: the margin alone")
    tune.add_argument("--samples", default=None, metavar="FILE.jsonl",
                      help="write every cell's raw samples here (one cell a line; also with --dry-run)")
    tune.add_argument("--max-arms", type=int, default=12, help="Triton configs timed per cell")
    tune.add_argument("--build-jobs", type=int, default=None,
                      help="processes compiling kernels before timing (default: CPUs - 1, at most 16)")
    tune.add_argument("--dry-run", action="store_true", help="regenerate and diff; write nothing")
    tune.add_argument("--allow-busy", action="store_true",
                      help="measure even with foreign compute processes on the GPU (legs marked contended)")
    tune.add_argument("--out", default="user", help="system, user (default), a directory (DIR/<arch>/"
                                                    "linalg.json) or a .json file")
    tune.add_argument("--base", default=None, metavar="FILE.json",
                      help="the table to start from and diff against (default: the --out file); "
                           "entries of cells not measured now are kept from it")
    tune.add_argument("--keep", default="base", metavar="base|none|FILE.json",
                      help="--pick low: the table whose picks keep their cells while they still tie "
                           "(an arm leaves a cell only for one faster by more than one more band: "
                           "re-tunes stop trading edge ties; families/linalg/keep.py). base (default): "
                           "the table this tune starts from; none: every cell decided afresh")
    tune.add_argument("--seed", type=int, default=0)
    rp = sub.add_parser("repick", help="re-decide a measured table under the current pick rule (no GPU)")
    rp.add_argument("--table", required=True, metavar="FILE.json", help="a linalg table tuned with --pick low")
    rp.add_argument("--out", default=None, metavar="FILE.json", help="where to write it (default: --table)")
    rp.add_argument("--margin", type=float, default=None, help="the tie band, a fraction (default 0.02)")
    rp.add_argument("--launch-jitter-ns", type=float, default=None,
                    help="the run-to-run jitter of one call's time, ns (default 150)")
    rp.add_argument("--dry-run", action="store_true", help="show the moves; write nothing")


def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "linalg_command", None)
    if cmd == "recommend":
        return _recommend(args)
    if cmd == "plot":
        return _plot(args)
    if cmd == "tune":
        return tune(args)
    if cmd == "repick":
        return _repick(args)
    print("usage: tunedb linalg {recommend,plot,tune,repick} ... (tunedb linalg --help)", file=sys.stderr)
    return 2


def _recommend(args: argparse.Namespace) -> int:
    from tunedb.families.linalg.plan import recommend

    plan = recommend(args.op, args.dtype, args.n, args.batch, deps=args.deps, arch=args.arch)
    print(json.dumps(asdict(plan), indent=2) if args.json else plan.describe())
    return 0


def _repick(args: argparse.Namespace) -> int:
    from tunedb.database import schema, store
    from tunedb.families.linalg import repick, table

    src = Path(args.table)
    if not src.is_file():
        raise TunedbError(f"--table {src} is not a file (a linalg table, e.g. src/tunedb/db/sm90/linalg.json)")
    rule, jitter = _rule(args)
    out = Path(args.out) if args.out else src
    if not args.dry_run:
        _check_target(out, write=True)
    old = schema.load(src, "linalg")
    if not args.dry_run and out.exists() and out.resolve() != src.resolve():
        try:  # --out replaces a linalg table, never some other file
            schema.load(out, "linalg")
        except (OSError, TunedbError) as exc:
            raise TunedbError(f"--out {out} exists and is not a readable linalg table ({exc}); nothing was "
                              "written: name a new file or a linalg table to replace") from None
    from tunedb.measure.provenance import utc_now

    new = repick.repick(old, rule, jitter, utc_now())
    moved = table.moved_cells(old, new, rule.tie_band)
    _lines(f"{src}: {len(moved)} cell(s) move under the current rule", moved)
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    if not moved and out.resolve() == src.resolve():  # a rewrite would change only its timestamp
        print(f"{src} unchanged: no cell moves")
        return 0
    store.write_atomic(out, schema.dumps(new))
    print(f"wrote {out}")
    return 0


def _rule(args: argparse.Namespace) -> tuple[Any, float]:
    """(the pick rule with --margin, the launch jitter of --launch-jitter-ns), refused when out of range."""
    from tunedb.families.linalg import pick

    if args.margin is not None and not 0.0 <= args.margin < 1.0:
        raise TunedbError(f"--margin {args.margin} must be a fraction in [0, 1) (the tie band; default 0.02)")
    jitter = getattr(args, "launch_jitter_ns", None)
    jitter = pick.LAUNCH_JITTER_NS if jitter is None else jitter
    if not (jitter >= 0 and math.isfinite(jitter)):
        raise TunedbError(f"--launch-jitter-ns {jitter} must be a finite number >= 0 (ns a call; 0: the margin alone)")
    rule = pick.LINALG_RULE if args.margin is None else replace(pick.LINALG_RULE, tie_band=args.margin)
    return rule, jitter


def _lines(title: str, lines: list[str]) -> None:
    print(title)
    for line in lines:
        print("  " + line)


PLOT_FORMATS = (".png", ".pdf", ".svg")
# --pick low without --max-rounds: up to this many blocks of --rounds (a clear cell stays at one;
# a round costs about a ms, the cell's compile and capture dominate)
LOW_BLOCKS = 5


def _plot(args: argparse.Namespace) -> int:
    from tunedb.families.linalg.plot import draw

    if Path(args.out).suffix.lower() not in PLOT_FORMATS:
        raise TunedbError(f"--out {args.out}: the plot is written as {', '.join(PLOT_FORMATS)} (by its suffix)")

    cells, measured = draw(Path(args.out), deps=args.deps, arch=args.arch)
    print(f"wrote {args.out}: {cells} cells, {measured} measured, {cells - measured} heuristic")
    return 0


def _split(text: str | None, allowed: tuple[str, ...], what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in allowed]
    if bad or not names:
        raise TunedbError(f"unknown {what} {bad or text!r}; allowed: {', '.join(allowed)}")
    return names


def _check_flags(args: argparse.Namespace, grid: list, legs: Any, ops: Any, dtypes: Any) -> None:
    """TunedbError for flags that would measure nothing useful (before any GPU work): fewer than
    one Triton config a cell, or ops and dtypes with no cell between them (the tie band: _rule)."""
    if args.max_arms < 1:
        raise TunedbError(f"--max-arms {args.max_arms} must be at least 1 (Triton configs timed per cell)")
    if not grid:
        from tunedb.families.linalg.ladder import LEGS

        in_legs = [op for leg in legs for op in LEGS[leg]]
        if ops is not None and not set(ops) & set(in_legs):
            raise TunedbError(f"no cell to measure: the ops {', '.join(ops)} are in none of the legs "
                              f"{', '.join(legs)} (" + "; ".join(f"{leg}: {', '.join(LEGS[leg])}" for leg in LEGS)
                              + ")")
        raise TunedbError(f"no cell to measure: the legs {', '.join(legs)} (ops {', '.join(ops or ()) or 'all'}) "
                          f"take none of the dtypes {', '.join(dtypes)} (fp16/bf16: dot, gemv, gemm only)")


def target(out: str, arch_family: str) -> Path:
    """--out -> the file the table goes to."""
    from tunedb.database import store, tiers

    if out in tiers.TIERS:
        return store.target_path(out, arch_family, "linalg")
    path = Path(out)
    return path if path.suffix == ".json" else path / arch_family / "linalg.json"


def _check_target(path: Path, write: bool, flag: str = "--out") -> None:
    """TunedbError unless `path` can be the table's file: not a directory, and (`write`) the
    nearest existing folder above it a writable directory (store.write_atomic creates the rest)."""
    import os

    if path.is_dir():
        raise TunedbError(f"{flag}: {path} is a directory, not a file")
    for parent in path.parents if write else ():
        if parent.exists():
            if not parent.is_dir():
                raise TunedbError(f"{flag}: cannot write {path}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise TunedbError(f"{flag}: cannot write {path}: {parent} is not writable")
            return


def _provenance(timer: Any, started: str) -> dict[str, Any]:
    try:
        from tunedb.measure import provenance  # the seam's layout
    except ImportError:
        from tunedb.bench import provenance
    ident = timer.identity() if hasattr(timer, "identity") else {}
    record = provenance.collect(gpu=ident).to_json()
    record["utc_start"] = started
    record["utc_end"] = provenance.utc_now()
    return record


def tune(args: argparse.Namespace, timer: Any = None, arch_family: str | None = None) -> int:
    """The one-command retune. `timer` (tests: ladder.FakeTimer) replaces the GPU timer."""
    selector = _selector()
    from tunedb.database import schema, validators
    from tunedb.families.linalg import FAMILY, ladder, pick, signatures, table

    legs = ladder.parse_legs(args.legs)
    # before the timer and the compiles: ladder.measure_cell refused --rounds below nine only after
    # minutes of kernel compiles, and --build-jobs 0 / -1 reached the process pool (or was the default)
    if isinstance(args.rounds, bool) or not isinstance(args.rounds, int) or args.rounds < ladder.MIN_ROUNDS:
        raise TunedbError(f"--rounds {args.rounds} must be at least {ladder.MIN_ROUNDS} (the paired rounds spec 003 "
                          f"requires a cell)")
    jobs = getattr(args, "build_jobs", None)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise TunedbError(f"--build-jobs {jobs} must be at least 1 (processes compiling kernels; default: CPUs - 1)")
    decide = getattr(args, "pick", None) or "low"
    max_rounds = getattr(args, "max_rounds", None)
    if max_rounds is None and decide == "low":
        max_rounds = LOW_BLOCKS * args.rounds
    if max_rounds is not None and max_rounds < args.rounds:
        raise TunedbError(f"--max-rounds {max_rounds} is below --rounds {args.rounds}; give at least --rounds")
    ops = _split(args.ops, signatures.OPS, "op(s)")
    dtypes = _split(args.dtypes, ("fp32", "fp64", "fp16", "bf16"), "dtype(s)") or (
        ("fp32",) if args.quick else ladder.GRID_DTYPES)
    grid_n = ladder.QUICK_N if args.quick else ladder.GRID_N
    ns = _split(getattr(args, "n", None), tuple(map(str, grid_n)), "n")
    ns = tuple(int(n) for n in ns) if ns else None
    rule, jitter = _rule(args)  # --margin and --launch-jitter-ns refused before any GPU work
    _check_flags(args, ladder.cells(legs, args.quick, dtypes, ops, ns), legs, ops, dtypes)
    arch_family = arch_family or selector.current_arch_family()
    profile = selector.shipped_profile(arch_family)
    path = target(args.out, arch_family)
    # the base table and the output's place are checked before anything is compiled or timed: a
    # missing --base was read as "no table" (the written table lost every cell not measured now),
    # and a corrupt base or an --out under a file failed only after the whole measurement
    _check_target(path, write=not args.dry_run)
    if getattr(args, "samples", None):  # written before the table: a failure there lost the run
        _check_target(Path(args.samples), write=True, flag="--samples")
    base = Path(args.base) if getattr(args, "base", None) else path
    if base is not path and not base.is_file():
        raise TunedbError(f"--base {base} is not a file (the table to start from; without --base the "
                          f"--out file is the base, and none means no table)")
    old = _read(base, arch_family)
    incumbents = _incumbents(getattr(args, "keep", "none"), old, arch_family)
    try:
        from tunedb.measure.provenance import utc_now  # the seam's layout
    except ImportError:
        from tunedb.bench.provenance import utc_now
    started = utc_now()
    if timer is None:
        from tunedb.families.linalg.gputimer import GraphTimer

        timer = GraphTimer(FAMILY, seed=args.seed)
    failed = _compile(legs, ops, dtypes, args.quick, profile, args.max_arms, args.build_jobs, timer, ns)
    if args.prebuild:
        return 1 if failed else 0
    log = (lambda line: print(line, file=sys.stderr, flush=True))
    reports = ladder.run(timer, legs, profile, quick=args.quick, rounds=args.rounds, seed=args.seed,
                         rule=rule, dtypes=dtypes, ops=ops, max_arms=args.max_arms,
                         allow_busy=getattr(args, "allow_busy", False), progress=log, ns=ns,
                         decide=decide, max_rounds=max_rounds, jitter_ns=jitter, incumbents=incumbents)
    if getattr(args, "samples", None):
        _write_samples(Path(args.samples), reports)
    ladder.check_complete(reports, args.quick, dtypes, ops, ns)
    for rep in reports:
        if rep.invalid:
            print(f"tunedb linalg tune: leg {rep.leg} invalid: {rep.invalid}", file=sys.stderr)
    new = table.build(reports, old, arch_family=arch_family,
                      file_validators=validators.current(FAMILY.impl_hash()),
                      provenance=_provenance(timer, started), rule=rule, legs=legs, quick=args.quick,
                      decide=decide, max_rounds=max_rounds, jitter_ns=jitter)
    changes = table.table_changes(old, new)
    measured = sum(len(r.results) for r in reports if not r.invalid)
    _lines(f"{measured} cells measured; {len(changes)} change(s) against {base if old else 'no table'}:", changes)
    moved = table.moved_cells(old, new, rule.tie_band)
    if moved:
        _lines(f"{len(moved)} measured cell(s) changed winner:", moved)
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    if measured == 0:
        raise TunedbError("no leg produced a valid measurement; nothing written")
    from tunedb.database import store

    store.write_atomic(path, schema.dumps(new))
    print(f"wrote {path}")
    return 0


def _write_samples(path: Path, reports: Any) -> None:
    """Every measured cell's raw samples (ns per problem, per arm, round by round), statuses and
    pick, one cell a line (bench/linalg_pick_replay.py replays the rule on them)."""
    from tunedb.database import store

    lines = []
    for rep in reports:
        for r in rep.results:
            c = r.cell
            lines.append(json.dumps({"op": c.op, "dt": c.dt, "n": c.n, "batch": c.batch, "leg": rep.leg,
                                     "invalid": bool(rep.invalid),
                                     "samples": {a: list(v) for a, v in r.samples.items()},
                                     "statuses": dict(r.statuses), "winner": r.pick.winner, "native": r.pick.native,
                                     "rounds": [dict(x) for x in r.rounds]},
                                    sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    store.write_atomic(path, "\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cell(s) of raw samples to {path}", file=sys.stderr)


def _incumbents(keep_arg: str, old: Any, arch_family: str) -> dict:
    """--keep: the cells' (winner, native) a tune lets keep their cells (keep.incumbents)."""
    from tunedb.families.linalg import keep

    if keep_arg == "none":
        return {}
    if keep_arg == "base":
        return keep.incumbents(old.entries) if old is not None else {}
    path = Path(keep_arg)
    if not path.is_file():
        raise TunedbError(f"--keep {keep_arg}: not a file; allowed: base (the table this tune starts from), "
                          f"none, or a linalg table's path")
    return keep.incumbents(_read(path, arch_family).entries)


def _read(path: Path, arch_family: str) -> Any:
    from tunedb.database import schema

    if not path.exists():
        return None
    return schema.load(path, "linalg", arch_family)


def _compile(legs: Any, ops: Any, dtypes: Any, quick: bool, profile: Any, max_arms: int, jobs: int | None,
             timer: Any, ns: Any = None) -> list[str]:
    """Compile every kernel the chosen cells time, in parallel worker processes, before any
    timing (Triton's disk cache keeps them: the timed run is then execute-only). A fake timer
    (no GPU) compiles nothing."""
    from tunedb.families.linalg import configs, ladder

    if not hasattr(timer, "close") or configs.kernels() is None:  # not the GPU timer
        return []
    from tunedb.families.linalg import kernels_prebuild

    items = {(c.op, arm, c.n, c.dt) for c in ladder.cells(legs, quick, dtypes, ops, ns)
             for arm in ladder.arms(c, profile, max_arms) if arm not in (configs.LIBRARY, configs.EAGER_ONLY)}
    failed = kernels_prebuild.compile_all(sorted(items), jobs)
    print(f"compiled {len(items)} kernel(s), {len(failed)} failed", file=sys.stderr, flush=True)
    for line in failed:
        print("  " + line, file=sys.stderr)
    return failed
