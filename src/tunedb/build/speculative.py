"""Compiles started before the census ends: a preset's mirror census, planned, fills the pool.

On a cold cache `tunedb tune PRESET` spends seconds importing the model library and tracing the
model (11.6 s of a cold `tunedb tune whisper-base` on the H200), while its compile pool, started
beside it, idles until the plan exists; the measuring side then waited 10.3 s for the 27
compiles. A preset's `mirror` implementation is tunedb's own copy of the model with the library
model's keys, and its census needs no model library: taken first, planned as the build will plan
(same options, this GPU's arch profile, measured now if it is not cached, as the build would
after the census), its compiles are submitted at once. The census the build measures is still the one
asked for; the build's own plan then retargets the pool (compile_pool.CompilePool.retarget):
queued jobs it does not need are cancelled, the rest kept, missing ones added. So the plan, the
points and the arms are the build's own; only compiles, which are never timed, start earlier.
Nothing is speculated when the census is a cache hit (it is fast then), for a census that is
already the mirror's, for a user's module:callable, or where no pool was prestarted.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from tunedb.build import compile_pool


def wanted(workload: str, census_kw: Mapping[str, Any]) -> bool:
    """Whether a mirror census would start compiles earlier than the census asked for: a preset
    whose census is not cached and not itself the mirror's."""
    from tunedb.census import cache

    kw = {k: census_kw.get(k) for k in ("mode", "max_batch", "chunk", "manifest", "impl", "fused")}
    if kw["impl"] == "mirror" or cache.key(workload, **kw) is None:
        return False
    return not (census_kw.get("cached") and cache.hit(workload, **kw))


def start_ahead(family: Any, arch_family: str, plans: Sequence[Any]) -> compile_pool.CompilePool | None:
    """Submit the compiles of `plans` to the family's prestarted processes now; the build's
    for_build takes the pool over and retargets it to its own plan. None when no processes
    were prestarted or there is nothing to compile."""
    from tunedb.families.contract import has_hook, hook

    name = getattr(family, "name", "")
    work = compile_pool._work(plans)
    if name in compile_pool._AHEAD or name not in compile_pool._PRESTARTED or not work \
            or not has_hook(family, "compile_jobs"):
        return None
    executor, processes = compile_pool._PRESTARTED.pop(name)
    make = hook(family, "compile_jobs")
    pool = compile_pool.CompilePool(lambda sig, ids: make(arch_family, sig, ids), work, processes,
                                    executor=executor, own=True, done=compile_pool.done_log(family))
    pool.stats.ahead = pool.stats.jobs
    compile_pool._AHEAD[name] = (arch_family, pool)
    return pool


def start(workload: str, opts: Any, census_kw: Mapping[str, Any],
          worker: Any = None) -> compile_pool.CompilePool | None:
    """Take the mirror census of `workload`, plan it as `opts` will and start its compiles (see
    the module docstring). `worker`: the prestarted measuring worker, whose start must be over
    before this GPU's profile is measured here. Best effort: anything that fails leaves the
    build as it was."""
    from tunedb import arch, families, pipeline
    from tunedb.build import run
    from tunedb.build import steps as buildsteps

    family = families.get(opts.family)
    if family.name not in compile_pool._PRESTARTED or not wanted(workload, census_kw):
        return None
    try:
        kw = {k: v for k, v in census_kw.items() if k not in ("capture", "cached")}
        shapes = pipeline.take_census(workload, **{**kw, "impl": "mirror"})
        # the profile the build uses: cached per SKU, else measured now (about a second) rather
        # than after the census, on a GPU as idle as then (the pool has no work yet), so that
        # this plan is the build's; with the shipped ceilings instead, it could rank otherwise
        if worker is not None and not arch.cache_path(arch.queried()["sku"]).exists():
            worker.wait_started()  # quiet as the build's setup had it: no start beside the timing
        profile = arch.current_profile()
        if opts.arch_family and profile.arch_family != opts.arch_family:
            return None
        try:
            target = buildsteps.target_file(opts.out, profile.arch_family, opts.family)
        except Exception:  # noqa: BLE001 - the build reports a bad target itself
            return None
        existing = buildsteps.existing_file(target, opts.family, profile.arch_family)
        plans, _ = run.plan_build([(workload, shapes)], opts, profile,
                                  buildsteps.model_params(existing.model if existing else None))
    except Exception:  # noqa: BLE001 - a prefetch only: the build plans and compiles regardless
        return None
    return start_ahead(family, profile.arch_family, plans)
