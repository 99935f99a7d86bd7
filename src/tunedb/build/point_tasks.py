"""A multi-GPU build's unit of work: one point of one signature (pure Python, no Ray).

Handing out whole signatures left GPUs idle: the Llama-3-8B decode census has five, so two
GPUs finish at best 5/3 faster than one, and a killed actor cost a whole signature. Here each
signature runs as signature_steps.build_signature does, in its three steps, with every measurement a task
the scheduler hands out (grouped by signature: a signature stays on the GPU that started it
unless another GPU has nothing else to do): first each point's arms (task "arms"), then, once all of them are
in, each point's cross-evaluation (task "cross"). A build (BuildOptions.pair_cross) times the
fallback again in the cross call and pairs every arm with the fallback of its own call
(partition.objective_table), so a point's two calls need not share a GPU: any GPU takes a cross
task, an idle one takes the tail, and a dead GPU's finished arms stand. Without pairing (`tunedb
tune`) a cross task is pinned to the GPU that timed the point's arms, so every comparison at a
point is made on one device (the build refuses GPUs of different SKUs); if that GPU died, the
point is measured again whole (arms and cross) on another, replacing the first half, which never
reaches the log. The last task of a signature yields its Entry (finish_signature): the same
decision the serial build makes from the same measurements.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from tunedb.build import signature_steps
from tunedb.records import Entry, Measurement, Signature


@dataclass(frozen=True, order=True)
class PointTask:
    """One measurement request of the build: `kind` is "arms" or "cross"."""

    signature: Signature
    m: int
    kind: str

    def format(self) -> str:
        return f"{self.signature.format()} M={self.m} ({self.kind})"

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class Request:
    """What the worker measures for a task: Measurer's arguments."""

    signature: Signature
    m: int
    ids: tuple[str, ...]
    alpha: float
    decides: bool


@dataclass
class _Job:
    plan: Any
    waiting: set[PointTask] = field(default_factory=set)  # tasks handed out or queued, not back
    arms: dict[int, list[Measurement]] = field(default_factory=dict)  # M -> its arms' measurements
    crossed: dict[int, list[Measurement]] = field(default_factory=dict)  # M -> its cross-evaluation's
    device: dict[int, Hashable] = field(default_factory=dict)  # M -> the worker that timed its arms
    cross: dict[int, tuple[str, ...]] = field(default_factory=dict)
    whole: set[int] = field(default_factory=set)  # points being measured again whole on another GPU


class PointTasks:
    """Signatures as point tasks. `tasks()` gives the first ones (cost, task); `request(task,
    worker)` says what `worker` measures for it; `done(task, worker, got)` takes the result and
    returns the tasks it made ready (with their pins) and, when it was a signature's last, the
    signature's Entry and every measurement the Entry rests on."""

    def __init__(self, plans: Sequence[Any], opts: Any, valid: Callable[[Signature, int, str], bool] | None,
                 rule: Any = None) -> None:
        self.opts, self.valid, self.rule = opts, valid, rule
        self.jobs = {p.signature: _Job(p) for p in plans}
        # paired calls compare through the fallback of their own call: no need to pin
        self.pinned = not getattr(opts, "pair_cross", True)

    def tasks(self) -> list[tuple[PointTask, float]]:
        """Every point's arms, the largest signature first (its points in M order); a task's
        cost is its signature's estimate shared over its points."""
        out = []
        order = sorted(self.jobs.values(), key=lambda j: -float(j.plan.est_seconds or 0.0))
        for job in order:
            share = float(job.plan.est_seconds or 0.0) / max(1, len(job.plan.points))
            for p in job.plan.points:
                task = PointTask(job.plan.signature, p.m, "arms")
                job.waiting.add(task)
                out.append((task, share))
        return out

    def request(self, task: PointTask, worker: Hashable) -> Request:
        job = self.jobs[task.signature]
        plan, m = job.plan, task.m
        alpha = signature_steps.point_alpha(plan, m)
        if task.kind == "arms":
            return Request(plan.signature, m, tuple(plan.arms[m]), alpha, len(plan.points) == 1)
        if not self._pins(job, m) or job.device.get(m) == worker:
            job.whole.discard(m)
            return Request(plan.signature, m, job.cross[m], alpha, False)
        job.whole.add(m)  # the GPU that timed this point's arms died: measure the point whole here
        ids = tuple(dict.fromkeys(tuple(plan.arms[m]) + job.cross[m]))
        return Request(plan.signature, m, ids, alpha, False)

    def pin(self, task: PointTask) -> Hashable | None:
        job = self.jobs[task.signature]
        return job.device.get(task.m) if task.kind == "cross" and self._pins(job, task.m) else None

    def _pins(self, job: _Job, m: int) -> bool:
        """Whether M's cross task goes to the GPU that timed its arms: unpaired, or where host time
        counts (alpha > 0): pairing levels GPU times, not host times, and with --ray the two calls
        could run on two hosts' CPUs."""
        return self.pinned or signature_steps.point_alpha(job.plan, m) > 0

    def done(self, task: PointTask, worker: Hashable, got: Sequence[Measurement]
             ) -> tuple[list[tuple[PointTask, float, Hashable | None]], Entry | None, list[Measurement]]:
        job = self.jobs[task.signature]
        job.waiting.discard(task)
        if task.kind == "arms":
            job.arms[task.m], job.device[task.m] = list(got), worker
        elif task.m in job.whole:  # measured whole on another GPU: both halves are this one's
            first = set(job.plan.arms[task.m])
            job.arms[task.m] = [x for x in got if x.config_id in first]
            job.crossed[task.m] = [x for x in got if x.config_id not in first]
            job.device[task.m] = worker
            job.whole.discard(task.m)
        else:
            job.crossed[task.m] = list(got)
        ready: list[tuple[PointTask, float, Hashable | None]] = []
        if task.kind == "arms" and not any(t.kind == "arms" for t in job.waiting):
            job.cross = {m: tuple(ids) for m, ids in
                         signature_steps.cross_requests(job.plan, self.measurements(job), self.valid,
                                                         getattr(self.opts, "pair_cross", True)).items()}
            share = float(job.plan.est_seconds or 0.0) / max(1, 2 * len(job.plan.points))
            for m in job.cross:
                t = PointTask(job.plan.signature, m, "cross")
                job.waiting.add(t)
                ready.append((t, share, job.device[m] if self._pins(job, m) else None))
        if job.waiting:
            return ready, None, []
        meas = self.measurements(job)
        return ready, signature_steps.finish_signature(job.plan, meas, self.opts, self.rule), meas

    @staticmethod
    def measurements(job: _Job) -> list[Measurement]:
        """In build_signature's order: each point's arms, then the cross-evaluation by M."""
        first = [x for p in job.plan.points for x in job.arms.get(p.m, ())]
        return first + [x for m in sorted(job.crossed) for x in job.crossed[m]]
