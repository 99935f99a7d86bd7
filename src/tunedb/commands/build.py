"""`tunedb build`: measure censuses and write a tuning database (the chain is pipeline.build)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from tunedb import families
from tunedb.build.plan import TOP_K
from tunedb.errors import BuildError


def add_build_options(parser: argparse.ArgumentParser, *, out_default: str | None = None,
                      top_k: int = TOP_K) -> None:
    """The flags `tunedb build` and `tunedb tune` share (`top_k`: this command's --top-k default)."""
    parser.add_argument("--out", default=out_default, required=out_default is None,
                        help="'user' (this machine's tier), 'system' (the shipped tier in the source "
                             "tree; real GPU only) or a directory (DIR/<arch>/<family>.json + "
                             "DIR/measurements.jsonl)")
    parser.add_argument("--family", default=families.DEFAULT, help=f"kernel family (default {families.DEFAULT})")
    parser.add_argument("--arch", default=None, help="arch family, e.g. sm90 (default: this GPU's)")
    parser.add_argument("--thin", action="store_true", help="cap points per signature (with --max-points)")
    parser.add_argument("--max-points", type=int, default=None, metavar="N",
                        help="with --thin: keep at most N points per signature")
    parser.add_argument("--no-fill", dest="fill", action="store_false",
                        help="measure the census's sizes only, not the bucket-ladder edges between and "
                             "above them (for a census of exactly the sizes a model calls; larger sizes "
                             "then take torch)")
    parser.add_argument("--min-speedup", type=float, default=None,
                        help="a config must beat the family's fallback by this factor to take a region "
                             "(default: the family's pick rule)")
    parser.add_argument("--gate-noise", type=float, default=None, metavar="X",
                        help="a region of n measured points must beat the fallback by the gate x (1 + X/sqrt(n)), "
                             "so wins resting on one noisy point need a wider margin and a re-run emits the same "
                             "regions (n counted by traffic; default: the family's pick rule, 0 for every "
                             "built-in family)")
    parser.add_argument("--tie-band", type=float, default=None, metavar="X",
                        help="an arm within X of a point's fastest counts as fast as it and the simpler one "
                             "wins (default: the family's pick rule, 0.03; narrower: less regret by design, "
                             "regions that move more between rebuilds)")
    parser.add_argument("--fresh", action="store_true", help="replace the target file instead of merging")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and estimated time; measure nothing")
    parser.add_argument("--no-write", action="store_true",
                        help="measure, then print the diff against the current file without writing it "
                             "(--out DIR: the measurement log DIR/measurements.jsonl is still appended)")
    parser.add_argument("--simulate", action="store_true",
                        help="measure with the fake timer (cost model + seeded noise); entries say 'simulated'")
    parser.add_argument("--seed", type=int, default=0, help="--simulate: the noise seed (default 0)")
    parser.add_argument("--run-id", default=None,
                        help="name the run; a killed build resumes with the same --run-id")
    parser.add_argument("--exhaustive", action="store_true",
                        help="measure every valid config at every point (the oracle; slow)")
    parser.add_argument("--allow-busy", action="store_true",
                        help="measure even when other processes use the GPU (results marked contended)")
    parser.add_argument("--top-k", type=int, default=top_k, help=f"cost-model candidates per point ({top_k})")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process instead of a worker subprocess (debugging)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--census", action="append", required=True, metavar="F",
                        help="a census file from `tunedb census` (repeatable)")
    add_build_options(parser)
    parser.add_argument("--replay", default=None, metavar="LOG.jsonl",
                        help="rebuild from a recorded measurement log, on any machine: each point measures "
                             "the configs the log holds there and every number is the log's (the file's "
                             "validators are the log's environment)")
    parser.add_argument("--json", action="store_true", help="print the result (or plan) as JSON")
    add_distributed_options(parser)


def add_distributed_options(parser: argparse.ArgumentParser) -> None:
    """--workers/--ray (build/distributed.py; Ray is imported only when one is given)."""
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="measure on N GPUs of this host, one Ray actor each (needs tunedb[ray])")
    parser.add_argument("--ray", default=None, metavar="ADDRESS",
                        help="measure on the GPUs of a Ray cluster ('auto' joins the local one); "
                             "one actor per GPU, or --workers of them")
    parser.add_argument("--simulate-delay", dest="simulate_delay_ms", type=float, default=0.0, metavar="MS",
                        help="--simulate with --workers/--ray: each actor sleeps MS per arm (GPU time stand-in)")


