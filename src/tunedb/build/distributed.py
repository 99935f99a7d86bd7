"""A build across GPUs and hosts on Ray (`tunedb build --workers N` / `--ray ADDRESS`).

One measuring actor per GPU (`num_gpus=1`); each measures with its own Measurer, i.e. the
measurement protocol in its own worker subprocess on its GPU as a one-GPU build does. The
driver runs each signature's steps as point tasks (build/point_tasks.py: a point's arms, then
its cross-evaluation, on any GPU since each call pairs with its own fallback) handed out through build/scheduler.py; when a signature's
last task is in, the driver decides its regions, appends its measurements to the one log and
checkpoints it, so the run directory and the log look as a serial build's would, and the final
write is the serial build's. A killed actor (or a dead host) loses the point it held, which goes
to another actor (without pairing, `tunedb tune`, also the arms it timed at points whose
cross-evaluation had not run yet: each such point is measured again whole elsewhere, so that a
point's comparisons stay on one GPU); a killed driver resumes from the checkpoints (finished signatures) with the same --run-id. All GPUs must
be one arch family and SKU.

Ray is imported only here, and only when one of those flags is given.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tunedb import families
from tunedb.build import checkpoint, point_tasks, remote_compile
from tunedb.build import scheduler as sched_mod
from tunedb.errors import BuildError

Identity = tuple[str, str]  # (arch family, SKU)


def wanted(opts: Any) -> bool:
    return bool(getattr(opts, "workers", 0)) or bool(getattr(opts, "ray", None))


def check_options(opts: Any) -> None:
    workers = getattr(opts, "workers", 0) or 0
    if workers < 0:
        raise BuildError(f"--workers={workers} must be >= 1 (one measuring actor per GPU)")
    if getattr(opts, "simulate_delay_ms", 0.0) and not (opts.simulate and wanted(opts)):
        raise BuildError("--simulate-delay needs --simulate and --workers/--ray (it stands in for the "
                         "GPU time of each simulated arm on the actors)")
    if getattr(opts, "simulate_delay_ms", 0.0) < 0:
        raise BuildError(f"--simulate-delay={opts.simulate_delay_ms} must be >= 0 (ms per arm)")
    if wanted(opts) and not opts.isolate:
        raise BuildError("--in-process measures in the build's own process; it cannot be combined "
                         "with --workers/--ray, whose actors each run a worker process")


def check_same_gpus(identities: Mapping[Any, Identity]) -> Identity:
    """The one (arch family, SKU) of every worker; a mix is refused, naming both, since one
    database file holds one arch family's measurements and regions judged on one SKU."""
    seen: dict[Identity, Any] = {}
    for worker, ident in identities.items():
        seen.setdefault(tuple(ident), worker)
    if len(seen) > 1:
        (a, wa), (b, wb) = list(seen.items())[:2]
        raise BuildError(f"the build's GPUs differ: worker {wa} has {a[1]} ({a[0]}), worker {wb} has "
                         f"{b[1]} ({b[0]}); a build measures one arch family and SKU: give it a "
                         f"cluster (or CUDA_VISIBLE_DEVICES) of one GPU type")
    if not seen:
        raise BuildError("no measuring worker started")
    return next(iter(seen))


def _local_identity(opts: Any, arch: Any, gpu: bool) -> Identity:
    if not gpu:
        return (arch.arch_family, "simulated")
    from tunedb import arch as arch_mod

    prof = arch_mod.current_profile()
    return (prof.arch_family, prof.sku)


