"""Points measured during the census (build/speculative.py): a pass over a speculative plan's
points; the build reuses a request measured ahead only when it makes the same request, measures
the rest itself, never writes what only the pass measured, and writes the file a build without
the pass writes from the same measurements. Fake timer (deterministic per point)."""
from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from tunedb import arch, database, families, pipeline, settings
from tunedb.build import run as build_run
from tunedb.build import speculative
from tunedb.build import steps as buildsteps
from tunedb.measure.timers import FakeTimer
from tunedb.records import Point, ShapeSet, Signature

FLAT = Signature.make("gemm", "gemm", "half", N=512, K=256)
WINS = Signature.make("gemm", "gemm", "half", N=1024, K=1024)


def truth(sig: Signature, m: int, cid: str) -> float:
    if cid in ("torch", "default"):
        return 0.010
    offset = (sum(map(ord, cid)) % 7) * 1e-5
    if sig == WINS and "b16x" in cid and m <= 32:
        return 0.006 + offset
    return 0.011 + offset


class Recording:
    """A cost function that records each (signature, M) a measurement opened; `fail` raises."""

    def __init__(self):
        self.seen: list[tuple[Signature, int]] = []
        self.fail = False

    def __call__(self, sig, m, cid):
        if self.fail:
            raise RuntimeError("the GPU fell off the bus")
        if (sig, m) not in self.seen[-1:]:
            self.seen.append((sig, m))
        return truth(sig, m, cid)


def census(*sigs_ms):
    return ShapeSet(tuple(Point(sig, m, weight=1.0, calls=10) for sig, ms in sigs_ms for m in ms))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setattr(speculative, "_RUNNING", {})
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path
    for name in list(speculative._RUNNING):
        speculative.stop(name)


def opts(out):
    return pipeline.BuildOptions(out=str(out), top_k=4)


def ahead(spec: ShapeSet, out, timer, measurer=None, compiles=None, wait=True):
    """Start a pass over the build's plan of `spec`, as speculative.start does after its census."""
    fam, prof, o = families.get("gemm"), arch.shipped_profile("sm90"), opts(out)
    plans, _ = build_run.plan_build([("c", spec)], o, prof)
    measurer = measurer or buildsteps.Measurer(fam, o, prof, None, buildsteps.working_sets([("c", spec)], fam),
                                               timer=timer)
    run = speculative.measure_ahead("gemm", "sm90", plans, measurer, o, compiles)
    if wait:
        run._thread.join()
    return run


def table(out):
    db = database.load(out / "sm90" / "gemm.json", "gemm", "sm90")
    return db.entries, json.dumps(db.model, sort_keys=True)


def logged(out):
    return [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines() if line.strip()]


def plain(real: ShapeSet, out):
    """The build of `real` with no pass ahead, on its own timer."""
    pipeline.build([("c", real)], opts(out), timer=FakeTimer(truth, noise_sigma=0.002, seed=1))
    return table(out)


def test_points_measured_ahead_are_reused_and_the_file_is_the_plain_builds(env):
    real = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    run = ahead(real, env / "a", timer)
    before = len(cost.seen)
    assert before > 0 and not run.error
    res = pipeline.build([("c", real)], opts(env / "a"), timer=timer)
    assert len(cost.seen) == before  # nothing measured twice: every request was the pass's
    assert res.ahead["reused"] == res.ahead["points"] > 0 and res.ahead["discarded"] == 0
    assert res.arms_measured > 0  # reused arms count as the build's own (its log has them)
    assert table(env / "a") == plain(real, env / "b")
    assert len(logged(env / "a")) == len(logged(env / "b"))


def test_a_pass_planned_in_its_own_thread_is_reused_and_the_file_is_the_plain_builds(env):
    """speculative.start's path with no profile cached: the pass starts with no plan, its
    prelude (there: the profile measured in the worker, the plan redone on it) hands it the plan
    and measurer; settle() returns once it has them, and the build then reuses every request."""
    import threading

    real = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    fam, prof, o = families.get("gemm"), arch.shipped_profile("sm90"), opts(env / "a")
    go = threading.Event()

    def prelude():
        assert go.wait(10)
        plans, _ = build_run.plan_build([("c", real)], o, prof)
        return plans, buildsteps.Measurer(fam, o, prof, None, buildsteps.working_sets([("c", real)], fam),
                                          timer=timer)

    run = speculative.measure_ahead("gemm", "sm90", (), None, o, None, prelude=prelude)
    assert not run.ready.is_set() and cost.seen == []
    go.set()
    speculative.settle("gemm")
    assert run.ready.is_set() and run.measurer is not None
    run._thread.join()
    before = len(cost.seen)
    res = pipeline.build([("c", real)], o, timer=timer)
    assert before > 0 and len(cost.seen) == before and res.ahead["reused"] == res.ahead["points"] > 0
    assert table(env / "a") == plain(real, env / "b")


