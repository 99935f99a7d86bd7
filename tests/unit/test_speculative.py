"""Compiles started before the census ends (build/speculative.py): a preset's mirror census,
planned as the build will plan, fills the prestarted pool; the build's own plan then retargets
it, so the points and arms measured are the build's own."""
from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass

import pytest

from tunedb import arch, families, pipeline, settings
from tunedb.build import compile_pool, speculative
from tunedb.build import run as build_run
from tunedb.records import Point, ShapeSet, Signature

SIG = Signature.make("gemm", "gemm", "half", N=512, K=512)


@dataclass(frozen=True, order=True)
class Job:
    name: str


class HeldExecutor:
    """Holds every submitted job as a pending Future (cancel() works until start() marks it running)."""

    def __init__(self):
        self.jobs: dict[object, cf.Future] = {}
        self.shut = None

    def submit(self, fn, job):
        fut = cf.Future()
        self.jobs[job] = fut
        return fut

    def start(self, job):
        assert self.jobs[job].set_running_or_notify_cancel()

    def shutdown(self, wait=True, cancel_futures=False):
        self.shut = (wait, cancel_futures)


@pytest.fixture
def family(monkeypatch, tmp_path):
    fam = families.get("gemm")
    monkeypatch.setattr(fam, "compile_jobs", lambda arch_family, sig, ids: [Job(f"{arch_family}:{c}") for c in ids],
                        raising=False)
    monkeypatch.setattr(compile_pool, "done_log", lambda family: None)
    monkeypatch.setattr(compile_pool, "_PRESTARTED", {})
    monkeypatch.setattr(compile_pool, "_AHEAD", {})
    monkeypatch.setattr(speculative, "_RUNNING", {})
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield fam
    for name in list(speculative._RUNNING):  # a pass start() began (waiting on held compiles)
        speculative.stop(name)


@dataclass(frozen=True)
class Plan:  # the fields of a SignaturePlan the pool reads
    signature: Signature
    points: tuple
    arms: dict


@dataclass(frozen=True)
class P:
    m: int


def plan(**arms_by_m):
    arms = {int(m[1:]): tuple(ids) for m, ids in arms_by_m.items()}
    return Plan(SIG, tuple(P(m) for m in arms), arms)


def test_the_build_takes_over_the_pool_started_ahead_and_retargets_it_to_its_own_plan(family):
    ex = HeldExecutor()
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    ahead = speculative.start_ahead(family, "sm90", [plan(m16=("a", "b", "c"))])
    assert ahead is not None and family.name not in compile_pool._PRESTARTED
    assert list(ex.jobs) == [Job("sm90:a"), Job("sm90:b"), Job("sm90:c")]
    ex.start(Job("sm90:c"))  # already compiling: it cannot be called back
    built = compile_pool.start_for_build(family, "sm90", [plan(m16=("a",), m32=("d",))])
    assert built is ahead and family.name not in compile_pool._AHEAD
    assert ex.jobs[Job("sm90:b")].cancelled() and not ex.jobs[Job("sm90:a")].cancelled()
    assert list(ex.jobs) == [Job("sm90:a"), Job("sm90:b"), Job("sm90:c"), Job("sm90:d")]  # d added, a not again
    rep = compile_pool.report(built)
    assert (rep["jobs"], rep["ahead"], rep["cancelled"], rep["unused"]) == (3, 3, 1, 1)
    assert "3 submitted before the census ended (2 of them not in the build's plan)" in compile_pool.describe(rep)
    ex.jobs[Job("sm90:a")].set_result({"ok": True, "seconds": 1.0})
    assert rep["failed"] == [] and built.stats.ok == 1  # a cancelled job is neither compiled nor failed
    assert built.wait(SIG, ["a"]) == 0.0


def test_a_pool_started_ahead_for_another_target_is_dropped(family):
    ex = HeldExecutor()
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    speculative.start_ahead(family, "sm80", [plan(m16=("a",))])
    compile_pool._PRESTARTED[family.name] = (HeldExecutor(), 4)
    built = compile_pool.start_for_build(family, "sm90", [plan(m16=("a",))])
    assert built is not None and built._pool is not ex and ex.shut == (False, True)


def test_release_stops_compiles_started_ahead(family):
    ex = HeldExecutor()
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    speculative.start_ahead(family, "sm90", [plan(m16=("a",))])
    compile_pool.release(family)
    assert ex.shut == (False, True) and family.name not in compile_pool._AHEAD


def test_nothing_is_started_ahead_without_prestarted_processes(family):
    assert speculative.start_ahead(family, "sm90", [plan(m16=("a",))]) is None


KW = dict(mode="offline", max_batch=8, chunk=None, manifest=None, capture=None, impl="auto", fused=True,
          cached=True)


