"""Who measures what in a multi-GPU build: the assignment, re-queue and accounting, in pure Python.

A build across GPUs hands out tasks (build/point_tasks.py: one point's measurement each), the
largest estimate first so the last one to finish is a small one; tasks may arrive while the
build runs (a signature's cross-evaluation once its points are in) and may be pinned to the
worker that must run them (a point's cross-evaluation goes to the GPU that measured its arms);
a worker takes a task pinned to it before any other, and a task pinned to a dead worker goes
to any. Tasks may belong to a group (a signature): the first
worker to take one of a group owns it and takes its other tasks, so a signature's points stay
on one GPU while there is other work; a worker that finds nothing of its own or unowned takes
the last queued task of the group with the most left (work stealing, so no GPU idles at the
tail). A worker that dies loses only the task it held, which
goes back to the front of the queue for another worker; a task whose workers keep dying is
given up after MAX_LOSSES so one poisonous task cannot eat a cluster. `drive()` runs a Scheduler against
a Backend (Ray actors in build/distributed.py; an in-memory fake in the tests), so none of
this needs Ray to be tested.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence

from tunedb.errors import BuildError

MAX_LOSSES = 3  # workers a task may take down with it before the build stops


@dataclass
class WorkerStats:
    """One worker's share of the build: what it finished and how long it was busy."""

    added: float
    busy_s: float = 0.0
    tasks: int = 0
    lost: Hashable | None = None  # the task it held when it died
    dead: bool = False
    ended: float | None = None

    def busy_fraction(self, now: float) -> float:
        span = (self.ended if self.ended is not None else now) - self.added
        return self.busy_s / span if span > 0 else 0.0


