"""Compiling ahead of measurement: a pool of processes fills the compiler cache the measuring worker reads.

A family that compiles kernels just in time (GEMM's Triton configs) pays every compile inside its
first probe, one after another, while the GPU idles. With a `compile_jobs(arch_family, sig,
config_ids)` hook the family instead hands the build picklable jobs (each with a `run()` that
compiles one binary into the family's persistent cache, under the same key a launch on that
target computes); the build submits every planned job in measuring order to a process pool and,
before each point, waits only for that point's jobs. Measuring stays serial on the GPU; the pool
compiles the next points' binaries meanwhile. Compiles are never timed: the measurement of a
point starts after its wait. A family without the hook gets no pool (it compiles as before).

The pool is sized to the free machine (build/compile_pool_size.py: free cores less one for the
measuring worker, and MemAvailable over a per-compile memory budget; TUNEDB_COMPILE_JOBS
overrides, 0 turning the pool off).
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Sequence

from tunedb.build import timeline
from tunedb.build.compile_done import DoneLog, done_log  # noqa: F401 - re-exported
from tunedb.build.compile_pool_size import (  # noqa: F401 - re-exported
    MEMINFO, PoolSize, affinity_cores, mem_available, pool_size)
from tunedb.measure.spawn_main import importable_main
from tunedb.records import Signature

def run_job(job: Any) -> dict:
    """In a pool process: one job's compile (its own run() reports failure in the dict)."""
    start = time.perf_counter()
    try:
        out = dict(job.run())
    except Exception as exc:  # a job that raises is reported as failed, like one that says so
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    out.setdefault("seconds", time.perf_counter() - start)
    return out


def _noop() -> int:
    return os.getpid()


@dataclass
class CompileStats:
    jobs: int = 0  # distinct jobs submitted
    ok: int = 0
    failed: list[str] = field(default_factory=list)  # "job: error" for each failed one
    compile_seconds: float = 0.0  # summed over jobs (CPU work moved off the measuring path)
    skipped: int = 0  # jobs an earlier pool already compiled into this cache (its done log)
    wait_seconds: float = 0.0  # the measuring side blocked on compiles not yet done
    waited_points: int = 0
    ahead: int = 0  # jobs submitted before the census ended, from a speculative plan (build/speculative.py)
    cancelled: int = 0  # of those, queued ones the build's plan did not need (never compiled)
    unused: int = 0  # of those, ones the plan did not need that had already started (compiled anyway)