class MeasuringActor:
    """The body of one Ray actor (wrapped by ray.remote in `start`): one GPU's measurer."""

    def __init__(self, index: int, opts: Any, arch: Any, working_sets: Mapping[Any, int], timer: Any,
                 gpu: bool, identify: Callable[[int], Identity] | None = None) -> None:
        self.index, self.opts, self.arch, self.working_sets = index, opts, arch, working_sets
        self.timer, self.gpu, self.identify = timer, gpu, identify
        self.measurer: Any = None
        self.installed: dict[Any, int] = {}  # signature -> compiled files installed (remote_compile)
        self.install_s = 0.0

    def identity(self) -> tuple[Identity, int]:
        """This GPU's (arch family, SKU) and the actor's pid; the measuring worker process starts
        now, so its imports and CUDA start overlap the other actors' (as a one-GPU build
        prestarts its worker while it plans)."""
        ident = self.identify(self.index) if self.identify else _local_identity(self.opts, self.arch, self.gpu)
        m = self._measurer()
        if m.worker is not None:
            from tunedb.measure.isolated import StartRequest

            m.worker.prestart(StartRequest(self.opts.family))
        return tuple(ident), os.getpid()

    def _measurer(self) -> Any:
        if self.measurer is None:
            from tunedb import families
            from tunedb.build import steps as buildsteps

            self.measurer = buildsteps.Measurer(families.get(self.opts.family), self.opts, self.arch,
                                                None, self.working_sets, self.timer)
        return self.measurer

    def measure(self, req: Any, compiled: list[Any] | None = None) -> tuple[list[Any], float]:
        """One point task (a point_tasks.Request): every measurement taken, and seconds.
        compiled: [the ObjectRef of its signature's remote compile] (build/remote_compile.py),
        installed into this host's cache before the signature's first point here."""
        if compiled and req.signature not in self.installed:
            self._install(req.signature, compiled[0])
        t0 = time.perf_counter()
        out = list(self._measurer()(req.signature, req.m, req.ids, req.alpha, decides=req.decides))
        delay = float(getattr(self.opts, "simulate_delay_ms", 0.0) or 0.0) / 1e3
        if delay:  # --simulate-delay: stand in for the GPU time of each measured arm
            time.sleep(delay * len(out))
        return out, time.perf_counter() - t0

    def _install(self, sig: Any, ref: Any) -> None:
        import ray

        from tunedb import families
        from tunedb.build import remote_compile
        from tunedb.families.contract import hook

        t0 = time.perf_counter()
        try:
            got = ray.get(ref)
            cache = hook(families.get(self.opts.family), "compiler_cache")()
            self.installed[sig] = remote_compile.install(got["files"], cache) if cache else 0
        except Exception:  # no binaries: the worker compiles in line, as without the fan-out
            self.installed[sig] = 0
        self.install_s += time.perf_counter() - t0

    def compile_report(self) -> dict[str, Any]:
        return {"signatures": len(self.installed), "files": sum(self.installed.values()),
                "install_s": round(self.install_s, 3)}

    def close(self) -> bool:
        if self.measurer is not None:
            self.measurer.close()
        return True


def connect(opts: Any, gpu: bool) -> tuple[int, bool]:
    """Join or start the Ray cluster: the number of measuring actors to start, and whether this
    call initialised Ray (the build then shuts it down; a caller's own session is left alone)."""
    try:
        import ray
    except ImportError:
        raise BuildError("--workers/--ray need Ray: pip install 'tunedb[ray]' (or pip install ray)") from None
    workers = getattr(opts, "workers", 0) or 0
    started = not ray.is_initialized()
    if started:
        if opts.ray:
            ray.init(address=opts.ray, log_to_driver=False)
        else:
            # a simulated build has no GPU: the local cluster gets logical ones, one per actor
            ray.init(num_gpus=None if gpu else workers, log_to_driver=False, include_dashboard=False)
    have = int(ray.cluster_resources().get("GPU", 0))
    workers = workers or have
    if workers < 1 or have < workers:
        if started:
            ray.shutdown()
        raise BuildError(f"--workers {workers or '(all)'}: the Ray cluster has {have} GPU(s); "
                         f"a build starts one measuring actor per GPU")
    return workers, started


class RayBackend:
    """scheduler.Backend over Ray actors: submit a point task, wait for any to end."""

    def __init__(self, actors: Mapping[int, Any], tasks: point_tasks.PointTasks,
                 compiled: Mapping[Any, Any] | None = None) -> None:
        self.actors, self.tasks, self.compiled = dict(actors), tasks, dict(compiled or {})
        self.pending: dict[Any, tuple[int, Any]] = {}  # ObjectRef -> (worker, task)

    def submit(self, worker: int, task: Any) -> None:
        ref = self.compiled.get(task.signature)
        ref = self.actors[worker].measure.remote(self.tasks.request(task, worker), [ref] if ref is not None else None)
        self.pending[ref] = (worker, task)

    def wait(self) -> list[sched_mod.Outcome]:
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

        done, rest = ray.wait(list(self.pending), num_returns=1)
        if rest:  # ray.wait gives exactly num_returns: take every other one already in too
            done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in done:
            worker, task = self.pending.pop(ref)
            try:
                out.append(sched_mod.Outcome(worker, task, ray.get(ref)))
            except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                ray.kill(self.actors.pop(worker), no_restart=True)
                out.append(sched_mod.Outcome(worker, task, lost=True, detail=str(exc).splitlines()[0][:200]))
            except RayTaskError as exc:  # the point itself failed (its actor lives): say why
                cause = exc.cause if exc.cause is not None else exc
                raise BuildError(f"{task} failed on GPU worker {worker}: {type(cause).__name__}: {cause}") from None
        return out


