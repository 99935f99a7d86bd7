"""A build's run: plan every census signature, measure, partition, checkpoint, calibrate, write.

pipeline.build() is the entry point (`tunedb build`); this module holds its records
(BuildOptions, BuildResult, Reporter) and its body, calling the per-signature steps in steps.py.
No concrete family: the family comes from the registry, its cost model and pick rule through
its contract hooks.
"""
from __future__ import annotations

import collections

import dataclasses
import functools
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tunedb import database, families
from tunedb.build import checkpoint, compile_pool, distributed, partition, replay, signature_steps, speculative
from tunedb.build import plan as buildplan
from tunedb.build import steps as buildsteps
from tunedb.errors import BuildError, BusyGPUError, DatabaseError, TunedbWarning
from tunedb.records import ArchProfile, Entry, Point, ShapeSet, Signature


@dataclass(frozen=True)
class BuildOptions:
    out: str = "user"  # 'user', 'system' or a directory
    family: str = families.DEFAULT
    arch_family: str | None = None  # None: the current GPU's (sm90 without one)
    thin: bool = False
    max_points: int | None = None
    min_speedup: float | None = None  # None: the family's pick rule's gate (GEMM: 1.05)
    gate_noise: float | None = None  # None: the family's (PickRule.gate_noise: a stricter gate for narrow regions)
    tie_band: float | None = None  # None: the family's (PickRule.tie_band: within it of a point's best counts as tied)
    fresh: bool = False
    dry_run: bool = False
    no_write: bool = False
    simulate: bool = False
    run_id: str | None = None
    exhaustive: bool = False
    allow_busy: bool = False
    top_k: int = buildplan.TOP_K
    seed: int = 0  # --simulate: the noise seed
    noise: float = 0.01  # --simulate: relative noise sigma
    isolate: bool = True  # real builds: measure in a worker subprocess
    # False (--no-fill): measure the census's Ms only, not the ladder edges between and above
    # them; for a census of exactly the Ms a model calls (sizes above the largest take torch)
    fill: bool = True
    # --workers N / --ray ADDRESS: measure on one Ray actor per GPU (build/distributed.py)
    workers: int = 0
    ray: str | None = None
    simulate_delay_ms: float = 0.0  # --simulate with --workers/--ray: sleep per arm (stands in for GPU time)
    replay: str | None = None  # a measurement log: rebuild from its numbers and its plan, no GPU (build/replay.py)
    # the cross-evaluation call times the fallback again, so its arms pair with it
    # (partition.objective_table): a build's tables must come out the same on a re-run; `tunedb
    # tune` turns it off (+1 arm per point, 0.5-2 s of a 15-33 s whisper-base tune, session 32)
    pair_cross: bool = True


@dataclass
class BuildResult:
    plans: list[buildplan.SignaturePlan]
    run_id: str = ""
    path: Path | None = None  # the database file written (None: dry run / --no-write)
    log_path: Path | None = None
    entries: list[Entry] = field(default_factory=list)
    changes: tuple[Any, ...] = ()  # --no-write: database.Change against the current file
    arms_measured: int = 0
    resumed: tuple[str, ...] = ()  # signatures taken from the run's checkpoints
    skipped: tuple[str, ...] = ()  # census signatures the family does not serve (other families', other ops)
    triton_cache: str = ""  # the Triton cache the build compiles into / loads from
    prebuilt: int = 0  # configs `tunedb prebuild` compiled there for this Triton
    seconds: float = 0.0
    census_seconds: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # Measurer.phases: where the time went
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # --workers/--ray: each actor's share
    lost: tuple[str, ...] = ()  # --workers/--ray: signatures re-queued after their actor died
    compile: dict[str, Any] = field(default_factory=dict)  # the compile pool's report (build/compile_pool.py)
    ahead: dict[str, Any] = field(default_factory=dict)  # points measured during the census (build/speculative.py)


def arch_profile(arch_family: str | None, real: bool) -> ArchProfile:
    """This GPU's profile on a real build (arch.current_profile: cached per SKU, measured once),
    else the shipped profile of `arch_family` (sm90 by default)."""
    from tunedb import arch

    if real:
        prof = arch.current_profile()
        if arch_family and prof.arch_family != arch_family:
            raise BuildError(f"--arch {arch_family} but this GPU is {prof.arch_family} ({prof.sku}); "
                             f"a build measures the GPU it runs on")
        return prof
    return arch.shipped_profile(arch_family or "sm90")


