"""`tunedb tune WORKLOAD`: the main job. Census -> build into the user tier -> evaluate -> report.

Without a GPU it measures nothing: it prints what the shipped system tier and the cost model
would serve for the workload on --arch (sm90 by default), and says so.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

from tunedb.commands.build import RichReporter, add_build_options, options_from, phase_line, print_plan
from tunedb.commands.census import add_length_options

NO_GPU = "No GPU: nothing was measured."
TUNE_TOP_K = 8


def configure(parser: argparse.ArgumentParser) -> None:
    from tunedb.census.presets import CALLABLE_CONTRACT

    parser.add_argument("workload", metavar="WORKLOAD",
                        help="a preset (whisper-base, whisper-large-v3, conformer, llama-3-8b, llama-3.2-3b) "
                             f"or module:callable; {CALLABLE_CONTRACT}")
    census = parser.add_argument_group("census")
    census.add_argument("--mode", default="offline", help="offline (default), prefill (offline batching, eager), streaming or decode")
    census.add_argument("--max-batch-size", type=int, default=8, help="largest batch served (8)")
    census.add_argument("--chunk-size", type=int, default=None, help="streaming: input frames per chunk")
    census.add_argument("--manifest", default=None, help="traffic: a JSONL manifest (else synthetic)")
    census.add_argument("--capture", default=None, help="merge a TUNEDB_CAPTURE recording")
    census.add_argument("--impl", default="auto", choices=("auto", "mirror", "hf", "torchaudio"),
                        help="model implementation: auto, mirror, hf, torchaudio")
    census.add_argument("--device", default="meta",
                        help="where the census builds the model (default meta: no weights); cpu for a model whose "
                             "forward reads tensor values (T5, BART: data-dependent control flow)")
    census.add_argument("--no-fused", dest="fused", action="store_false",
                        help="census the aten-level GEMMs instead of the calls tunedb.optimize(model) makes")
    add_length_options(census)
    parser.add_argument("--all-points", action="store_true",
                        help="print one plan row per (signature, M) point; by default a plan of more than "
                             "one screen is grouped by signature, heaviest first")
    # on demand, time matters more than the last 0.1%: top-8 measures 43% fewer arms than a
    # system-tier build's top-16 for 0.13% geomean regret (bench/topk_regret.py, BENCHMARKS.md)
    add_build_options(parser, out_default="user", top_k=TUNE_TOP_K)


def _census_kw(args: argparse.Namespace) -> dict[str, Any]:
    return dict(mode=args.mode, max_batch=args.max_batch_size, chunk=args.chunk_size,
                manifest=args.manifest, capture=args.capture, impl=args.impl, fused=args.fused,
                cached=args.device == "meta", device=args.device,  # the cache holds meta censuses only
                unit=args.unit, max_length=args.max_length, length_step=args.length_step)


def print_served(console: Any, served: list[Any], arch_family: str, all_points: bool = True,
                 family: str | None = None) -> None:
    """What each census point would be served (`family`: the one tuned, default gemm); on a
    terminal too narrow for the full keys, their short forms with a legend (signature_text); where
    even those do not fit, the signature and config cells fold onto more lines, so that no
    column is ever cut away. A model-tier point shows
    the predicted gain and its regime's error band, or the config the model declined. Without
    all_points, a plan longer than one screen is grouped by signature (commands/plan_table.py)."""
    from rich import box
    from rich.table import Table

    from tunedb.commands import plan_table
    from tunedb.runtime import serving

    def config_text(s: Any) -> str:
        d = serving.decision(s.point.signature.family, s.point.signature, s.point.m) if s.tier == "model" else None
        return f"model: {d.describe()}" if d is not None and d.config.id == s.config_id else s.config_id

    def table(sig_text: Any, compact: bool, fold: bool = False) -> Table:
        t = Table(title=f"what tunedb would serve on {arch_family} (user > system > cost model > default)",
                  box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD)
        for col in ("signature", "M", "weight", "must-tune" if not compact else "must", "tier", "config"):
            folds = fold and col in ("signature", "config")
            t.add_column(col, justify="right" if col in ("M", "weight") else "left", no_wrap=not folds,
                         overflow="fold" if folds else "ellipsis", min_width=8 if folds else None)
        for s in served:
            p = s.point
            t.add_row(sig_text(p.signature), str(p.m), f"{p.weight:.3f}", "yes" if p.must_tune else "",
                      s.tier, config_text(s))
        return t

    if all_points or len(served) <= plan_table.FULL_ROWS:
        plan_table.print_keyed(console, table, {s.point.signature for s in served})
    else:
        plan_table.print_grouped(console, served, arch_family)
    from tunedb.pipeline import OTHER

    counts = Counter(s.tier for s in served)
    order = ("user", "system", "model", "default", "unserved") + ((OTHER,) if counts.get(OTHER) else ())
    console.print("points per tier: " + ", ".join(f"{counts.get(t, 0)} {t}" for t in order))
    model_points = [s for s in served if s.tier == "model"]
    if model_points:
        decided = [serving.decision(s.point.signature.family, s.point.signature, s.point.m) for s in model_points]
        declined = sum(1 for d in decided if d is not None and d.declined)
        confident = sum(1 for d in decided if d is not None and d.best is not None and d.config is d.best)
        # the rest: the model predicts the fallback itself fastest (or has no candidate to rank)
        rest = len(model_points) - confident - declined
        console.print(f"cost model: {confident} of {len(model_points)} unmeasured point(s) served a predicted-faster "
                      f"config; {declined} declined (predicted gain not beyond the model's error band, or "
                      f"the shape far from every measured one: the fallback serves)"
                      + (f"; {rest} predicted the fallback fastest, which serves them" if rest else ""),
                      highlight=False)
    if counts.get("unserved") or counts.get(OTHER):
        from tunedb import families

        family = family or families.DEFAULT
        from tunedb.census.unpatched import UNPATCHED, WHY

        # another family's points: plan_served marked them OTHER (that family serves their key)
        elsewhere = [s.point.signature for s in served if s.tier == OTHER]
        unserved = [s.point.signature for s in served if s.tier == "unserved"]
        seen = [sig for sig in unserved if sig.op == UNPATCHED]
        if seen:
            why = Counter(sig.get("src") for sig in seen)
            console.print(f"seen, not patched: {len(seen)} point(s) over {len(set(seen))} signature(s) of calls "
                          f"tunedb.optimize() does not swap ("
                          + "; ".join(f"{n} {WHY.get(src, src)}" for src, n in sorted(why.items()))
                          + "): torch runs them, and nothing is measured or claimed for them (docs/unseen_shapes.md)",
                          highlight=False, markup=False)
            seen_set = set(seen)
            unserved = [sig for sig in unserved if sig not in seen_set]
        if elsewhere:
            fams = sorted({sig.family for sig in elsewhere})
            console.print(f"other families: {len(elsewhere)} point(s) of {', '.join(fams)}; this `tune` measures "
                          f"the {family} family, and until `tunedb tune WORKLOAD --family NAME` (or `tunedb census "
                          f"WORKLOAD --fused --out FILE` and `tunedb build --family NAME --census FILE`) measures "
                          f"them, tunedb.optimize() serves those calls from the shipped tier or leaves them to "
                          f"torch", highlight=False)
        rest = unserved
        if rest:
            # an op the family has is unserved for its dtype (fp32): say which
            ops = sorted({f"{sig.op} dt={sig.dt}" if sig.family in families.names()
                          and sig.op in families.get(sig.family).ops else sig.op for sig in rest})
            console.print(f"unserved: {len(rest)} point(s) of op(s) {', '.join(ops)} that no tunedb kernel family "
                          f"tunes; they always run on torch and are listed because the census saw them",
                          highlight=False)


def stale_line(arch_family: str, family: str, command: str, where: str = "user") -> str | None:
    """What the shipped tier's staleness means, when its entries were measured under other
    versions than this machine's (the entries still serve; a GPU re-measures them)."""
    from tunedb import database

    for tier in database.report(arch_family).tiers:
        for f in tier.files if tier.tier == "system" else ():
            if f.kernel_family != family or f.state != "loaded" or not f.stale:
                continue
            reasons = sorted({r for _sig, rs in f.stale for r in rs})
            return (f"the shipped {arch_family} tier: {len(f.stale)} of {f.entries} entries are stale "
                    f"({'; '.join(reasons)}). They still serve: their configs are correct here, but "
                    f"their speed was measured under those versions. To re-measure for this machine's, "
                    f"run `{command}` on a GPU" + (" (it writes the user tier, which wins)." if where == "user" else "."))
    return None


