"""A multi-GPU build's point tasks without Ray (build/point_tasks.py): the signatures decided
from point tasks handed to two workers in any order are the serial build's; a point's
cross-evaluation waits for all its signature's arms. A build pairs each call with its own
torch, so the cross call goes to any GPU and a dead GPU's finished arms stand; without pairing
(`tunedb tune`) it goes to the GPU that timed the point's arms, and a point whose GPU died is
measured whole on another, of which only that measurement is kept."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from tunedb import families, pipeline
from tunedb.build import signature_steps
from tunedb.build import steps as buildsteps
from tunedb.build.point_tasks import PointTasks
from tunedb.build.scheduler import Outcome, Scheduler, drive

CENSUS = Path(__file__).resolve().parents[2] / "bench" / "census" / "llama-3-8b_decode.json"


@pytest.fixture(scope="module")
def setup():
    opts = pipeline.BuildOptions(out="/nonexistent", simulate=True, thin=True, max_points=3, dry_run=True)
    plans = pipeline.build([("llama", pipeline.read_census(CENSUS))], opts).plans
    opts = pipeline.BuildOptions(out="/nonexistent", simulate=True, thin=True, max_points=3)
    family = families.get("gemm")
    arch = pipeline.arch_profile("sm90", real=False)
    measurer = buildsteps.Measurer(family, opts, arch, None, {})
    serial = {p.signature: signature_steps.build_signature(p, measurer, opts)[0] for p in plans}
    return plans, opts, measurer, serial


@pytest.fixture(scope="module")
def pinned(setup):
    """The same, unpaired (`tunedb tune`'s BuildOptions.pair_cross=False): cross tasks pinned."""
    plans, opts, measurer, _ = setup
    opts = replace(opts, pair_cross=False)
    serial = {p.signature: signature_steps.build_signature(p, measurer, opts)[0] for p in plans}
    return plans, opts, measurer, serial


class Shuffled:
    """Runs each submitted task through the simulated measurer, finishing them in a seeded
    random order; `die` names the (worker, task kind) whose first such task kills the worker."""

    def __init__(self, tasks: PointTasks, measurer, seed: int, die: tuple[int, str] | None = None) -> None:
        self.tasks, self.measurer, self.rng, self.die = tasks, measurer, random.Random(seed), die
        self.pending: list[tuple[int, object]] = []
        self.requests: list[tuple[int, object, object]] = []

    def submit(self, worker, task) -> None:
        req = self.tasks.request(task, worker)
        self.requests.append((worker, task, req))
        self.pending.append((worker, task, req))

    def wait(self):
        worker, task, req = self.pending.pop(self.rng.randrange(len(self.pending)))
        if self.die and (worker, task.kind) == self.die:
            self.die = None
            return [Outcome(worker, task, lost=True)]
        got = self.measurer(req.signature, req.m, req.ids, req.alpha, decides=req.decides)
        return [Outcome(worker, task, value=list(got))]


def run(plans, opts, measurer, seed, die=None, grouped=True):
    tasks = PointTasks(plans, opts, measurer.valid)
    sched = Scheduler.of(tasks.tasks(), group=(lambda t: t.signature) if grouped else None)
    for w in (0, 1):
        sched.add_worker(w)
    backend = Shuffled(tasks, measurer, seed, die)
    entries, kept = {}, {}

    def on_result(worker, task, got):
        ready, entry, meas = tasks.done(task, worker, got)
        for t, cost, pin in ready:
            sched.add(t, cost, front=True, pin=pin)
        if entry is not None:
            entries[task.signature], kept[task.signature] = entry, meas
    drive(sched, backend, on_result)
    return entries, kept, backend.requests


@pytest.mark.parametrize("mode", ["paired", "pinned"])
@pytest.mark.parametrize("seed,grouped", [(0, True), (1, True), (2, False)])
def test_point_tasks_decide_as_the_serial_build(request, mode, seed, grouped) -> None:
    plans, opts, measurer, serial = request.getfixturevalue("setup" if mode == "paired" else "pinned")
    entries, kept, requests = run(plans, opts, measurer, seed, grouped=grouped)
    assert {s: e.regions for s, e in entries.items()} == {s: e.regions for s, e in serial.items()}
    assert {s: e.evidence for s, e in entries.items()} == {s: e.evidence for s, e in serial.items()}
    assert {w for w, _, _ in requests} == {0, 1}  # both GPUs measured
    where = {}
    for w, task, req in requests:
        if task.kind == "arms":
            where[(task.signature, task.m)] = w
    for w, task, req in requests:
        if task.kind == "cross":  # after every arm of its signature was in
            arms_done = [i for i, (_, t, _) in enumerate(requests) if t.signature == task.signature and t.kind == "arms"]
            assert max(arms_done) < requests.index((w, task, req))
            assert (req.ids[-1] == "torch") is (mode == "paired")  # the cross call's own torch
            if mode == "pinned":  # on the GPU that timed the point's arms
                assert w == where[(task.signature, task.m)]


def test_paired_cross_tasks_go_to_any_gpu(setup) -> None:
    """Unpinned, an idle GPU takes cross tasks whose arms the other GPU timed (the tail)."""
    plans, opts, measurer, _ = setup
    moved = 0
    for seed in range(4):
        _, _, requests = run(plans, opts, measurer, seed)
        where = {(t.signature, t.m): w for w, t, _ in requests if t.kind == "arms"}
        moved += sum(1 for w, t, _ in requests if t.kind == "cross" and w != where[(t.signature, t.m)])
    assert moved > 0


def test_a_dead_gpus_point_is_measured_whole_on_the_other_when_pinned(pinned) -> None:
    plans, opts, measurer, serial = pinned
    entries, kept, requests = run(plans, opts, measurer, 0, die=(0, "cross"))
    lost = next(t for w, t, _ in requests if w == 0 and t.kind == "cross")
    again = [(w, r) for w, t, r in requests if t == lost and w == 1]
    assert len(again) == 1
    plan = next(p for p in plans if p.signature == lost.signature)
    w, req = again[0]
    assert set(plan.arms[lost.m]) <= set(req.ids)  # arms and cross-evaluation together, on GPU 1
    at_m = [x for x in kept[lost.signature] if x.m == lost.m]
    assert sorted(x.config_id for x in at_m) == sorted(req.ids)  # GPU 0's arms at M were dropped
    assert set(entries) == set(serial)


def test_a_dead_gpus_finished_arms_stand_when_paired(setup) -> None:
    plans, opts, measurer, serial = setup
    entries, kept, requests = run(plans, opts, measurer, 0, die=(0, "cross"))
    lost = next(t for w, t, _ in requests if w == 0 and t.kind == "cross")
    again = [r for w, t, r in requests if t == lost and w == 1]
    assert len(again) == 1
    plan = next(p for p in plans if p.signature == lost.signature)
    assert not set(again[0].ids) & (set(plan.arms[lost.m]) - {"torch"})  # only the cross arms (+ torch)
    assert {s: e.regions for s, e in entries.items()} == {s: e.regions for s, e in serial.items()}


class Dying(Shuffled):
    """Shuffled over `n` workers, each result's worker dying with probability `p` (one always
    lives); a dead worker's later tasks are lost as they reach it (Ray notices on submit)."""

    def __init__(self, tasks: PointTasks, measurer, seed: int, n: int, p: float) -> None:
        super().__init__(tasks, measurer, seed)
        self.n, self.p, self.dead, self.who = n, p, set(), {}

    def wait(self):
        worker, task, req = self.pending.pop(self.rng.randrange(len(self.pending)))
        if worker in self.dead or (len(self.dead) < self.n - 1 and self.rng.random() < self.p):
            self.dead.add(worker)
            return [Outcome(worker, task, lost=True)]
        got = list(self.measurer(req.signature, req.m, req.ids, req.alpha, decides=req.decides))
        self.who.update((id(x), worker) for x in got)
        return [Outcome(worker, task, value=got)]


@pytest.mark.parametrize("mode", ["paired", "pinned"])
@pytest.mark.parametrize("seed", range(12))
def test_deaths_anywhere_finish_every_signature_once(request, mode, seed) -> None:
    plans, opts, measurer, serial = request.getfixturevalue("setup" if mode == "paired" else "pinned")
    n = 2 + seed % 3
    tasks = PointTasks(plans, opts, measurer.valid)
    sched = Scheduler.of(tasks.tasks(), group=lambda t: t.signature)
    for w in range(n):
        sched.add_worker(w)
    backend = Dying(tasks, measurer, seed, n, 0.08)
    kept: dict = {}

    def on_result(worker, task, got):
        ready, entry, meas = tasks.done(task, worker, got)
        for t, cost, pin in ready:
            sched.add(t, cost, front=True, pin=pin)
        if entry is not None:
            assert task.signature not in kept, f"{task.signature} finished twice"
            kept[task.signature] = meas
    drive(sched, backend, on_result)
    assert set(kept) == set(serial) and not sched.queue
    for sig, meas in kept.items():
        # a dead GPU's half of a point never joins the new one; torch is timed again in a point's
        # cross call (the cross arms pair with it), so once per call
        calls = {(x.m, dict(x.env).get("run")) for x in meas}
        pairs = [(x.m, x.config_id, dict(x.env).get("run")) for x in meas]
        assert len(pairs) == len(set(pairs))
        assert len([x for x in meas if x.config_id != "torch"]) == len({(x.m, x.config_id) for x in meas if x.config_id != "torch"})
        assert all(len({r for (m, r) in calls if m == mm}) <= 2 for mm in {x.m for x in meas})
        for m in {x.m for x in meas}:  # every comparison at a point timed on one GPU (pinned)
            assert mode == "paired" or len({backend.who[id(x)] for x in meas if x.m == m}) == 1, (sig, m)


def test_a_point_whose_host_time_counts_keeps_its_cross_task_on_its_gpu(setup) -> None:
    """Pairing levels GPU times, not host times: where the census's eager share is > 0 the cross
    call stays with the arms (with --ray the two could run on two hosts' CPUs)."""
    plans, opts, measurer, _ = setup
    eager = [replace(p, points=tuple(replace(q, eager_share=0.5) for q in p.points)) for p in plans]
    _, _, requests = run(eager, opts, measurer, 1)
    where = {(t.signature, t.m): w for w, t, _ in requests if t.kind == "arms"}
    crossed = [(w, t) for w, t, _ in requests if t.kind == "cross"]
    assert crossed and all(w == where[(t.signature, t.m)] for w, t in crossed)