class CompilePool:
    """Every planned (signature, config ids) compiled in a pool, in the order given (the order
    points are measured). wait(sig, ids) blocks until those configs' jobs have finished (ok or
    not: a failed compile is the measuring worker's compile_error to report, as before)."""

    def __init__(self, make_jobs: Callable[[Signature, Sequence[str]], Iterable[Hashable]],
                 work: Iterable[tuple[Signature, Sequence[str]]], processes: int,
                 executor: cf.Executor | None = None, wait_limit_s: float = 600.0, own: bool | None = None,
                 done: "DoneLog | None" = None) -> None:
        self.stats = CompileStats()
        self.done = done
        self.processes = processes
        self.wait_limit_s = wait_limit_s
        self._own = executor is None if own is None else own
        # spawn: the parent may hold a CUDA context or a real Triton driver; compile workers start clean
        importable_main()
        self._pool = executor or cf.ProcessPoolExecutor(
            max_workers=max(1, processes), mp_context=multiprocessing.get_context("spawn"))
        self._futures: dict[Hashable, cf.Future] = {}
        self._by_key: dict[tuple[Signature, str], list[Hashable]] = {}
        self._make = make_jobs
        self.broken = ""  # why the pool stopped taking work (a process died), else empty
        self.add(work)

    def add(self, work: Iterable[tuple[Signature, Sequence[str]]]) -> None:
        """Submit more (signature, config ids), after what is queued; repeats are skipped."""
        make_jobs = self._make
        for sig, ids in work:
            for cid in ids:
                key = (sig, cid)
                if key in self._by_key:
                    continue
                jobs = list(make_jobs(sig, [cid]))
                self._by_key[key] = jobs
                for job in jobs:
                    if job in self._futures or self.broken:
                        continue
                    if self.done is not None and self.done.has(job):
                        self.stats.skipped += 1
                        continue
                    try:
                        fut = self._pool.submit(run_job, job)
                    except (cf.BrokenExecutor, RuntimeError) as exc:
                        # a pool process died (a compiler crash): the worker compiles the rest itself
                        self.broken = f"{type(exc).__name__}: {exc}"
                        continue
                    timeline.mark("first compile submitted")
                    timeline.mark("last compile submitted", last=True)
                    fut.add_done_callback(self._done_callback(job))
                    self._futures[job] = fut
        self.stats.jobs = len(self._futures)

    def retarget(self, work: Iterable[tuple[Signature, Sequence[str]]]) -> None:
        """Hand a pool filled ahead from a speculative plan the build's own `work`: queued jobs
        the work does not need are cancelled, running ones counted unused, the rest submitted."""
        work = list(work)
        wanted: set[Hashable] = set()
        for sig, ids in work:
            for cid in ids:
                found = self._by_key.get((sig, cid))
                wanted.update(found if found is not None else self._make(sig, [cid]))
        cancelled = set()
        for job, fut in list(self._futures.items()):
            if job in wanted:
                continue
            if fut.cancel():
                del self._futures[job]
                cancelled.add(job)
                self.stats.cancelled += 1
            else:
                self.stats.unused += 1
        if cancelled:  # forgotten, so that a later plan wanting them submits them again
            self._by_key = {k: jobs for k, jobs in self._by_key.items() if cancelled.isdisjoint(jobs)}
        self.add(work)

    def _done_callback(self, job: Hashable) -> Callable[[cf.Future], None]:
        def done(fut: cf.Future) -> None:
            if fut.cancelled():  # retarget() dropped it: neither compiled nor failed
                return
            try:
                res = fut.result()
            except BaseException as exc:  # noqa: BLE001 - a dead pool process fails its job, not the build
                res = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "seconds": 0.0}
            self.stats.compile_seconds += float(res.get("seconds", 0.0))
            timeline.mark("first compile done")
            timeline.mark("last compile done", last=True)
            if res.get("ok"):
                self.stats.ok += 1
                if self.done is not None:
                    self.done.add(job)
            else:
                self.stats.failed.append(f"{job}: {res.get('error', '')}")
        return done

    def pending(self, sig: Signature, ids: Sequence[str]) -> list[cf.Future]:
        """The jobs of `ids` for `sig` not done yet."""
        futs = [self._futures.get(j) for cid in ids for j in self._by_key.get((sig, cid), ())]
        return [f for f in futs if f is not None and not f.done()]

    def wait(self, sig: Signature, ids: Sequence[str]) -> float:
        """Block until the jobs of `ids` for `sig` are done; returns the seconds waited."""
        pending = self.pending(sig, ids)
        if not pending:
            return 0.0
        start = time.perf_counter()
        cf.wait(pending, timeout=self.wait_limit_s)  # past it, the worker compiles what is missing itself
        waited = time.perf_counter() - start
        self.stats.wait_seconds += waited
        self.stats.waited_points += 1
        return waited

    def close(self, wait: bool = False) -> None:
        """Stop: queued jobs are cancelled (a finished build needs none of them); the done log
        keeps what was compiled."""
        if self._own:
            self._pool.shutdown(wait=wait, cancel_futures=True)
        if self.done is not None:
            self.done.save()

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_PRESTARTED: dict[str, tuple[cf.ProcessPoolExecutor, int]] = {}


NICE = 10  # pool processes yield the CPU to the census and the measuring worker's start


def _warm_process(family_name: str) -> None:
    """A pool process's initializer: a lower CPU priority, then the family's compile_warm
    (imports, compiler state). The pool starts before the census, when nothing is known to
    compile; at full priority its 15 imports held back the measuring worker's start by 3.4 s in a
    warm `tunedb tune whisper-base` that compiled nothing (session 10, call C)."""
    from tunedb import families
    from tunedb.families.contract import hook

    try:
        os.nice(NICE)
    except (AttributeError, OSError):  # no nice() here, or not permitted: full priority
        pass
    import atexit

    atexit.register(_exit_now)

    try:
        hook(families.get(family_name), "compile_warm")()
    except Exception:  # noqa: BLE001 - warming is an optimisation; a job reports real failures
        pass


def _exit_now() -> None:
    """A pool process's last step: skip the interpreter's teardown. After compiling, tearing
    down the compiler's state took 0.6-1.1 s per process, which the build's own exit waits for
    (its executor joins them); every compile is in the cache already, written whole."""
    import sys

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)


def _executor(family: Any, processes: int) -> cf.ProcessPoolExecutor:
    # spawn: the parent may hold a CUDA context or a real Triton driver; compile workers start clean
    importable_main()
    return cf.ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_warm_process, initargs=(family.name,))


def prestart(family: Any) -> bool:
    """Start the family's compile processes now (their interpreter start and compile_warm overlap
    the caller's census); the next for_build of this family takes them over. False when the
    family compiles nothing ahead or the pool is off."""
    from tunedb.families.contract import has_hook

    if not has_hook(family, "compile_jobs") or family.name in _PRESTARTED:
        return False
    size = pool_size()
    if size.jobs < 1:
        return False
    ex = _executor(family, size.jobs)
    for _ in range(size.jobs):  # an executor spawns its processes as work arrives
        ex.submit(_noop)
    _PRESTARTED[family.name] = (ex, size.jobs)
    timeline.mark("pool prestart")
    return True


def release(family: Any) -> None:
    """Stop the family's prestarted processes and compiles started ahead, which no build took
    over (no GPU after all, or the build stopped before measuring)."""
    name = getattr(family, "name", "")
    started = _PRESTARTED.pop(name, None)
    if started:
        started[0].shutdown(wait=False, cancel_futures=True)
    ahead = _AHEAD.pop(name, None)
    if ahead:
        ahead[1].close()