def test_only_a_preset_census_not_yet_cached_and_not_the_mirror_is_worth_a_speculative_one(family):
    assert speculative.wanted("whisper-base", KW)
    assert not speculative.wanted("whisper-base", {**KW, "impl": "mirror"})
    assert not speculative.wanted("my.module:build", KW)
    pipeline.take_census("whisper-base", **{**KW, "impl": "mirror"})  # cache the mirror's: not the one asked for
    assert speculative.wanted("whisper-base", KW)
    assert not speculative.wanted("whisper-base", {**KW, "impl": "mirror"})


def test_the_speculative_plan_is_the_builds_plan_of_the_mirror_census(family, monkeypatch):
    """start() censuses the mirror and, with no profile cached, plans it at once on this GPU's
    queried limits and the shipped ceilings (current_profile(measure=False)) and submits those
    compiles before it waits for the worker's start; then (compiles only: TUNEDB_MEASURE_AHEAD=0)
    it measures the profile the build will use and retargets the pool to that plan: the same
    census planned by the build yields the same jobs."""
    monkeypatch.setenv("TUNEDB_MEASURE_AHEAD", "0")
    point = ShapeSet((Point(SIG, 1500, 1.0, 10), Point(SIG, 3000, 1.0, 10)))
    asked = []
    ex = HeldExecutor()
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: asked.append(kw) or point)
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw: asked.append(("profile", measure))
                        or arch.shipped_profile("sm90"))
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    opts = pipeline.BuildOptions(out="user", top_k=4)

    class Starting:
        def wait_started(self):
            asked.append(("worker started", len(ex.jobs)))

    pool = speculative.start("whisper-base", opts, KW, worker=Starting())
    assert pool is not None
    assert asked[0]["impl"] == "mirror" and "cached" not in asked[0] and "capture" not in asked[0]
    assert asked[1] == ("profile", False)  # no profile cached: the queried one first, nothing measured
    plans, _ = build_run.plan_build([("whisper-base", point)], opts, arch.shipped_profile("sm90"))
    expected = {Job(f"sm90:{c}") for p in plans for ids in p.arms.values() for c in ids}
    assert asked[2] == ("worker started", len(expected))  # every compile submitted before the wait
    assert asked[3] == ("profile", True)  # then the build's own profile (measured, then cached)
    assert set(ex.jobs) == expected and expected
    assert pool.stats.cancelled == 0 and pool.stats.ahead == len(expected)


def test_measuring_ahead_the_profile_is_measured_in_the_worker_while_the_census_goes_on(family, monkeypatch):
    """With the pass measuring ahead (the default) and no profile cached, start() returns once
    the first plan's compiles are submitted; the profile is measured by the worker (a
    ProfileRequest) in the pass's thread, which then plans again on it, retargets the pool and
    measures that plan; settle() waits for that much, and the build then reads the profile
    measured there (arch's memo) instead of measuring it again."""
    import dataclasses
    import threading

    from tunedb.measure.worker import WorkerResult
    from tunedb.records import Status

    point = ShapeSet((Point(SIG, 1500, 1.0, 10),))
    measured = dataclasses.replace(arch.shipped_profile("sm90"), source="measured in the worker")
    first_ids, final_ids = ("a", "b"), ("b", "c")

    def plan_build(censuses, opts, profile, params=None):
        return [Plan(SIG, (P(1500),), {1500: final_ids if profile is measured else first_ids})], None

    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: point)
    monkeypatch.setattr(build_run, "plan_build", plan_build)
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw:
                        arch.shipped_profile("sm90") if not measure else pytest.fail("measured in this process"))
    monkeypatch.setattr(arch, "_MEMO", {})
    ex = HeldExecutor()
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    release, requests = threading.Event(), []

    class Worker:
        timer = None

        def run(self, request, timeout_s=None):
            requests.append(request)
            assert release.wait(10)
            return WorkerResult(Status.OK, measured)

    worker = Worker()
    pool = speculative.start("whisper-base", pipeline.BuildOptions(out="user", top_k=2), KW, worker=worker)
    # back before the worker answered: the first plan's compiles are out, the profile is not
    assert {j.name for j in ex.jobs} == {"sm90:a", "sm90:b"} and not release.is_set()
    _, run = speculative._RUNNING[family.name]
    assert not run.ready.is_set()
    release.set()
    speculative.settle(family.name)
    assert requests == [speculative.ProfileRequest()]
    assert arch._MEMO["NVIDIA H200"] is measured
    assert [p.arms[1500] for p in run.plans] == [final_ids] and run.measurer.worker is worker
    assert ex.jobs[Job("sm90:a")].cancelled() and Job("sm90:c") in ex.jobs and pool.stats.ahead == 2
    speculative.stop(family.name)