@dataclass
class Distributed:
    """What the driver got back: entries per signature, arms, and each worker's accounting."""

    entries: dict[Any, Any]
    arms: int
    workers: dict[str, dict[str, Any]]
    lost: list[str]
    phases: dict[str, float]  # 'ray start' (cluster + actors), 'actors' (first hand-out to last result)


def measure_all(plans: Sequence[Any], opts: Any, arch: Any, working_sets: Mapping[Any, int], timer: Any,
                log: Any, run: Any, reporter: Any, gpu: bool,
                identify: Callable[[int], Identity] | None = None) -> Distributed:
    """Measure `plans` (the signatures not yet finished) on one actor per GPU, checkpointing
    each signature into `run` and appending its measurements to `log` as it finishes."""
    import ray

    t0 = time.perf_counter()
    n, started = connect(opts, gpu)
    remote = ray.remote(num_gpus=1, num_cpus=0, max_restarts=0)(MeasuringActor)
    ws = dict(working_sets)
    actors = {i: remote.remote(i, opts, arch, ws, timer, gpu, identify) for i in range(n)}
    try:
        answers = ray.get([a.identity.remote() for a in actors.values()])
        ident = {i: a[0] for i, a in zip(actors, answers)}
        # the driver planned on its own GPU's profile: the actors' GPUs must be that one too
        check_same_gpus({"driver": (arch.arch_family, arch.sku), **ident} if gpu else ident)
        pids = {i: a[1] for i, a in zip(actors, answers)}
        family = families.get(opts.family)

        def valid(sig: Any, m: int, cid: str) -> bool:
            return family.invalid_reason(family.parse_config(cid), sig, m, arch) is None
        tasks = point_tasks.PointTasks(plans, opts, valid)
        sched = sched_mod.Scheduler.of(tasks.tasks(), group=lambda t: t.signature)
        for i in actors:
            sched.add_worker(i)
        entries: dict[Any, Any] = {}
        arms = [0]
        lost: list[str] = []
        index = {p.signature: k for k, p in enumerate(plans, 1)}
        started_sigs: set[Any] = set()
        busy: dict[Any, float] = {}  # signature -> seconds its points took on the GPUs

        def on_result(worker: int, task: Any, value: Any) -> None:
            got, secs = value
            arms[0] += len(got)
            busy[task.signature] = busy.get(task.signature, 0.0) + secs
            reporter.advance(len(got))
            ready, entry, meas = tasks.done(task, worker, got)
            for t, cost, pin in ready:
                sched.add(t, cost, front=True, pin=pin)
            if entry is not None:
                log.append(meas)
                run.save(checkpoint.Finished(entry, _config_ids(entry), len(meas), round(busy[task.signature], 3)))
                entries[task.signature] = entry

        def on_lost(out: sched_mod.Outcome) -> None:
            lost.append(f"worker {out.worker} (pid {pids.get(out.worker)}) died holding {out.task}; re-queued")

        compiled = (remote_compile.submit(plans, opts.family, arch.arch_family)
                    if remote_compile.wanted(opts, family, gpu) else {})
        backend = RayBackend(actors, tasks, compiled)
        submit = backend.submit

        def submit_and_report(worker: int, task: Any) -> None:
            if task.signature not in started_sigs:
                started_sigs.add(task.signature)
                reporter.signature(by_sig[task.signature], index[task.signature], len(plans))
            submit(worker, task)
        backend.submit = submit_and_report  # type: ignore[method-assign]
        by_sig = {p.signature: p for p in plans}
        t1 = time.perf_counter()
        sched_mod.drive(sched, backend, on_result, on_lost)
        phases = {"ray start": t1 - t0, "actors": time.perf_counter() - t1}
        fractions = sched.busy_fractions()
        stats = {str(w): {"pid": pids.get(w), "points": s.tasks, "busy_s": round(s.busy_s, 3),
                          "busy_fraction": round(fractions[w], 4), "dead": s.dead}
                 for w, s in sched.workers.items()}
        if compiled:  # what each live actor installed from the cluster's compile tasks
            live = {w: a for w, a in backend.actors.items() if not sched.workers[w].dead}
            reports = ray.get([a.compile_report.remote() for a in live.values()])
            for w, rep in zip(live, reports):
                stats[str(w)]["remote_compile"] = rep
        return Distributed(entries, arms[0], stats, lost, phases)
    finally:
        # a clean close lets each measurer's worker process exit; then the actors go
        closing = [a.close.remote() for a in actors.values()]
        ray.wait(closing, num_returns=len(closing), timeout=10)
        for a in actors.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead: nothing to stop
                pass
        if started:
            ray.shutdown()


def _config_ids(entry: Any) -> tuple[str, ...]:
    from tunedb.build import steps as buildsteps

    return buildsteps.entry_config_ids(entry)
