"""e2e's tune: tunedb's build of a model's census points into a user tier (or autotune() when the
build would not fit its share of the budget), then tunedb.confirm per batch -- timed as a whole,
as a user pays for it (the plan and the worker's start included).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from e2e_timing import sync
from tunedb.measure.gpuenv import wait_reaped


def tune_options(args, out_dir: str, isolate: bool = True):
    """The build's options for e2e's tune (the worker it prestarts is started with them too)."""
    from tunedb import pipeline

    return pipeline.BuildOptions(out=out_dir, thin=True, max_points=args.max_points, top_k=args.top_k,
                                 allow_busy=args.allow_busy, fill=getattr(args, "fill", False), isolate=isolate)


def tune_plan(name: str, shapes, args, out_dir: str, opts=None):
    """(pipeline.BuildOptions, estimated build seconds from the build's own dry run)."""
    from tunedb import pipeline

    opts = opts if opts is not None else tune_options(args, out_dir)
    plan = pipeline.build([(name, shapes)], dataclasses.replace(opts, dry_run=True))
    return opts, sum(p.est_seconds for p in plan.plans)


def arch_profile_cached() -> bool:
    """Whether this GPU's arch profile is already in tunedb's cache (a tune's plan then reads it
    instead of measuring it)."""
    from tunedb import arch

    return arch.cache_path(arch.queried()["sku"]).exists()


def tune_model(bm, tuned, shapes, args, out_dir: str, share_s: float) -> dict:
    """Tune `bm`'s points into the user tier at out_dir; returns what was done and its wall time
    (`arch_measured`: whether its plan had to measure the GPU's arch profile)."""
    from tunedb.build import steps as buildsteps
    measures_arch = not arch_profile_cached()
    t0 = time.perf_counter()  # the plan counts too: tunedb's cost is everything it does to tune
    # as `tunedb tune` does: the measuring worker starts first, while the plan is made
    opts = tune_options(args, out_dir)
    worker = None if args.tune == "autotune" else buildsteps.start_worker(opts, gpu=True)
    try:
        return {**_tune(bm, tuned, shapes, args, out_dir, share_s, t0, worker, opts), "arch_measured": measures_arch}
    finally:
        if worker is not None:
            worker.close()  # the build closed it already; a plan error or autotune never used it
        # the build's worker exits in the background (confirm waits for it before it measures):
        # gone before the tuned rows are timed, whatever happened
        wait_reaped()


def tune_in_process(bm, tuned, shapes, args, out_dir: str, measure_arch: bool) -> dict:
    """The same build measured in this process (`--in-process`: no worker, so no start and no
    probes; what Inductor, Triton's autotuner and tunedb.autotune() do), timed the same way into
    its own user tier, which nothing serves. It runs after tune_model: when that tune's plan
    measured the GPU's arch profile (`measure_arch`, its `arch_measured`), the measurement is
    repeated here, timed and thrown away (arch.measure_profile touches no cache), so this tune
    pays what the first one paid and the profile later models plan with is unchanged."""
    from tunedb import arch

    t0 = time.perf_counter()
    if measure_arch:
        arch.measure_profile()
    opts = tune_options(args, out_dir, isolate=False)
    build = argparse.Namespace(**{**vars(args), "tune": "build"})  # whatever its estimate
    return {**_tune(bm, tuned, shapes, build, out_dir, float("inf"), t0, None, opts), "arch_measured": measure_arch}


def _tune(bm, tuned, shapes, args, out_dir: str, share_s: float, t0: float, worker, opts) -> dict:
    import tunedb
    from tunedb import pipeline, settings
    from tunedb.errors import BusyGPUError

    opts, est = tune_plan(bm.name, shapes, args, out_dir, opts)
    plan_s = time.perf_counter() - t0
    how = args.tune if args.tune != "auto" else ("build" if est <= share_s else "autotune")
    info = {"method": how, "build_estimate_s": round(est, 1), "share_s": round(share_s, 1), "plan_s": round(plan_s, 2),
            "points": len(shapes.points), "signatures": len(shapes.signatures())}
    with settings.override(USER_DB=out_dir):
        if how == "build":
            try:
                res = pipeline.build([(bm.name, shapes)], opts, worker=worker)
                info.update(arms=res.arms_measured, db=str(res.path), log=str(res.log_path), build_s=round(res.seconds, 2),
                            phase_seconds={k: round(v, 2) for k, v in res.phase_seconds.items()})
            except BusyGPUError as exc:
                info.update(method="autotune", note=f"build refused: {exc}")
                how = "autotune"
        if how == "autotune":
            import torch

            if worker is not None:
                worker.close()  # autotune() measures in this process

            done = info["batches_tuned"] = []
            weights = sum(p.numel() * p.element_size() for p in bm.module.parameters())
            with torch.no_grad(), tunedb.autotune(cache=str(Path(out_dir) / f"autotune-{bm.name}.json"),
                                                  publish=True, working_set_bytes=weights):
                for b in bm.batches:
                    if done and time.perf_counter() - t0 > share_s:
                        break  # the batches left keep the system tier / cost model: listed as untuned
                    bm.call(tuned, b)()
                    done.append(b)
            sync()
        if not getattr(args, "no_confirm", False):
            # tunedb.confirm: each Triton pick judged inside the model's captured forward (part of
            # the tune, so timed with it); a pick slower there than torch is demoted at its M
            tunedb.reload()
            t1, verdicts = time.perf_counter(), []
            for b in bm.batches:
                try:
                    verdicts += [v.line() for v in tunedb.confirm(bm.runner(tuned), bm.inputs[b]).verdicts]
                except Exception as exc:  # noqa: BLE001 - the tune stands; its check is reported failed
                    verdicts.append(f"b{b}: confirm failed: {type(exc).__name__}: {exc}")
            info["confirm"] = {"seconds": round(time.perf_counter() - t1, 2), "verdicts": verdicts}
    info["seconds"] = round(time.perf_counter() - t0, 2)
    return info