def test_a_failed_profile_in_the_worker_drops_the_pass_and_the_build_measures_it(family, monkeypatch):
    from tunedb.measure.worker import WorkerResult
    from tunedb.records import Status

    point = ShapeSet((Point(SIG, 1500, 1.0, 10),))
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: point)
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw: arch.shipped_profile("sm90"))
    compile_pool._PRESTARTED[family.name] = (HeldExecutor(), 4)

    class Worker:
        timer = None

        def run(self, request, timeout_s=None):
            return WorkerResult(Status.TIMEOUT, None, "no answer")

    worker = Worker()
    assert speculative.start("whisper-base", pipeline.BuildOptions(out="user", top_k=2), KW, worker=worker)
    speculative.settle(family.name)

    class Build:  # the build's measurer on the same worker
        timer = None
    Build.worker = worker
    assert speculative.take_over(family.name, "sm90", Build()) is None  # dropped: the build measures all
    assert family.name not in speculative._RUNNING


def test_a_plan_changed_by_the_measured_profile_retargets_the_pool(family, monkeypatch):
    """When the measured ceilings rank otherwise, the compiles queued for the first plan that
    the measured one does not need are cancelled and its missing ones submitted."""
    point = ShapeSet((Point(SIG, 1500, 1.0, 10),))
    ex = HeldExecutor()
    first_ids, final_ids = ("a", "b", "c"), ("b", "c", "d")

    def plan_build(censuses, opts, profile, params=None):
        ids = final_ids if profile.source == "measured" else first_ids
        return [Plan(SIG, (P(1500),), {1500: ids})], None

    import dataclasses

    shipped = arch.shipped_profile("sm90")
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: point)
    monkeypatch.setattr(build_run, "plan_build", plan_build)
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw:
                        dataclasses.replace(shipped, source="measured") if measure else shipped)
    compile_pool._PRESTARTED[family.name] = (ex, 4)
    monkeypatch.setenv("TUNEDB_MEASURE_AHEAD", "0")  # compiles only: the profile measured in this thread
    pool = speculative.start("whisper-base", pipeline.BuildOptions(out="user", top_k=3), KW)
    assert {j.name for j, f in ex.jobs.items() if not f.cancelled()} == {"sm90:b", "sm90:c", "sm90:d"}
    assert ex.jobs[Job("sm90:a")].cancelled() and pool.stats.cancelled == 1
    assert pool.stats.ahead == 3  # the jobs of the plan the build will make


def test_no_speculation_without_a_prestarted_pool_or_when_it_fails(family, monkeypatch):
    opts = pipeline.BuildOptions(out="user")
    called = []
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: called.append(kw) or ShapeSet(()))
    assert speculative.start("whisper-base", opts, KW) is None and called == []  # no pool: no census
    compile_pool._PRESTARTED[family.name] = (HeldExecutor(), 4)

    def broken(w, **kw):
        raise RuntimeError("no mirror here")

    monkeypatch.setattr(pipeline, "take_census", broken)
    assert speculative.start("whisper-base", opts, KW) is None
    assert family.name in compile_pool._PRESTARTED  # left for the build


def test_a_cached_profile_needs_no_wait_for_the_worker(family, monkeypatch):
    point = ShapeSet((Point(SIG, 1500, 1.0, 10),))
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: point)
    monkeypatch.setattr(arch, "queried", lambda device=None: {"sku": "NVIDIA H200", "arch_family": "sm90"})
    monkeypatch.setattr(arch, "current_profile", lambda measure=True, **kw: arch.shipped_profile("sm90"))
    path = arch.cache_path("NVIDIA H200")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    compile_pool._PRESTARTED[family.name] = (HeldExecutor(), 4)

    class Starting:
        def wait_started(self):
            raise AssertionError("waited for the worker with the profile cached")

    assert speculative.start("whisper-base", pipeline.BuildOptions(out="user", top_k=2), KW, worker=Starting())


def test_a_config_cancelled_by_one_retarget_and_wanted_by_the_next_is_submitted_again():
    """The pool is retargeted twice on a first run (the plan on the measured profile, then the
    build's own): a config the middle plan dropped and the build wants is compiled in the pool
    again, not left to the measuring worker's inline compile."""
    ex = HeldExecutor()
    pool = compile_pool.CompilePool(lambda sig, ids: [Job(f"sm90:{c}") for c in ids], [(SIG, ("a", "b"))], 2,
                                    executor=ex, own=False)
    pool.retarget([(SIG, ("b", "c"))])
    assert not pool.pending(SIG, ("a",)) and pool.stats.cancelled == 1
    pool.retarget([(SIG, ("a", "b", "c"))])
    assert pool.pending(SIG, ("a",)) and not ex.jobs[Job("sm90:a")].cancelled()
    assert pool.stats.jobs == 3
