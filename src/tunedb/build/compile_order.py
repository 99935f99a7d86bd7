"""Measuring planned points in the order their compiles finish (fill), into the store of
requests measured ahead of the build's loop (Measured) that its measurer takes from.

A point whose binaries are ready is never held behind one still compiling; measuring stays
serial on the GPU. Used by the pass that measures beside the census and by the build after it
takes that pass over (build/speculative.py, which re-exports these names).
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from tunedb.build import timeline
from tunedb.records import Measurement, MeasureRequest, Status


class _Stopped(Exception):
    """The build took over: the pass ends before its next point."""


@dataclass
class Measured:
    """Requests measured ahead of the build's loop, as its measurer takes them (take: equal
    requests only): the pass's, and the build's own measured in compile order (fill)."""

    results: dict[MeasureRequest, tuple[Measurement, ...]] = field(default_factory=dict)
    points: int = 0  # requests the pass measured during the census
    seconds: float = 0.0  # the pass's wall time, census-side (the build did not wait for it)
    reused: int = 0  # of the pass's requests, those the build made
    filled: int = 0  # the build's own requests measured in compile order before its loop
    dropped: int = 0  # the pass's results with a timeout or launch error (measured again by the build)
    _pass: set[MeasureRequest] = field(default_factory=set)

    def take(self, request: MeasureRequest) -> tuple[Measurement, ...] | None:
        out = self.results.pop(request, None)
        if out is not None and request in self._pass:
            self.reused += 1
        return out

    def report(self) -> dict[str, Any]:
        """points measured ahead, how many the build reused, how many it discarded (not its own)."""
        return {"points": self.points, "reused": self.reused, "discarded": len(self._pass & set(self.results)),
                "seconds": round(self.seconds, 3), "filled": self.filled, "dropped": self.dropped}


_TRANSIENT = (Status.TIMEOUT, Status.LAUNCH_ERROR)


def fill(plans: Sequence[Any], measurer: Any, compiles: Any, measured: Measured,
         stop: threading.Event | None = None, keep_transient: bool = True) -> int:
    """Measure each plan's points (the requests build_signature makes first) with `measurer`
    into `measured`, in the order their compiles finish rather than the plan's: a point whose
    binaries are ready is never held behind one still compiling (measuring stays serial; the
    cross-evaluation, which needs a signature's points, stays in build_signature). Requests
    already in `measured` are skipped. keep_transient=False (the pass beside the census) drops a
    result with a timeout or launch error, which CPU or GPU contention can cause: the build
    measures that point again. Returns how many were measured."""
    todo = []
    for plan in plans:
        for p in plan.points:
            ids, decides = plan.arms[p.m], len(plan.points) == 1
            request, _ = measurer.request(plan.signature, p.m, ids, p.eager_share, decides)
            if request not in measured.results:
                todo.append((request, (plan.signature, p.m, ids, p.eager_share, decides)))
    done = 0
    # as CompilePool.wait: past its limit a point goes ahead and the worker compiles what is missing
    limit = getattr(compiles, "wait_limit_s", None)
    waited_since = time.perf_counter()
    while todo:
        if stop is not None and stop.is_set():
            raise _Stopped
        pending = {} if compiles is None else {i: compiles.pending(args[0], args[2]) for i, (_, args) in enumerate(todo)}
        ready = next((i for i in range(len(todo)) if not pending.get(i)), None)
        if ready is None and limit is not None and time.perf_counter() - waited_since > limit:
            ready = 0
        if ready is None:  # wake at the first compile done (or to look at `stop` again)
            t0 = time.perf_counter()
            cf.wait([f for futs in pending.values() for f in futs], timeout=0.05, return_when=cf.FIRST_COMPLETED)
            phases = getattr(measurer, "phases", None)
            if phases is not None:
                phases["compile wait"] = phases.get("compile wait", 0.0) + time.perf_counter() - t0
            continue
        request, args = todo.pop(ready)
        result = measurer(*args)
        if keep_transient or not any(r.status in _TRANSIENT for r in result):
            measured.results[request] = result
            if not keep_transient:
                timeline.mark("ahead first point")
        else:
            measured.dropped += 1
        waited_since = time.perf_counter()
        done += 1
    return done