def tune_command(args: argparse.Namespace) -> str:
    """`tunedb tune` of this workload with the flags its census was taken with (the command a
    GPU machine runs to measure it)."""
    from tunedb.census.presets import AUDIO, PRESETS, USER_MAX_LENGTH

    import shlex

    q = shlex.quote
    flags = f" --mode {q(args.mode)}" if args.mode != "offline" else ""
    # every flag the census depends on, so that the GPU run measures the census shown here
    flags += f" --max-batch-size {args.max_batch_size}" if args.max_batch_size != 8 else ""
    flags += f" --chunk-size {args.chunk_size}" if args.chunk_size is not None else ""
    flags += f" --manifest {q(args.manifest)}" if args.manifest else ""
    flags += f" --capture {q(args.capture)}" if args.capture else ""
    flags += f" --impl {q(args.impl)}" if args.impl != "auto" else ""
    # the device the census was taken on (a model reading tensor values needs --device cpu)
    flags += f" --device {q(str(args.device))}" if str(getattr(args, "device", "meta")) != "meta" else ""
    flags += " --no-fused" if not args.fused else ""
    if args.workload not in PRESETS:  # a module:callable's probe lengths (a preset fixes its own)
        given = (("--unit", args.unit, AUDIO), ("--max-length", args.max_length, USER_MAX_LENGTH),
                 ("--length-step", args.length_step, 0))
        flags += "".join(f" {flag} {value}" for flag, value, default in given if value != default)
    from tunedb import families

    family = getattr(args, "family", None)
    flags += f" --family {family}" if family and family != families.DEFAULT else ""
    # and the build's own flags that change what is measured or where it goes (--arch is the GPU's
    # own there; --dry-run is the sentence's advice)
    # the --out the user gave (--simulate swaps "user" for a temporary directory: simulated_out)
    out = getattr(args, "given_out", None) or getattr(args, "out", "user")
    flags += f" --out {q(out)}" if out != "user" else ""
    flags += " --no-write" if getattr(args, "no_write", False) else ""
    flags += f" --top-k {args.top_k}" if getattr(args, "top_k", TUNE_TOP_K) != TUNE_TOP_K else ""
    for flag, attr in (("--exhaustive", "exhaustive"), ("--thin", "thin"), ("--fresh", "fresh")):
        flags += f" {flag}" if getattr(args, attr, False) else ""
    flags += " --no-fill" if getattr(args, "fill", True) is False else ""
    for flag, attr in (("--max-points", "max_points"), ("--min-speedup", "min_speedup"),
                       ("--gate-noise", "gate_noise"), ("--tie-band", "tie_band")):
        flags += f" {flag} {getattr(args, attr)}" if getattr(args, attr, None) is not None else ""
    return f"tunedb tune {q(args.workload)}{flags}"