# A pool filled ahead from a speculative plan (build/speculative.py), per family: (arch, pool)
_AHEAD: dict[str, tuple[str, CompilePool]] = {}


def for_build(family: Any, arch_family: str, work: Sequence[tuple[Signature, Sequence[str]]],
              size: PoolSize | None = None) -> CompilePool | None:
    """The build's pool (taking over prestarted processes), or None: the family has no
    compile_jobs hook, the pool is off (TUNEDB_COMPILE_JOBS=0) or there is nothing to compile."""
    from tunedb.families.contract import has_hook, hook

    ahead = _AHEAD.pop(getattr(family, "name", ""), None)
    if ahead is not None:
        if ahead[0] == arch_family and work:
            ahead[1].retarget(work)
            return ahead[1]
        ahead[1].close()  # compiled for another target, or nothing to measure
    started = _PRESTARTED.pop(getattr(family, "name", ""), None)
    if not has_hook(family, "compile_jobs") or not work:
        if started:
            started[0].shutdown(wait=False, cancel_futures=True)
        return None
    if started is None:
        size = size or pool_size()
        if size.jobs < 1:
            return None
        started = (_executor(family, size.jobs), size.jobs)
    make = hook(family, "compile_jobs")
    return CompilePool(lambda sig, ids: make(arch_family, sig, ids), work, started[1], executor=started[0], own=True,
                       done=done_log(family))


def for_family(family: Any, arch_family: str) -> CompilePool | None:
    """An empty pool for `family` to add() work to as it comes (autotune, prewarm), or None
    when the family compiles nothing ahead or the pool is off."""
    from tunedb.families.contract import has_hook, hook

    if not has_hook(family, "compile_jobs"):
        return None
    size = pool_size()
    if size.jobs < 1:
        return None
    make = hook(family, "compile_jobs")
    return CompilePool(lambda sig, ids: make(arch_family, sig, ids), (), size.jobs,
                       executor=_LazyExecutor(lambda: _executor(family, size.jobs)), own=True)


class _LazyExecutor:
    """An executor started at its first submit (a pool that is never given work starts no process)."""

    def __init__(self, start: Callable[[], cf.Executor]) -> None:
        self._start, self._ex = start, None

    def submit(self, fn: Any, *args: Any) -> cf.Future:
        if self._ex is None:
            self._ex = self._start()
        return self._ex.submit(fn, *args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=wait, cancel_futures=cancel_futures)


def configured() -> bool:
    """Whether TUNEDB_COMPILE_JOBS names a pool size (a build with a caller's timer runs a pool
    only then; a build on a GPU sizes its own)."""
    from tunedb import settings

    return settings.compile_jobs() is not None


def start_for_build(family: Any, arch_family: str, plans: Sequence[Any], finished: Any = ()) -> CompilePool | None:
    """The pool for a build's plans, in measuring order (signatures, then points by M), leaving
    out signatures resumed from checkpoints."""
    return for_build(family, arch_family, _work(plans, finished))


def _work(plans: Sequence[Any], finished: Any = ()) -> list[tuple[Signature, tuple[str, ...]]]:
    return [(p.signature, tuple(p.arms[pt.m])) for p in plans if p.signature not in finished
            for pt in p.points if pt.m in p.arms]


def report(pool: CompilePool | None) -> dict[str, Any]:
    """What the build result records: jobs, ok, failed, summed compile and waited seconds."""
    if pool is None:
        return {}
    s = pool.stats
    return {"processes": pool.processes, "jobs": s.jobs, "ok": s.ok, "failed": list(s.failed), "skipped": s.skipped,
            "compile_seconds": round(s.compile_seconds, 3), "wait_seconds": round(s.wait_seconds, 3),
            "waited_points": s.waited_points, "ahead": s.ahead, "cancelled": s.cancelled, "unused": s.unused}


def describe(rep: dict[str, Any]) -> str:
    """The report's line: 'compile pool: 15 processes, 58 jobs (58 ok), ...'."""
    failed = len(rep.get("failed") or ())
    return (f"compile pool: {rep['processes']} processes, {rep['jobs']} jobs ({rep['ok']} ok"
            f"{f', {failed} failed (their probes report it)' if failed else ''}"
            f"{_skipped(rep)}{_ahead(rep)}), "
            f"{rep['compile_seconds']:.1f} s of compiling off the measuring path, "
            f"measuring waited {rep['wait_seconds']:.1f} s at {rep['waited_points']} point(s)")


def _skipped(rep: dict[str, Any]) -> str:
    n = rep.get("skipped") or 0
    return f", {n} compiled by an earlier build" if n else ""


def _ahead(rep: dict[str, Any]) -> str:
    n = rep.get("ahead") or 0
    if not n:
        return ""
    dropped = (rep.get("cancelled") or 0) + (rep.get("unused") or 0)
    return f", {n} submitted before the census ended ({dropped} of them not in the build's plan)"