def options_from(args: argparse.Namespace) -> Any:
    from tunedb.pipeline import BuildOptions

    if args.seed is not None and args.seed != 0 and not args.simulate:
        raise BuildError(f"--seed={args.seed} only applies with --simulate")
    return BuildOptions(out=args.out, family=args.family, arch_family=args.arch, thin=args.thin,
                        max_points=args.max_points, min_speedup=args.min_speedup,
                        gate_noise=args.gate_noise, tie_band=args.tie_band, fresh=args.fresh,
                        dry_run=args.dry_run, no_write=args.no_write, simulate=args.simulate,
                        run_id=args.run_id, exhaustive=args.exhaustive, allow_busy=args.allow_busy,
                        top_k=args.top_k, seed=args.seed, isolate=not args.in_process, fill=args.fill,
                        workers=getattr(args, "workers", 0) or 0, ray=getattr(args, "ray", None),
                        simulate_delay_ms=getattr(args, "simulate_delay_ms", 0.0) or 0.0,
                        replay=getattr(args, "replay", None))


class RichReporter:
    """A rich progress bar over the planned arms, and one line per finished census."""

    def __init__(self, console: Any, simulated: bool = False) -> None:
        self.console = console
        self.progress: Any = None
        self.task: Any = None
        self.done = "simulated (the fake timer: nothing ran on a GPU)" if simulated else "measured"

    def start(self, plans: Sequence[Any], resumed: Sequence[Any]) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        skip = {s for s in resumed}
        total = sum(p.arm_count + p.cross_pairs for p in plans if p.signature not in skip)
        if resumed:
            self.console.print(f"resuming: {len(resumed)} signature(s) already finished in this run")
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.progress.start()
        self.task = self.progress.add_task("measuring" if self.done == "measured" else "simulating", total=max(total, 1))

    def signature(self, plan: Any, index: int, total: int) -> None:
        self.progress.update(self.task, description=f"[{index}/{total}] {plan.signature}")

    def advance(self, arms: int) -> None:
        task = self.progress.tasks[0]
        if task.completed + arms > task.total:  # cross-evaluation ran past its estimate
            self.progress.update(self.task, total=task.completed + arms)
        self.progress.advance(self.task, arms)

    def census_done(self, name: str, signatures: int, arms: int, seconds: float) -> None:
        self.console.print(f"census {name}: {signatures} signature(s), {arms} arm(s) {self.done}, "
                           f"{seconds:.1f} s wall")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def print_plan(console: Any, plans: Sequence[Any]) -> None:
    from rich import box
    from rich.table import Table

    from tunedb.build.plan import plan_rows
    from tunedb.commands.plan_table import print_keyed
    from tunedb.records import Signature

    rows = plan_rows(plans)

    def table(sig_text: Any, compact: bool, fold: bool = False) -> Any:
        t = Table(title="build plan (nothing measured)", box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD)
        for col in ("signature", "census pts", "fill pts", "arms", "cross-eval", "configs", "est. s"):
            sig_col = col == "signature"
            t.add_column(col, justify="left" if sig_col else "right", no_wrap=not (fold and sig_col),
                         overflow="fold" if fold and sig_col else "ellipsis")
        for r in rows:
            t.add_row(sig_text(Signature.parse(r["signature"])), str(r["census_points"]), str(r["fill_points"]),
                      str(r["arms"]), str(r["cross_eval"]), str(r["configs"]), f"{r['est_seconds']:.0f}")
        return t

    # a cut key read `gemm|op=gemm...` on every row of an 80-column terminal
    print_keyed(console, table, {Signature.parse(r["signature"]) for r in rows})
    total = sum(r["est_seconds"] for r in rows)
    arms = sum(r["arms"] + r["cross_eval"] for r in rows)
    console.print(f"{len(rows)} signature(s), {sum(len(r['M']) for r in rows)} point(s), about {arms} "
                  f"arm measurement(s); estimated {total / 60:.1f} min (cost model + protocol overhead)")