def gpu_line(args: argparse.Namespace, signatures: int) -> str:
    """What to run on a GPU machine after a CPU run measured nothing."""
    if not signatures:
        # a family whose calls tune's census cannot key (its recorder keys modules: rnn's LSTMs)
        from tunedb import families
        from tunedb.families.contract import hook

        fam = families.get(args.family)
        if not hook(fam, "census_rules")():  # rnn keys modules (nn.LSTM / nn.GRU); linalg tunes a grid of sizes
            return (f"tune's census records no call of the {args.family} family: its table is keyed by what "
                    f"the family records itself (its modules, or a grid of problem sizes), not by the calls "
                    f"tune's census sees, so this plan cannot say whether {args.workload} has any. "
                    f"docs/{args.family}.md says how its table is measured on a GPU.")
        return (f"A GPU would measure nothing here either: no call of {args.workload} is one the "
                f"{args.family} family tunes (see the table above).")
    out = getattr(args, "out", "user")
    where = {"user": "the user tier", "system": "the shipped (system) tier"}.get(out, out)
    first = "" if getattr(args, "dry_run", False) else " (add --dry-run first to see the plan and its estimated time)"
    line = (f"On a GPU machine run `{tune_command(args)}`: it measures these {signatures} "
            f"signature(s) into {where}{first}.")
    blocked = _target_problem(args, out)
    return line if blocked is None else f"{line} On this machine it would stop before measuring: {blocked}"


