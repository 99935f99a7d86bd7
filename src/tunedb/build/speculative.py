"""Work started before the census ends: a preset's mirror census, planned, fills the compile
pool and is measured.

On a cold cache `tunedb tune PRESET` spends seconds importing the model library and tracing the
model (11.6 s of a cold `tunedb tune whisper-base` on the H200), while its compile pool and
measuring worker, started beside it, idle until the plan exists. A preset's `mirror`
implementation is tunedb's own copy of the model with the library model's keys, and its census
needs no model library: taken first, planned as the build will plan (same options, this GPU's
arch profile), its compiles are submitted at once, and its points are measured in a thread on
the prestarted worker while the census asked for is taken (the census runs on the CPU, on meta tensors; the
protocol times on the GPU with CUDA graphs and events).

With no profile cached (a first run), the plan is made first on the GPU's queried limits and
its arch family's shipped ceilings, so that no compile waits for the worker's start and the
profile's micro-benchmarks; the profile is then measured (as the build would measure it after
the census), the census planned again on it and the pool retargeted to that plan, which the
pass measures.

The census the build measures is still the one asked for. Its plan retargets the pool
(compile_pool.CompilePool.retarget: queued jobs it does not need are cancelled, the rest kept,
missing ones added), and its measurer takes a request measured ahead only when the request is
equal whole (records.MeasureRequest: signature, M, arms, the protocol's keywords, the family's
implementation hash): the same measurement, logged then under the build's run. Requests the
build does not make are discarded, never logged nor written; the ones it makes that were not
measured ahead it measures itself, before its loop and again in the order their compiles finish
(fill_after, through build/compile_order.py); the loop then takes every point in plan order and logs it. So the file is the one
a build of that census writes from those measurements. Nothing is speculated when the census is a cache hit (it is fast then), for
a census that is already the mirror's, for a user's module:callable, or where no pool was
prestarted; a pass that fails is dropped whole and the build measures everything itself.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tunedb import settings
from tunedb.build import compile_pool, timeline
from tunedb.build.compile_order import Measured, _Stopped, fill  # noqa: F401 - Measured re-exported
from tunedb.records import Measurement, Signature, Status


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
    try:
        pool = compile_pool.CompilePool(lambda sig, ids: make(arch_family, sig, ids), work, processes,
                                        executor=executor, own=True, done=compile_pool.done_log(family))
    except Exception:
        compile_pool._PRESTARTED[name] = (executor, processes)  # the build's own pool takes it
        raise
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
    timeline.mark("mirror start")
    try:
        # on meta whatever --device the census takes: the mirror only plans the compiles ahead
        kw = {k: v for k, v in census_kw.items() if k not in ("capture", "cached", "device")}
        shapes = pipeline.take_census(workload, **{**kw, "impl": "mirror"})
        timeline.mark("mirror census")
        fields = arch.queried()
        measured = arch.cache_path(fields["sku"]).exists()
        if not measured and fields["arch_family"] not in arch.SHIPPED_ARCHES:
            if worker is not None:  # no shipped ceilings to plan with first: measured now, as the build would
                worker.wait_started()
            measured = True
        # this GPU's profile when cached; else, first, its queried limits with the shipped
        # ceilings (no measurement, no wait), so that the compiles start now: the plan rarely
        # differs with the measured ceilings, and the pool is retargeted below when it does
        first = arch.current_profile(measure=measured)
        if opts.arch_family and first.arch_family != opts.arch_family:
            return None
        try:
            target = buildsteps.target_file(opts.out, first.arch_family, opts.family)
        except Exception:  # noqa: BLE001 - the build reports a bad target itself
            return None
        existing = buildsteps.existing_file(target, opts.family, first.arch_family)
        params = buildsteps.model_params(existing.model if existing else None)
        plans, _ = run.plan_build([(workload, shapes)], opts, first, params)
        timeline.mark("mirror plan")
    except Exception:  # noqa: BLE001 - a prefetch only: the build plans and compiles regardless
        return None
    try:
        pool = start_ahead(family, first.arch_family, plans)
    except Exception:  # noqa: BLE001 - as above: the build submits its own compiles
        return None
    def replan(profile: Any) -> Sequence[Any]:
        """The plan on the measured profile, the pool retargeted to it."""
        if profile.arch_family != first.arch_family:
            raise RuntimeError(f"the GPU is {profile.arch_family}, not {first.arch_family}")
        replanned, _ = run.plan_build([(workload, shapes)], opts, profile, params)
        timeline.mark("mirror plan (measured profile)")
        if pool is not None:
            pool.retarget(compile_pool._work(replanned))
            pool.stats.ahead = pool.stats.jobs
        return replanned

    ahead = worker is not None and settings.measure_ahead_enabled()
    if not measured and ahead:
        # the profile measured in the worker, the plan redone and the pool retargeted in the
        # pass's own thread: this thread goes on to the census at once (settle() waits for it)
        def prelude() -> tuple[Sequence[Any], Any]:
            res = worker.run(ProfileRequest())
            if res.status is not Status.OK:
                raise RuntimeError(f"the arch profile was not measured in the worker: {res.detail}")
            profile = res.value
            arch._MEMO[profile.sku] = profile  # the build's current_profile: the one measured, cached there
            return replan(profile), buildsteps.Measurer(family, opts, profile, None,
                                                        buildsteps.working_sets([(workload, shapes)], family),
                                                        worker=worker)

        try:
            measure_ahead(family.name, first.arch_family, (), None, opts, pool, prelude=prelude)
        except Exception:  # noqa: BLE001 - as above: the build measures the profile and plans itself
            pass
        return pool
    profile = first
    if not measured:
        try:
            # the profile the build uses, measured now (about a second) rather than after the
            # census, with the measuring worker's start over (wait_started) and the pool's
            # processes niced, as the build's setup would measure it; the plan is then the build's
            if worker is not None:
                worker.wait_started()
            profile = arch.current_profile()
            plans = replan(profile)
        except Exception:  # noqa: BLE001 - as above: the build measures the profile and plans itself
            return pool
    if ahead:
        try:
            measurer = buildsteps.Measurer(family, opts, profile, None,
                                           buildsteps.working_sets([(workload, shapes)], family), worker=worker)
            measure_ahead(family.name, profile.arch_family, plans, measurer, opts, pool)
        except Exception:  # noqa: BLE001 - as above: the build measures regardless
            pass
    return pool


@dataclass(frozen=True)
class ProfileRequest:
    """A measuring worker's request: this GPU's arch profile, measured and cached as the build
    would (arch.current_profile), in the process that already holds the GPU's context and is
    idle during the census; its buffers are handed back to the driver afterwards."""

    def __call__(self) -> Any:
        import torch

        from tunedb import arch

        try:
            return arch.current_profile()
        finally:
            torch.cuda.empty_cache()


class AheadRun:
    """A thread measuring a speculative plan (fill, then each signature's cross-evaluation
    through build_signature), keeping every request and its result. It waits for compiles in
    short steps so that the build's take-over stops it before its next point; the build then
    waits only for the point in flight (measuring stays serial on the GPU)."""

    def __init__(self, plans: Sequence[Any], measurer: Any, opts: Any, compiles: Any = None,
                 prelude: Callable[[], tuple[Sequence[Any], Any]] | None = None) -> None:
        self.plans, self.measurer, self.opts, self.compiles = list(plans), measurer, opts, compiles
        self.prelude = prelude  # run first in the thread: returns (plans, measurer)
        self.rule = self.valid = None
        if measurer is not None:
            self.rule, self.valid = measurer.rule, measurer.valid  # build_signature reads them
        self.ready = threading.Event()  # the prelude is over (or there was none)
        self.measured = Measured()
        self.error = ""  # why the pass failed (it is then dropped whole)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunedb-measure-ahead", daemon=True)

    def start(self) -> "AheadRun":
        self._thread.start()
        return self

    def __call__(self, sig: Signature, m: int, ids: Sequence[str], alpha: float,
                 decides: bool = False) -> tuple[Measurement, ...]:
        """build_signature's measure: a request fill measured is answered from it."""
        request, _ = self.measurer.request(sig, m, ids, alpha, decides)
        if request in self.measured.results:
            return self.measured.results[request]
        if self._stop.is_set():
            raise _Stopped
        out = self.measured.results[request] = self.measurer(sig, m, ids, alpha, decides)
        return out

    def _run(self) -> None:
        from tunedb.build import signature_steps

        started = time.perf_counter()
        try:
            if self.prelude is not None:
                try:
                    plans, measurer = self.prelude()
                    self.plans, self.measurer = list(plans), measurer
                    self.rule, self.valid = measurer.rule, measurer.valid
                finally:
                    self.ready.set()
            self.ready.set()
            timeline.mark("ahead pass start")
            fill(self.plans, self.measurer, self.compiles, self.measured, self._stop, keep_transient=False)
            for plan in self.plans:  # the cross-evaluations (their configs are compiled by now)
                signature_steps.build_signature(plan, self, self.opts, rule=self.rule)
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by take_over; the build measures instead
            self.error = f"{type(exc).__name__}: {exc}"
        self.ready.set()
        self.measured.seconds = time.perf_counter() - started

    def stop(self) -> Measured | None:
        """End the pass (the point in flight finishes) and return what it measured, or None
        when it failed."""
        self._stop.set()
        self._thread.join()
        if self.error:
            return None
        self.measured._pass = set(self.measured.results)
        self.measured.points = len(self.measured._pass)
        return self.measured


