"""measure_point in a worker subprocess: the requests a measuring worker runs (start-up, a
probe of one config, a whole point) and ``measure_point_isolated``, which drives them so that a
hung or crashing kernel costs one arm (timeout / launch_error), never the build. The protocol
itself is measure/protocol.py, which keeps these names importable.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tunedb.measure import protocol
from tunedb.measure.arms import problem_for
from tunedb.measure.protocol import add_phase, refuse_capture
from tunedb.records import Measurement, Signature, Status


class _Refused:
    """A protocol refusal (busy GPU, capture) carried back from the worker to be raised here."""

    def __init__(self, exc: Exception) -> None:
        self.kind, self.message = type(exc).__name__, str(exc)

    def reraise(self) -> None:
        from tunedb import errors

        raise getattr(errors, self.kind, errors.MeasurementError)(self.message)


@dataclass(frozen=True)
class ProbeRequest:
    """Worker request: compile and launch one config once on random inputs, then synchronise."""

    family: str
    signature: Signature
    m: int
    config_id: str
    seed: int = 0

    def __call__(self) -> None:
        import torch

        from tunedb import families

        problem = problem_for(families.get(self.family), self.signature, self.m, [self.config_id])
        args, kwargs = problem.make_inputs(torch.device("cuda"), self.seed)
        ref = problem.reference(args, kwargs)
        out = problem.make_out(args, kwargs, ref)
        problem.arms[0].make(args, kwargs, out)()
        torch.cuda.synchronize()


@dataclass(frozen=True)
class PointRequest:
    """Worker request: measure_point on the worker's GPU with the default (CUDA-graph) timer."""

    family: str
    signature: Signature
    m: int
    config_ids: tuple[str, ...]
    options: tuple[tuple[str, Any], ...] = ()

    def __call__(self) -> tuple[tuple[Measurement, ...], dict[str, float]] | _Refused:
        from tunedb import families
        from tunedb.errors import MeasurementError

        phases: dict[str, float] = {}
        try:
            return protocol.measure_point(families.get(self.family), self.signature, self.m,
                                 list(self.config_ids), phases=phases, **dict(self.options)), phases
        except MeasurementError as exc:
            return _Refused(exc)


@dataclass(frozen=True)
class StartRequest:
    """Worker request: import torch and the family and initialise CUDA (the worker's start-up,
    timed apart from the measurements). The family's optional warm_start runs meanwhile in a
    thread: what of it waits on disk, hashing or a compiler overlaps torch's import (warm=False:
    torch and CUDA alone, as bench/tune_profile.py compares)."""

    family: str
    warm: bool = True

    def __call__(self) -> None:
        import threading

        from tunedb import families

        family = families.get(self.family)
        warm = getattr(family, "warm_start", None) if self.warm else None
        thread = None
        if callable(warm):
            thread = threading.Thread(target=_best_effort, args=(warm,), daemon=True, name="tunedb-warm-start")
            thread.start()
        import torch

        torch.cuda.init()
        if thread is not None:
            thread.join()


def _best_effort(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 -- a warm-up only: the first real launch reports the cause
        pass


def measure_point_isolated(worker: Any, family: str, sig: Signature, m: int,
                           config_ids: Sequence[str], *, probe_timeout_s: float = 120.0,
                           timeout_s: float | None = None, log: Any = None,
                           phases: dict[str, float] | None = None, **kwargs: Any) -> tuple[Measurement, ...]:
    """measure_point in `worker` (a bench.worker.Worker): each config is first compiled and
    launched alone (a hang or crash costs that arm: timeout / launch_error), then the survivors
    are measured together; should that fail, each is measured alone. `family` is its
    registered name (the worker looks it up). `phases`, when given, accumulates wall seconds:
    worker start (each (re)start: spawn, torch, CUDA; of a prestarted worker, the wait for it),
    probes, the worker's prepare and rounds,
    requests (the rest of each request: pipe, pickling, per-request setup) and failed requests
    (batches that crashed or timed out). Other keywords are measure_problem's."""
    refuse_capture()
    spent = phases if phases is not None else {}

    def add(key: str, seconds: float) -> None:
        add_phase(spent, key, seconds)

    def run(request: Any, timeout: float | None) -> tuple[Any, float]:
        if getattr(worker, "starting", False):  # prestarted: only the wait for it is counted
            t0 = time.perf_counter()
            worker.wait_started()
            add("worker start", time.perf_counter() - t0)
        alive = getattr(worker, "alive", None)
        if callable(alive) and not alive():  # the first request, or one after a crash or a kill
            t0 = time.perf_counter()
            worker.run(StartRequest(family), probe_timeout_s)  # a failure resurfaces just below
            add("worker start", time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = worker.run(request, timeout)
        return res, time.perf_counter() - t0

    ids = list(dict.fromkeys(config_ids))
    failed: dict[str, tuple[Status, str]] = {}
    for cid in ids:
        res, wall = run(ProbeRequest(family, sig, m, cid, kwargs.get("seed", 0)), probe_timeout_s)
        add("probes", wall)
        if not res.status.ok:
            failed[cid] = (res.status, res.detail)
            # an illegal address poisons the worker's CUDA context for every later request:
            # after a launch error the next request starts a fresh worker
            close = getattr(worker, "close", None)
            if res.status is Status.LAUNCH_ERROR and callable(close):
                close()
    done: dict[str, Measurement] = {}
    survivors = [c for c in ids if c not in failed]
    options = tuple(sorted(kwargs.items()))
    batches = [survivors] if survivors else []
    while batches:
        batch = batches.pop(0)
        res, wall = run(PointRequest(family, sig, m, tuple(batch), options), timeout_s)
        if isinstance(res.value, _Refused):
            res.value.reraise()
        if not res.status.ok:
            add("failed requests", wall)
        if res.status.ok:
            got, inner = res.value
            for key, seconds in inner.items():
                add(key, seconds)
            add("requests", max(wall - sum(inner.values()), 0.0))
            done.update((x.config_id, x) for x in got)
        elif len(batch) > 1:
            batches.extend([c] for c in batch)  # isolate the arm that took the worker down
        else:
            failed[batch[0]] = (res.status, res.detail)
    out = tuple(done[c] if c in done else
                Measurement(sig, m, c, failed[c][0], detail=failed[c][1]) for c in ids)
    if log is not None:
        log.append(out)
    return out