def read_census(path: str | Path) -> ShapeSet:
    from tunedb import census

    return census.read_census(Path(path))


def signatures_by_census(censuses: Sequence[tuple[str, ShapeSet]], family: Any
                         ) -> tuple[dict[Signature, list[Point]], dict[str, list[Signature]], list[Signature]]:
    """Every signature's points over all censuses, each census's signatures (a signature belongs
    to the first census that has it, so each is measured once), and the signatures skipped
    because they are another family's or an op the family has not (a census records every family's)."""
    points: dict[Signature, list[Point]] = {}
    owner: dict[str, list[Signature]] = {}
    skipped: dict[Signature, None] = {}
    for name, shapes in censuses:
        mine = owner.setdefault(name, [])
        for sig in shapes.signatures():
            if sig.family != family.name or not families.serves(family, sig):  # named by the build's summary
                skipped[sig] = None
                continue
            if sig not in points:
                mine.append(sig)
            points.setdefault(sig, []).extend(shapes.for_signature(sig))
    return points, owner, list(skipped)


def plan_build(censuses: Sequence[tuple[str, ShapeSet]], opts: BuildOptions, arch: ArchProfile,
               calibrated: Any = None, *, by_census: Any = None,
               compiled: set[str] | None = None) -> tuple[list[buildplan.SignaturePlan], dict[str, list[Signature]]]:
    """Each signature's plan; `by_census` (signatures_by_census's result) and `compiled` (the
    prebuilt config ids) when the caller already has them."""
    family = families.get(opts.family)
    points, owner, _ = by_census or signatures_by_census(censuses, family)
    if not points:
        # the family with the most signatures first: the one the census was most likely taken for
        seen = collections.Counter(s.family for _, shapes in censuses for s in shapes.signatures()
                                   if s.family != opts.family)
        others = sorted(seen, key=lambda f: (-seen[f], f))
        hint = (f"; it names kernel famil{'y' if len(others) == 1 else 'ies'} {', '.join(map(repr, others))}: "
                f"pass --family {others[0]}" if others else "")
        raise BuildError(f"the census has no signature of an op of kernel family {opts.family!r} "
                         f"(ops: {', '.join(family.ops)}; dtypes: {', '.join(family.schema.dtypes) or 'any'}) "
                         f"in {', '.join(n for n, _ in censuses)}{hint}")
    ranks = buildsteps.rankers(family, arch, calibrated)
    thin = (lambda pts: partition.thin(pts, opts.max_points)) if opts.thin else None
    # Every (signature, M, config) is predicted by the filter, the sort and the estimate: once.
    predict = functools.lru_cache(maxsize=None)(buildsteps.predictor(family, arch, calibrated))
    if compiled is None:
        compiled = buildsteps.prebuilt_configs(opts.family, arch.arch_family)
    plans = []
    ladder = family.schema.ladder
    for sig in [s for name, _ in censuses for s in owner[name]]:
        # without a cost model to rank them, every valid config is measured
        plan = buildplan.plan_signature(family, points[sig], arch, ranks, top_k=opts.top_k,
                                        exhaustive=opts.exhaustive or not ranks, thin=thin,
                                        fill=opts.fill, ladder=ladder)
        predicted = {m: [c for c in ids if predict(sig, m, c) is not None] for m, ids in plan.arms.items()}
        ranked = {m: sorted(ids, key=lambda c: (predict(sig, m, c), c)) for m, ids in predicted.items()}
        cross = len(partition.cross_eval_plan(plan.points, ranked, buildplan.CROSS_TOP))
        est = buildplan.estimate_seconds(sig, plan.arms, predict, cross, compiled)
        plans.append(dataclasses.replace(plan, cross_pairs=cross, est_seconds=est))
    return plans, owner


class Reporter:
    """What a build tells its caller as it goes (the CLI draws a rich progress bar from it)."""

    def start(self, plans: Sequence[buildplan.SignaturePlan], resumed: Sequence[Signature]) -> None: ...

    def signature(self, plan: buildplan.SignaturePlan, index: int, total: int) -> None: ...

    def advance(self, arms: int) -> None: ...

    def census_done(self, name: str, signatures: int, arms: int, seconds: float) -> None: ...

    def stop(self) -> None: ...