def _target_problem(args: argparse.Namespace, out: str) -> str | None:
    """What the measuring run's target check would refuse here (the tier off, a corrupt or census
    file at --out), read-only; None when it would pass."""
    from tunedb import database
    from tunedb.build.steps import target_file
    from tunedb.errors import DatabaseError

    arch = getattr(args, "arch", None) or "sm90"
    try:
        path = target_file(out, arch, args.family)  # the file the build writes (--out DIR: DIR/<arch>/<family>.json)
        database.check_target(path, args.family, arch, fresh=bool(getattr(args, "fresh", False)),
                              write=not getattr(args, "no_write", False))
    except DatabaseError as exc:
        return str(exc)
    return None


def simulated_out(args: argparse.Namespace, console: Any) -> None:
    """--simulate into a tier ('user', the default): write to a new temporary directory instead,
    and say where. Simulated entries are the cost model plus noise and never serve."""
    import tempfile

    if args.simulate and args.out in ("user", "system") and getattr(args, "dry_run", False):
        console.print(f"--simulate --dry-run: nothing is written (a run would write to a new temporary "
                      f"directory, not the {args.out} tier)", highlight=False)
    elif args.simulate and args.out in ("user", "system"):
        args.given_out = args.out
        tier, args.out = args.out, tempfile.mkdtemp(prefix="tunedb-simulate-")
        console.print(f"--simulate: writing to the new temporary directory {args.out}, not the {tier} "
                      f"tier (simulated results never serve); it stays after this run: remove it when read, "
                      f"or name the directory with --out DIR", highlight=False)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BaseException:
        # --simulate's temporary directory is made before the census: a command that fails after
        # it (the workload's own error, a refused census) leaves no empty directory behind
        made = args.out if getattr(args, "given_out", None) else None
        if made:
            import os

            try:
                os.rmdir(made)  # only while empty: anything written stays, as announced
            except OSError:
                pass
        raise


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunedb import evaluate, families, pipeline, settings
    from tunedb.build import compile_pool, speculative, timeline

    console = Console()
    opts = replace(options_from(args), pair_cross=False)  # wall time first (BuildOptions.pair_cross)
    # --simulate into a tier goes to a new directory under the system's temporary one, made below
    # only once every option holds (a refused command leaves no directory behind)
    sim_tier = args.simulate and args.out in ("user", "system")
    import tempfile

    pipeline.buildsteps.check_options(replace(opts, out=tempfile.gettempdir()) if sim_tier else opts, gpu=True)
    from tunedb.census.presets import check_lengths

    check_lengths(args.workload, args.unit, args.max_length, args.length_step)  # before a worker starts
    if sim_tier:
        simulated_out(args, console)
        opts = replace(opts, out=args.out)
    from tunedb.census import beside

    likely = pipeline.buildsteps.gpu_likely()
    # first of all (TUNEDB_CENSUS_BESIDE=1): the census in a child, beside everything below; on
    # a GPU only: without one this process does nothing but import torch before the census, so
    # a child would only import it again (0.9 s slower on a 2-core CPU)
    child = beside.start(args.workload, _census_kw(args)) if likely else None
    # On a GPU the measuring worker and the compile pool start first, on the driver's word
    # (gpu_likely), before this process imports torch to ask CUDA (has_gpu): their imports and
    # CUDA start overlap this process's and the census (3.4 s of a warm tune waited on the
    # worker when it started after this process's torch import; session 10, call C)
    try:
        worker = pipeline.buildsteps.start_worker(opts, gpu=likely)
    except BaseException:
        if child is not None:
            child.close()
        raise
    try:
        worker = pipeline.buildsteps.confirm_worker(worker, opts, gpu=pipeline.has_gpu())
        timeline.mark("torch imported")
        if worker is not None:  # a real build: its compiles start from a mirror census's plan
            speculative.start(args.workload, opts, _census_kw(args), worker=worker)
        if child is not None:
            child.wait()  # then the census below is read from the cache (or taken, if it failed)
        from tunedb.commands.census_progress import census_progress

        with census_progress() as tell:
            shapes = pipeline.take_census(args.workload, **_census_kw(args), progress=tell)
        timeline.mark("census end")
        speculative.settle(opts.family)  # a profile measured in the worker beside the census is cached
    except BaseException:
        speculative.stop(opts.family)  # its measuring ends before its worker does
        if worker is not None:
            worker.close()
        compile_pool.release(families.get(opts.family))
        raise
    finally:
        if child is not None:
            child.close()
    sigs = shapes.signatures()
    console.print(f"census of {args.workload} ({args.mode}): {len(shapes.points)} point(s) over "
                  f"{len(sigs)} signature(s)")
    from tunedb.census.presets import describe_impl

    console.print(describe_impl(dict(shapes.meta).get("impl", "")), highlight=False)
    gpu = opts.simulate or pipeline.has_gpu()
    reporter = RichReporter(console) if gpu and not opts.dry_run else None
    timeline.mark("build start")
    try:
        result = pipeline.tune(args.workload, opts, shapes=shapes, reporter=reporter, worker=worker)
    finally:  # compiles no build took over (it stopped before measuring) must not outlive it
        compile_pool.release(families.get(opts.family))
    if result.served:
        print_served(console, result.served, opts.arch_family or "sm90", all_points=args.all_points,
                     family=args.family)
    fam = families.get(opts.family)
    tunable = len({p.signature for p in shapes.points if families.serves(fam, p.signature)})
    # the stale tier's advice is to tune this workload: only where the family has a call to tune
    where = "user" if (getattr(args, "given_out", None) or args.out) == "user" else "elsewhere"
    stale = stale_line(opts.arch_family or "sm90", opts.family, tune_command(args), where) if tunable else None
    if stale:
        console.print(stale, highlight=False)
    if result.build is not None and opts.dry_run:
        print_plan(console, result.build.plans)
    if not result.measured:
        console.print(NO_GPU if not gpu else "--dry-run: nothing was measured.")
        if not gpu:
            console.print(gpu_line(args, tunable), highlight=False)
        return 0
    b = result.build
    console.print(f"measured {b.arms_measured} arm(s) in {b.seconds:.1f} s; log: {b.log_path}")
    if b.phase_seconds:
        console.print(f"where the time went: {phase_line(b.phase_seconds, b.seconds)}")
    if b.compile:
        from tunedb.build.compile_pool import describe

        console.print(describe(b.compile), highlight=False)
    if b.ahead:
        console.print(speculative.describe(b.ahead), highlight=False)
    if b.path is not None:
        console.print(f"wrote {b.path}")
    if settings.timeline_enabled():
        console.print(timeline.line(), highlight=False, soft_wrap=True)
    if result.evaluation is not None:
        evaluate.render_table(result.evaluation, console)
    if opts.simulate:
        console.print("--simulate: every number above came from the cost model plus noise, not a GPU")
    sys.stdout.flush()
    return 0