def phase_line(phases: dict[str, float], total: float) -> str:
    """Where a build's measuring time went, e.g. 'worker start 2.1 s, probes 3.0 s, ...'
    (protocol.PHASES in order, then any other key)."""
    from tunedb.measure.protocol import PHASES

    order = [k for k in PHASES if k in phases] + sorted(k for k in phases if k not in PHASES)
    parts = [f"{name} {phases[name]:.1f} s" for name in order]
    rest = total - sum(phases.values())
    return ", ".join(parts + [f"the rest (partition, checkpoints) {max(rest, 0.0):.1f} s"])


def report(console: Any, result: Any, opts: Any, as_json: bool = False) -> None:
    if as_json:
        from tunedb.build.plan import plan_rows

        out = {"plan": plan_rows(result.plans), "run_id": result.run_id,
               "path": str(result.path) if result.path else None,
               "log": str(result.log_path) if result.log_path else None,
               "arms_measured": result.arms_measured, "seconds": round(result.seconds, 2),
               "census_seconds": {k: round(v, 2) for k, v in result.census_seconds.items()},
               "phase_seconds": {k: round(v, 3) for k, v in result.phase_seconds.items()},
               "resumed": list(result.resumed), "skipped": list(result.skipped),
               "triton_cache": result.triton_cache, "prebuilt": result.prebuilt,
               "compile": getattr(result, "compile", {}),
               "changes": [c.to_json() for c in result.changes],
               "workers": result.workers, "lost": list(result.lost)}
        print(json.dumps(out, indent=1))
        return
    if result.skipped:
        from collections import Counter

        keys = [s.split("|", 2) for s in result.skipped]  # family, op=..., the rest
        own = sorted({k[1] for k in keys if k[0] == opts.family})
        others = Counter(k[0] for k in keys if k[0] != opts.family)
        parts = ([f"ops the {opts.family} family does not serve: {', '.join(own)}"] if own else []) + [
            f"{n} of the {fam} family (--family {fam} builds them)" if fam in families.names()
            else f"{n} of {fam!r}, a family not registered here" for fam, n in sorted(others.items())]
        console.print(f"skipped {len(result.skipped)} signature(s): {'; '.join(parts)}")
    if result.triton_cache:
        console.print(f"Triton cache: {result.triton_cache} ({result.prebuilt} config(s) prebuilt by `tunedb prebuild`)")
    if opts.dry_run:
        print_plan(console, result.plans)
        return
    verb = "simulated" if opts.simulate else "measured"
    console.print(f"{verb} {result.arms_measured} arm(s) over {len(result.entries)} signature(s) in "
                  f"{result.seconds:.1f} s (run {result.run_id})"
                  + ("; --simulate: the fake timer's times, nothing ran on a GPU" if opts.simulate else ""))
    if result.phase_seconds:
        console.print(f"where the time went: {phase_line(result.phase_seconds, result.seconds)}")
    for worker, w in result.workers.items():
        console.print(f"GPU worker {worker}: {w['points']} point task(s), busy {100 * w['busy_fraction']:.0f}%"
                      + (" (died)" if w["dead"] else ""))
    for line in result.lost:
        console.print(line, markup=False, highlight=False)
    if getattr(result, "compile", None):
        from tunedb.build.compile_pool import describe

        console.print(describe(result.compile), highlight=False)
    console.print(f"measurement log: {result.log_path}")
    if opts.no_write:
        counted = sum(c.counted for c in result.changes)
        console.print(f"--no-write: {counted} change(s) against the current file, nothing written")
        for change in result.changes:
            console.print("  " + change.line(), markup=False, highlight=False)
    else:
        console.print(f"wrote {result.path}")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunedb import pipeline

    opts = options_from(args)
    pipeline.buildsteps.check_options(opts, gpu=True)  # flag errors before reading any census (GPU checked later)
    # one file named twice (a shell glob and a name) is one census: planned twice, its every
    # signature would be estimated and counted twice
    paths = list({str(Path(p).resolve()): p for p in args.census}.values())
    censuses = [(path, pipeline.read_census(path)) for path in paths]
    console = Console(file=sys.stderr if args.json else sys.stdout)
    reporter = None if (args.json or opts.dry_run) else RichReporter(console, simulated=opts.simulate)
    result = pipeline.build(censuses, opts, reporter=reporter)
    report(console, result, opts, args.json)
    return 0