# A pass measuring ahead, per family: (arch family, run)
_RUNNING: dict[str, tuple[str, AheadRun]] = {}


def measure_ahead(family_name: str, arch_family: str, plans: Sequence[Any], measurer: Any, opts: Any,
                  compiles: Any = None, prelude: Callable[[], tuple[Sequence[Any], Any]] | None = None) -> AheadRun:
    """Start measuring `plans` with `measurer` (no log: a request reaches the build's log only
    when the build makes it) after `compiles` (a CompilePool, or None: nothing to wait for).
    `prelude`, run first in the pass's thread, returns the (plans, measurer) to use instead."""
    # imported here, not in the thread beside the census's imports
    from tunedb.measure import isolated, protocol  # noqa: F401

    stop(family_name)
    run = AheadRun(plans, measurer, opts, compiles, prelude).start()
    _RUNNING[family_name] = (arch_family, run)
    return run


def take_over(family_name: str, arch_family: str, measure: Any) -> Measured | None:
    """The build's measurer takes what the family's pass measured ahead: the pass stops first.
    None when there was none, it failed, or it measured elsewhere (another arch family, another
    worker or timer than the build's)."""
    held = _RUNNING.get(family_name)
    if held is None:
        return None
    arch, run = held
    measured = run.stop()  # an interrupt here leaves the pass registered: stop() joins it again
    _RUNNING.pop(family_name, None)
    if measured is None:
        return None
    same = (arch == arch_family and run.measurer.worker is measure.worker
            and run.measurer.timer is measure.timer)
    return measured if same else None