@dataclass
class Scheduler:
    """Tasks (hashable keys, each with a cost estimate) handed to workers one at a time."""

    costs: dict[Hashable, float]
    clock: Callable[[], float] = time.monotonic
    queue: deque = field(default_factory=deque)
    running: dict[Hashable, tuple[Hashable, float]] = field(default_factory=dict)  # worker -> (task, start)
    finished: dict[Hashable, Hashable] = field(default_factory=dict)  # task -> worker that finished it
    losses: dict[Hashable, int] = field(default_factory=dict)
    workers: dict[Hashable, WorkerStats] = field(default_factory=dict)
    pins: dict[Hashable, Hashable] = field(default_factory=dict)  # task -> the worker that must run it
    group: Callable[[Hashable], Hashable | None] = lambda task: None  # task -> its group (None: none)
    owners: dict[Hashable, Hashable] = field(default_factory=dict)  # group -> the worker that took it first
    stolen: int = 0  # tasks taken from a group another live worker owns

    @classmethod
    def of(cls, tasks: Iterable[tuple[Hashable, float]], clock: Callable[[], float] = time.monotonic,
           group: Callable[[Hashable], Hashable | None] | None = None) -> "Scheduler":
        items = list(tasks)
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise BuildError("scheduler: a task was given twice")
        # largest first (longest-processing-time order); ties keep the caller's order
        order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
        out = cls(dict(items), clock, deque(items[i][0] for i in order))
        if group is not None:
            out.group = group
        return out

    def add_worker(self, worker: Hashable) -> None:
        if worker in self.workers and not self.workers[worker].dead:
            raise BuildError(f"scheduler: worker {worker!r} added twice")
        self.workers[worker] = WorkerStats(self.clock())

    def add(self, task: Hashable, cost: float = 0.0, *, front: bool = False, pin: Hashable | None = None) -> None:
        """A task that became ready while the build runs; `front` puts it ahead of the queue
        (it finishes what is already started), `pin` reserves it for one worker while it lives."""
        if task in self.costs:
            raise BuildError(f"scheduler: a task was given twice: {task!r}")
        self.costs[task] = cost
        if pin is not None:
            self.pins[task] = pin
        (self.queue.appendleft if front else self.queue.append)(task)

    def _live(self, worker: Hashable | None) -> bool:
        return worker is not None and worker in self.workers and not self.workers[worker].dead

    def _takes(self, worker: Hashable, task: Hashable) -> bool:
        pin = self.pins.get(task)
        return pin is None or pin == worker or not self._live(pin)

    def _owner(self, task: Hashable) -> Hashable | None:
        g = self.group(task)
        owner = self.owners.get(g) if g is not None else None
        return owner if self._live(owner) else None

    def _pick(self, worker: Hashable) -> int | None:
        """Queue index of `worker`'s next task: one pinned to it or of its own group first (a
        pinned task finishes a signature only this worker may finish, whoever owns its group),
        then an unowned group's, then the last one of the group with the most tasks left."""
        takes = [i for i, t in enumerate(self.queue) if self._takes(worker, t)]
        own = next((i for i in takes if self.pins.get(self.queue[i]) == worker
                    or self._owner(self.queue[i]) == worker), None)
        if own is not None:
            return own
        free = next((i for i in takes if self._owner(self.queue[i]) is None), None)
        if free is not None:
            return free
        if not takes:
            return None
        left: dict[Hashable, list[int]] = {}
        for i in takes:
            left.setdefault(self.group(self.queue[i]), []).append(i)
        self.stolen += 1
        return max(left.values(), key=len)[-1]

    def alive(self) -> list[Hashable]:
        return [w for w, s in self.workers.items() if not s.dead]

    def idle(self) -> list[Hashable]:
        return [w for w in self.alive() if w not in self.running]

    def assign(self, worker: Hashable) -> Hashable | None:
        """The next task for an idle `worker` (None: nothing left to hand out)."""
        stats = self.workers.get(worker)
        if stats is None or stats.dead:
            raise BuildError(f"scheduler: worker {worker!r} is not alive")
        if worker in self.running:
            raise BuildError(f"scheduler: worker {worker!r} already holds {self.running[worker][0]!r}")
        i = self._pick(worker)
        if i is None:
            return None
        task = self.queue[i]
        del self.queue[i]
        g = self.group(task)
        if g is not None and self._owner(task) is None:
            self.owners[g] = worker
        self.running[worker] = (task, self.clock())
        return task

    def complete(self, worker: Hashable, task: Hashable) -> None:
        held = self.running.get(worker)
        if held is None or held[0] != task:
            raise BuildError(f"scheduler: worker {worker!r} finished {task!r}, which it did not hold")
        del self.running[worker]
        stats = self.workers[worker]
        stats.busy_s += self.clock() - held[1]
        stats.tasks += 1
        self.finished[task] = worker

    def lose(self, worker: Hashable) -> Hashable | None:
        """`worker` died: its in-flight task (returned) goes back to the front of the queue."""
        stats = self.workers[worker]
        now = self.clock()
        stats.dead, stats.ended = True, now
        held = self.running.pop(worker, None)
        if held is None:
            return None
        task, start = held
        stats.busy_s += now - start
        stats.lost = task
        self.losses[task] = self.losses.get(task, 0) + 1
        if self.losses[task] >= MAX_LOSSES:
            raise BuildError(f"{task} lost its worker {self.losses[task]} times (the last: {worker}); "
                             f"the build stops rather than kill more workers with it")
        self.queue.appendleft(task)
        return task

    def done(self) -> bool:
        return not self.queue and not self.running

    def busy_fractions(self) -> dict[Hashable, float]:
        now = self.clock()
        return {w: s.busy_fraction(now) for w, s in self.workers.items()}


@dataclass(frozen=True)
class Outcome:
    """What a backend reports for one submitted task: its value, or that its worker died."""

    worker: Hashable
    task: Hashable
    value: Any = None
    lost: bool = False
    detail: str = ""


class Backend(Protocol):
    def submit(self, worker: Hashable, task: Hashable) -> None: ...

    def wait(self) -> Sequence[Outcome]:
        """Block until at least one submitted task ends; every ended one."""


def drive(sched: Scheduler, backend: Backend, on_result: Callable[[Hashable, Hashable, Any], None],
          on_lost: Callable[[Outcome], None] = lambda o: None) -> None:
    """Hand tasks to idle workers until every task is finished; each result goes to on_result
    (worker, task, value) as it arrives (it may add tasks). A task of a dead worker is re-queued
    to a live one."""
    while not sched.done():
        for worker in sched.idle():
            task = sched.assign(worker)
            if task is not None:
                backend.submit(worker, task)
        if not sched.running:
            if sched.done():
                break
            raise BuildError(f"every measuring worker died ({len(sched.workers)} started); "
                             f"{len(sched.queue)} task(s) were not measured; re-run with the "
                             f"same --run-id to resume")
        for out in backend.wait():
            if out.lost:
                sched.lose(out.worker)
                on_lost(out)
            else:
                sched.complete(out.worker, out.task)
                on_result(out.worker, out.task, out.value)