def test_a_point_only_in_the_real_census_is_measured_by_the_build(env):
    spec = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    real = census((FLAT, (16, 40, 3000)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    ahead(spec, env / "a", timer)
    before = len(cost.seen)
    res = pipeline.build([("c", real)], opts(env / "a"), timer=timer)
    after = cost.seen[before:]
    assert (FLAT, 3000) in after  # measured once the real census arrived
    assert all(s == FLAT for s, _ in after)  # WINS's plan is the same: all of it reused
    assert res.ahead["reused"] >= 3
    assert table(env / "a") == plain(real, env / "b")


def test_a_point_only_the_pass_measured_is_never_written(env):
    spec = census((FLAT, (16, 40)), (WINS, (8, 24, 64, 2048)))
    real = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    ahead(spec, env / "a", timer)
    assert (WINS, 2048) in cost.seen
    res = pipeline.build([("c", real)], opts(env / "a"), timer=timer)
    assert res.ahead["discarded"] >= 1 and res.ahead["reused"] >= 2  # FLAT's points at least
    entries, _ = table(env / "a")
    assert "M=2048" not in entries[WINS].evidence
    assert all(r["M"] != 2048 for r in logged(env / "a"))  # not in the log the model is fitted from
    assert table(env / "a") == plain(real, env / "b")


def test_a_failing_pass_is_dropped_and_the_build_measures_everything(env):
    real = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    cost.fail = True
    run = ahead(real, env / "a", timer)
    assert "the GPU fell off the bus" in run.error
    cost.fail = False
    res = pipeline.build([("c", real)], opts(env / "a"), timer=timer)
    assert res.ahead == {} and res.arms_measured > 0
    assert {s for s, _ in cost.seen} == {FLAT, WINS}
    assert table(env / "a") == plain(real, env / "b")


class HeldCompiles:
    """A compile pool whose jobs for WINS never finish (compile_pool.CompilePool.pending)."""

    def __init__(self):
        self.never = cf.Future()

    def pending(self, sig, ids):
        return [self.never] if sig == WINS else []


def test_the_take_over_stops_a_pass_waiting_on_compiles_and_keeps_what_it_measured(env):
    real = census((FLAT, (16, 40)), (WINS, (8, 24, 64)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    run = ahead(real, env / "a", timer, compiles=HeldCompiles(), wait=False)
    for _ in range(400):  # FLAT's points go through; WINS waits on its compiles
        if run.measured.points >= 2 and all(s == FLAT for s, _ in cost.seen):
            break
        run._thread.join(0.01)
    measured = speculative.take_over("gemm", "sm90", run.measurer)
    assert not run._thread.is_alive() and measured is run.measured and measured.points >= 2
    assert {s for s, _ in cost.seen} == {FLAT}


def test_a_pass_on_another_timer_or_arch_is_not_taken(env):
    real = census((FLAT, (16,)),)
    timer = FakeTimer(truth, seed=1)
    run = ahead(real, env / "a", timer)
    assert speculative.take_over("gemm", "sm80", run.measurer) is None

    class Other:
        worker, timer = None, FakeTimer(truth, seed=1)

    ahead(real, env / "a", timer)
    assert speculative.take_over("gemm", "sm90", Other()) is None
    assert speculative.take_over("gemm", "sm90", run.measurer) is None  # taken once: gone


def test_start_measures_the_mirror_plan_on_the_prestarted_worker(env, monkeypatch):
    """speculative.start hands the worker it was given to a pass over the plan it compiled."""
    from tunedb.build import compile_pool

    point = ShapeSet((Point(FLAT, 1500, 1.0, 10),))
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: point)
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw: arch.shipped_profile("sm90"))
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    monkeypatch.setattr(compile_pool, "_PRESTARTED", {"gemm": (object(), 4)})
    monkeypatch.setattr(speculative, "start_ahead", lambda family, arch_family, plans: None)
    started = []
    monkeypatch.setattr(speculative, "measure_ahead", lambda *a: started.append(a))
    path = arch.cache_path("NVIDIA H200")  # a profile cached: the pass gets its plan at once
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    class Worker:
        def wait_started(self):
            pass

    worker = Worker()
    kw = dict(mode="offline", max_batch=8, chunk=None, manifest=None, capture=None, impl="auto", fused=True)
    opts = pipeline.BuildOptions(out="user", top_k=2)
    monkeypatch.setenv("TUNEDB_MEASURE_AHEAD", "0")
    speculative.start("whisper-base", opts, kw, worker=worker)
    assert started == []  # TUNEDB_MEASURE_AHEAD=0: compiles only
    monkeypatch.delenv("TUNEDB_MEASURE_AHEAD")  # on by default
    speculative.start("whisper-base", opts, kw, worker=worker)
    (name, arch_family, plans, measurer, _, pool), = started
    assert (name, arch_family, pool) == ("gemm", "sm90", None) and measurer.worker is worker
    assert [p.signature for p in plans] == [FLAT] and measurer.log is None


class LateCompiles:
    """`late`'s binaries are done only once `after` points of other signatures have been
    measured (a late compile ahead of them in the plan)."""

    def __init__(self, cost, late, after):
        self.cost, self.sig, self.after, self.late = cost, late, after, cf.Future()

    def pending(self, sig, ids):
        if len({x for x in self.cost.seen if x[0] != self.sig}) >= self.after and not self.late.done():
            self.late.set_result(None)
        return [self.late] if sig == self.sig and not self.late.done() else []


def test_points_are_measured_as_their_compiles_finish_not_behind_a_late_one(env):
    real = census((WINS, (8, 24, 64)), (FLAT, (16, 40)))
    plans, _ = build_run.plan_build([("c", real)], opts(env / "a"), arch.shipped_profile("sm90"))
    first, second = plans[0].signature, plans[1].signature
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    run = ahead(real, env / "a", timer, compiles=LateCompiles(cost, first, len(plans[1].points)),
                wait=False)
    run._thread.join(30)
    assert not run._thread.is_alive() and not run.error
    measured = [s for s, _ in cost.seen]
    n = len(plans[1].points)
    assert measured[:n] == [second] * n and first in measured  # the second's points first
    res = pipeline.build([("c", real)], opts(env / "a"), timer=timer)
    assert res.ahead["discarded"] == 0 and res.ahead["reused"] == res.ahead["points"]
    assert table(env / "a") == plain(real, env / "b")
    order = [(r["signature"], r["M"]) for r in logged(env / "a")]  # logged in the plan's order
    assert order.index((first.format(), plans[0].points[0].m)) < order.index((second.format(), plans[1].points[0].m))


class HungCompiles:
    """A compile that never finishes, with the pool's wait limit (as CompilePool.wait_limit_s)."""

    wait_limit_s = 0.2

    def __init__(self):
        self.never = cf.Future()

    def pending(self, sig, ids):
        return [self.never]


def test_a_hung_compile_does_not_hang_the_pass_past_the_pools_wait_limit(env):
    """Past the limit a point goes ahead (the worker compiles what is missing), as
    CompilePool.wait lets the build do."""
    real = census((FLAT, (16, 40)))
    cost = Recording()
    timer = FakeTimer(cost, noise_sigma=0.002, seed=1)
    run = ahead(real, env / "a", timer, compiles=HungCompiles(), wait=False)
    run._thread.join(30)
    assert not run._thread.is_alive() and not run.error
    assert {16, 40} <= {m for _s, m in cost.seen}  # the census points (and the ladder's) measured


def test_the_pass_drops_a_timeout_or_launch_error_for_the_build_to_measure_again():
    """Contention beside the census can time a probe out: the pass keeps deterministic outcomes
    (ok, incorrect, compile error) and drops transient ones; the build's own fill keeps all."""
    from types import SimpleNamespace

    from tunedb.records import Measurement, Status

    outcome = {8: Status.TIMEOUT, 16: Status.LAUNCH_ERROR, 32: Status.INCORRECT, 64: Status.OK}

    class Stub:
        def request(self, sig, m, ids, share, decides):
            return ("req", m), None

        def __call__(self, sig, m, ids, share, decides):
            ok = outcome[m] is Status.OK
            return (Measurement(sig, m, "torch", outcome[m], median_ms=0.01 if ok else None, n=8 if ok else 0,
                                samples=(0.01,) * 8 if ok else ()),)

    plan = SimpleNamespace(signature=FLAT, points=[SimpleNamespace(m=m, eager_share=0.0) for m in outcome],
                           arms={m: ("torch",) for m in outcome})
    kept = speculative.Measured()
    speculative.fill([plan], Stub(), None, kept, keep_transient=False)
    assert sorted(m for _, m in kept.results) == [32, 64]
    every = speculative.Measured()
    speculative.fill([plan], Stub(), None, every)
    assert sorted(m for _, m in every.results) == [8, 16, 32, 64]