def settle(family_name: str) -> None:
    """Wait until the family's pass has its plan and measurer (its prelude, when it has one, is
    over: the arch profile measured in the worker is cached), so that the build after the
    census neither measures the profile again nor shares the worker with that measurement."""
    held = _RUNNING.get(family_name)
    if held is not None:
        held[1].ready.wait()


def stop(family_name: str) -> None:
    """End a pass no build took over (the build stopped before measuring, or no GPU after all)."""
    held = _RUNNING.get(family_name)
    if held is not None:
        held[1].stop()  # joined before it is forgotten, so the worker is never closed under it
        _RUNNING.pop(family_name, None)


def fill_after(plans: Sequence[Any], measure: Any) -> None:
    """The build's side, after take_over: its own plan's points not measured ahead, measured now
    in compile order (fill) with no log, for its loop to take in plan order (then logged) --
    so that points compiled early are not held behind a late compile either."""
    import copy

    if measure.ahead is None:
        return
    quiet = copy.copy(measure)  # the same worker or timer, and the build's phases dict
    quiet.log, quiet.ahead, quiet.compiles = None, None, None
    before = measure.phases.get("compile wait", 0.0)
    measure.ahead.filled += fill(plans, quiet, measure.compiles, measure.ahead)
    stats = getattr(measure.compiles, "stats", None)
    if stats is not None:  # the pool's report counts this wait as the measuring side's, as it is
        stats.wait_seconds += measure.phases.get("compile wait", 0.0) - before


def describe(report: Mapping[str, Any]) -> str:
    """The tune report's line for a pass measured ahead."""
    return (f"measured ahead during the census: {report['points']} point(s) in {report['seconds']:.1f} s; "
            f"{report['reused']} reused by the build, {report['discarded']} not in its plan (discarded); "
            f"{report.get('filled', 0)} measured after it in compile order"
            f"{f'; {n} dropped (timeout or launch error: measured again)' if (n := report.get('dropped')) else ''}")