def run(censuses: Sequence[tuple[str, ShapeSet]], opts: BuildOptions, timer: Any,
        reporter: Reporter | None, worker: Any, gpu: bool) -> BuildResult:
    """The build's body (pipeline.build is its entry point): `gpu` says whether this process
    measures on a GPU (False under --simulate or with a caller's timer)."""
    started = time.perf_counter()
    reporter = reporter or Reporter()
    buildsteps.check_options(opts, gpu or timer is not None)
    distributed.check_options(opts)
    family = families.get(opts.family)
    arch = arch_profile(opts.arch_family, real=gpu)
    try:
        target = buildsteps.target_file(opts.out, arch.arch_family, opts.family)
    except DatabaseError:
        if not opts.dry_run:
            raise
        target = None
    if not opts.dry_run:  # a target the final write would refuse stops the build before measuring
        database.check_target(target, opts.family, arch.arch_family, fresh=opts.fresh, write=not opts.no_write)
        if opts.no_write and opts.out not in database.TIERS:  # --no-write still appends DIR/measurements.jsonl
            buildsteps.check_log_writable(opts.out)
    existing = buildsteps.existing_file(target, opts.family, arch.arch_family)
    if opts.simulate and not opts.fresh and not opts.dry_run and existing is not None:
        buildsteps.refuse_simulated_merge(target, existing)
    by_census = signatures_by_census(censuses, family)
    compiled = buildsteps.prebuilt_configs(opts.family, arch.arch_family)
    plans, owner = plan_build(censuses, opts, arch, buildsteps.model_params(existing.model if existing else None),
                              by_census=by_census, compiled=compiled)
    logged = replay.LoggedRun(opts.replay) if opts.replay else None
    if logged is not None:
        plans = replay.replan(plans, logged)  # picks the run, whose provenance names its arch
        logged.check_arch(arch.arch_family)
        if logged.simulated():  # a --simulate build's log: its entries are simulated as that build's were
            what = f"--replay of a simulated log ({opts.replay})"
            buildsteps.check_simulated_out(opts, what)
            opts = dataclasses.replace(opts, simulate=True)
            if not opts.fresh and not opts.dry_run and existing is not None:
                buildsteps.refuse_simulated_merge(target, existing)
    result = BuildResult(plans, skipped=tuple(s.format() for s in by_census[2]))
    result.triton_cache = str(families.hook(family, "compiler_cache")() or "")
    result.prebuilt = len(compiled)
    if opts.dry_run:
        return result
    from tunedb.measure import collect_provenance
    from tunedb.measure.log import MeasurementLog, new_run_id, read_log

    points = by_census[0]
    # the target is an input too: a run resumed into another --out left its log and half its
    # measurements in the first one (session 53)
    run = checkpoint.open_run(opts.run_id or new_run_id(), {**buildsteps.run_meta(opts, arch, points),
                                                            "target": str(Path(target).resolve())})
    result.run_id = run.run_id
    result.log_path = buildsteps.log_file(opts.out, target, run)
    gpu_id = {}
    if gpu:
        from tunedb.measure.gpuenv import NvmlEnv

        env = NvmlEnv()
        gpu_id = env.identity()
        busy = env.foreign_pids()
        if busy and not opts.allow_busy:  # refuse before spending minutes on compiles
            raise BusyGPUError(f"GPU busy: foreign compute process(es) {', '.join(map(str, sorted(busy)))} "
                               f"hold it; build on a quiet GPU or pass --allow-busy (results marked contended)")
    recorded_by = logged.provenance if logged else dataclasses.replace(
        collect_provenance(gpu=gpu_id), impl_hash=database.validators.family_impl_hash(family) or "",
        arch=arch.arch_family)
    log = MeasurementLog(result.log_path, recorded_by, run.run_id)
    finished = run.finished()
    by_sig = {p.signature: p for p in plans}
    result.resumed = tuple(s.format() for s in by_sig if s in finished)
    reporter.start(plans, [s for s in by_sig if s in finished])
    measure = buildsteps.Measurer(family, opts, arch, log, buildsteps.working_sets(censuses, family), timer,
                                  worker, replayed=logged)
    if not distributed.wanted(opts):  # points measured during the census, before this plan retargets the pool
        measure.ahead = speculative.take_over(family.name, arch.arch_family, measure)
    if gpu or (timer is not None and not opts.simulate and logged is None and compile_pool.configured()):
        measure.compiles = compile_pool.start_for_build(family, arch.arch_family, plans, finished)
        if measure.compiles is not None and measure.worker is not None:  # its start overlaps the first compiles
            from tunedb.measure.isolated import StartRequest

            measure.worker.prestart(StartRequest(opts.family))
    setup_s = time.perf_counter() - started
    entries: dict[Signature, Entry] = {}
    spread_done: dict[Signature, Any] = {}  # the actors' signatures, as checkpointed (arms, GPU seconds)
    try:
        if distributed.wanted(opts):
            spread = distributed.measure_all([p for p in plans if p.signature not in finished], opts, arch,
                                             measure.working_set, timer, log, run, reporter, gpu)
            entries.update(spread.entries)
            measure.arms += spread.arms
            result.workers, result.lost = spread.workers, tuple(spread.lost)
            measure.phases.update(spread.phases)
            spread_done = {s: f for s, f in run.finished().items() if s in spread.entries}
        if measure.ahead is not None:  # the rest of its points in compile order, before the loop takes them
            speculative.fill_after([p for p in plans if p.signature not in finished], measure)
        index = 0
        for name, _ in censuses:
            t0, arms0 = time.perf_counter(), measure.arms
            spread_arms, spread_s = 0, 0.0  # measured before this loop, by the actors
            for sig in owner[name]:
                index += 1
                if sig in finished:
                    entries[sig] = finished[sig].entry
                    continue
                if sig in entries:  # measured by the actors
                    done = spread_done.get(sig)
                    if done is not None:
                        spread_arms, spread_s = spread_arms + done.arms_measured, spread_s + done.seconds
                    continue
                plan = by_sig[sig]
                reporter.signature(plan, index, len(plans))
                s0, a0 = time.perf_counter(), measure.arms
                entry, _ = signature_steps.build_signature(plan, measure, opts, reporter.advance)
                entries[sig] = entry
                run.save(checkpoint.Finished(entry, buildsteps.entry_config_ids(entry),
                                             measure.arms - a0, round(time.perf_counter() - s0, 3)))
            secs = time.perf_counter() - t0 + spread_s  # the actors' time: GPU-busy seconds, summed
            result.census_seconds[name] = secs
            reporter.census_done(name, len(owner[name]), measure.arms - arms0 + spread_arms, secs)
    finally:
        measure.close()
        reporter.stop()
    result.arms_measured = measure.arms
    result.compile = compile_pool.report(measure.compiles)
    result.ahead = measure.ahead.report() if measure.ahead is not None else {}
    result.phase_seconds = {"setup": setup_s, **measure.phases}
    written = time.perf_counter()
    result.entries = [entries[p.signature] for p in plans]
    records = read_log(log.path) if log.path.exists() else []
    mine = [r.measurement for r in records if r.run_id == run.run_id]
    configs = buildsteps.configs_of(family, result.entries, mine)
    # The file's model covers every build that wrote it: this run's fit merged into the old one.
    old_model = None if opts.fresh else buildsteps.model_params(existing.model if existing else None)
    model = families.hook(family, "calibrate")(arch, mine, configs, old_model)
    if model is None:  # a family without a cost model keeps the file's model as it was
        model = old_model
    if opts.no_write:
        result.changes = buildsteps.would_change(existing, opts, arch, result.entries, configs, model)
    else:
        for sig, lost in buildsteps.dropped_points(None if opts.fresh else existing, result.entries).items():
            warnings.warn(f"tunedb build: replacing {sig}: the file's entry was measured at M="
                          f"{','.join(map(str, lost))}, which this build did not measure; build the "
                          f"censuses that reach them together (--census A --census B) to keep them",
                          TunedbWarning, stacklevel=2)
        # a replay's file carries the recorded environment, not this machine's
        recorded = logged.validators(database.validators.family_impl_hash(family)) if logged else None
        result.path = database.write_entries(target, opts.family, arch.arch_family, result.entries,
                                             {k: v for k, v in configs.items() if not v.is_sentinel},
                                             recorded, model=model, fresh=opts.fresh)
    result.seconds = time.perf_counter() - started
    result.phase_seconds["write"] = result.seconds - (written - started)
    return result


