"""The spine: census -> plan -> measure -> partition -> database -> evaluate, in that order.

`take_census()` is `tunedb census`'s probe; `build()` is `tunedb build` (DESIGN.md "The build";
its body is build/run.py: per signature, measure the census and ladder fill points for the
family's cost-model top-k, or every valid config without a model, plus the forced arms,
cross-evaluate, partition under the family's pick rule, checkpoint, calibrate, write);
`evaluate_logs()` (evaluate/oracle.py) is `tunedb evaluate`; `plan_served()` is what
`tunedb tune` prints without a GPU; `tune()` chains them all. Build records (BuildOptions,
BuildResult, Reporter) and plan_build are re-exported from build/run.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tunedb import families
from tunedb.build import run, speculative, timeline
from tunedb.build import steps as buildsteps
from tunedb.build.run import (BuildOptions, BuildResult, Reporter, arch_profile, plan_build,  # noqa: F401
                              read_census, signatures_by_census)
from tunedb.census.presets import AUDIO, USER_MAX_LENGTH
from tunedb.evaluate import Evaluation
from tunedb.evaluate.oracle import evaluate_logs  # noqa: F401 - re-exported: `tunedb evaluate`, tune's report
from tunedb.records import Point, ShapeSet


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no usable torch: no GPU to measure on
        return False


def build(censuses: Sequence[tuple[str, ShapeSet]], opts: BuildOptions, *, timer: Any = None,
          reporter: Reporter | None = None, worker: Any = None) -> BuildResult:
    """`tunedb build` on parsed censuses ((name, ShapeSet) pairs). `timer` replaces the protocol's
    timer (tests; --simulate builds its own FakeTimer); `worker` is a prestarted one
    (buildsteps.start_worker), which the build then owns and closes, whatever happens."""
    try:
        gpu = False if (opts.simulate or timer is not None or opts.replay) else has_gpu()
        return run.run(censuses, opts, timer, reporter, worker, gpu)
    finally:
        speculative.stop(opts.family)  # a pass measuring ahead that the build did not take over
        if worker is not None:
            worker.close()


def take_census(workload: str, mode: str = "offline", max_batch: int = 8, chunk: int | None = None,
                manifest: str | None = None, capture: str | None = None, impl: str = "auto",
                fused: bool = True, cached: bool = False, unit: str = AUDIO, max_length: int = USER_MAX_LENGTH,
                length_step: int = 0, progress: Any = None, device: str = "meta") -> ShapeSet:
    """The census of a workload on `device` (meta tensors by default: no GPU, no weights), merged with a capture file;
    fused: of tunedb.optimize(model), keyed as the run time calls (see census.probe); cached: a
    preset's census is reused from the cache when taken before with the same key (census/cache.py);
    unit, max_length, length_step: a module:callable's probe lengths (`tunedb census --unit`;
    a preset fixes its own, so they are not in the cache key); progress: probe.take_census's
    display callback (not in the cache key either: a cached census takes no steps)."""
    from tunedb.census import cache, merge, presets, probe, read_capture

    def take() -> ShapeSet:
        return probe.take_census(presets.workload(workload, unit, max_length, length_step), mode, max_batch,
                                 chunk, manifest, device=device, impl=impl, fused=fused,
                                 **({"progress": progress} if progress is not None else {}))

    shapes = (cache.cached(workload, take, mode=mode, max_batch=max_batch, chunk=chunk, manifest=manifest,
                           impl=impl, fused=fused) if cached else take())
    return merge(shapes, read_capture(capture)) if capture else shapes


@dataclass(frozen=True)
class Served:
    """What the selector would serve at one census point, and from which tier."""

    point: Point
    tier: str  # user, system, model, default; OTHER for another family's op; "unserved" for an op none serves
    config_id: str


def plan_served(shapes: ShapeSet, arch_family: str = "sm90", family: str = families.DEFAULT) -> list[Served]:
    """Resolve every census point through the selector pinned to `arch_family`: exactly what the
    run time would serve there (its cost-model tier is the family's ranker on the tier file's
    model). The pin is undone afterwards."""
    from tunedb.runtime import selector
    fam = families.get(family)
    # the run's calls carry the model's own dtype, keyed `half` by the census: resolved in it, an
    # entry written under bf16 / fp16 (autotune's) serves the plan as it serves the run
    concrete = dict(shapes.meta).get("dtype")
    selector.configure(arch_family=arch_family)
    try:
        out = []
        for p in sorted(shapes.points, key=lambda p: (p.signature, p.m)):
            if not families.serves(fam, p.signature):
                owner = p.signature.family
                other = (owner != family and owner in families.names()
                         and families.serves(families.get(owner), p.signature))
                out.append(Served(p, OTHER if other else "unserved", "-"))
                continue
            sig = p.signature.with_dt(concrete) if concrete and p.signature.dt == "half" else p.signature
            res = selector.peek(family, sig, p.m)
            out.append(Served(p, res.tier, res.config.id))
        return out
    finally:
        selector.configure()


OTHER = "other"  # a point another family serves: this plan (one family's) does not resolve it


@dataclass
class TuneResult:
    census: ShapeSet
    served: list[Served] = field(default_factory=list)  # without a GPU: the plan
    build: BuildResult | None = None
    evaluation: Evaluation | None = None
    measured: bool = False


def tune(workload: str, opts: BuildOptions, *, census_kw: dict[str, Any] | None = None,
         shapes: ShapeSet | None = None, reporter: Reporter | None = None,
         worker: Any = None) -> TuneResult:
    """`tunedb tune`: census -> build into `opts.out` (the user tier) -> evaluate -> report.
    Without a GPU (and without --simulate) nothing is measured: the result is the plan the
    system tier and the cost model would serve on `opts.arch_family` (sm90 by default). On a GPU
    the measuring worker starts first, while the census is taken (or the caller's prestarted
    `worker` is used, which tune then owns and closes)."""
    if worker is None:
        worker = buildsteps.start_worker(opts, gpu=has_gpu())
    try:
        shapes = shapes if shapes is not None else take_census(workload, **(census_kw or {}))
        result = TuneResult(shapes)
        if not (opts.simulate or has_gpu()) or opts.dry_run:
            result.served = plan_served(shapes, opts.arch_family or "sm90", opts.family)
            if not opts.dry_run:
                return result
        result.build = build([(workload, shapes)], opts, reporter=reporter, worker=worker)
        timeline.mark("build end")
    finally:
        speculative.stop(opts.family)
        if worker is not None:
            worker.close()
    if opts.dry_run:
        return result
    result.measured = True
    if result.build.path is not None and result.build.log_path is not None:
        result.evaluation, _ = evaluate_logs([result.build.log_path], [("tuned", result.build.path)],
                                             [shapes], arch_family=None, family=opts.family)
        timeline.mark("evaluation end")
    return result
