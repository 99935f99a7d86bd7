"""A family written against the contract alone runs the whole pipeline: census -> simulated
build -> database -> selector -> evaluate -> its run-time op; and its in-place op proves the
measuring code's input ring (a timed launch never sees its own output)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import toy_family
from toy_family import LOG, NAME, TOY
from tunedb import database, families, pipeline, settings
from tunedb.census.recorder import Recorder
from tunedb.evaluate import oracle
from tunedb.measure import protocol
from tunedb.measure.arms import problem_for
from tunedb.measure.eager import EagerTimer
from tunedb.records import Point, ShapeSet, Status
from tunedb.runtime import dispatch, selector

SIG = TOY.schema.make(NAME, "recip", "fp32", n=32)


@pytest.fixture
def toy():
    toy_family.install()
    LOG.clear()
    yield TOY
    selector.configure()


def model(batches=(3, 8, 8, 20)):
    """What a user runs: in-place reciprocals of several batch sizes (and one op nobody tunes)."""
    for b in batches:
        x = 1.0 + torch.rand(b, 32)
        x.reciprocal_()
        x.exp()


def census() -> ShapeSet:
    with torch.no_grad(), Recorder(families=(NAME,)) as rec:
        model()
    return ShapeSet(tuple(Point(sig, m, weight=float(n), calls=n) for (sig, m), n in sorted(rec.calls.items())),
                    "toy")


def test_census_records_the_family_by_its_own_rules(toy):
    shapes = census()
    assert {(p.signature, p.m, p.calls) for p in shapes.points} == {(SIG, 3, 1), (SIG, 8, 2), (SIG, 20, 1)}


def test_the_toy_family_goes_through_build_database_selector_evaluate_and_its_op(toy, tmp_path):
    out = tmp_path / "db"
    # measured on the NULL device: a fake timer (the roofline of work() plus seeded noise) in place
    # of the GPU; a --simulate build would be refused by every serving tier (issue 17)
    from tunedb.arch import shipped_profile
    from tunedb.build.steps import simulated_timer

    timer = simulated_timer(TOY, shipped_profile("sm90"), seed=0, noise=0.01)
    result = pipeline.build([("toy", census())], pipeline.BuildOptions(out=str(out), family=NAME, isolate=False),
                            timer=timer)
    (entry,) = result.entries
    assert entry.signature == SIG and entry.source == "build"
    # the size axis is the batch: census sizes plus the pow2 ladder's edges up to above 20
    measured = sorted(int(k[2:]) for k in entry.evidence)
    assert measured == [3, 4, 8, 16, 20, 32]
    assert entry.regions[-1] == database.schema.Region(None, "torch")  # its own fallback, no gate
    path = out / "sm90" / f"{NAME}.json"
    db = database.load(path, NAME, "sm90")
    assert db.entries[SIG].regions == entry.regions and db.validators["impl_hash"] == "toyrecip-1"
    assert db.model is None  # no cost model: nothing calibrated

    with settings.override(USER_DB=str(out)):
        selector.configure("sm90")
        for m in (3, 8, 20):
            res = selector.peek(NAME, SIG, m)
            assert (res.tier, res.config.id) == ("user", _concrete(entry.lookup(m)))
        unmeasured = TOY.schema.make(NAME, "recip", "fp32", n=128)
        res = selector.peek(NAME, unmeasured, 8)
        # no model tier without a cost model: the default tier serves the fallback, not the untuned chunk4
        assert (res.tier, res.config.id) == ("default", "torch")

        ev, regions = oracle.evaluate_logs([result.log_path], [("toy", path)], family=NAME, arch_family="sm90")
        names = {s.name for s in ev.summaries}
        assert {"toy", "default", "torch"} <= names and "cost model" not in names
        assert [r.config_id for r in regions["toy"][SIG.format()]] == [r.config_id for r in entry.regions]

        dispatch.ensure_ops(NAME)
        x = 1.0 + torch.rand(8, 32)
        want = 1.0 / x
        torch.ops.toyrecip.recip_(x)
        torch.testing.assert_close(x, want)
        served = selector.counters()[NAME]["signatures"][SIG.format()]
        assert served["user"] >= 1


def _concrete(cid):
    return TOY.default_config(SIG).id if cid == "default" else cid


def _sample_all(problem, rounds=3, gate=True):
    session = EagerTimer(calls=8, gate=gate).open(problem, seed=0, working_set_bytes=None)
    try:
        assert all(p.status.ok for p in session.prepared.values())
        LOG.clear()
        for _ in range(rounds):
            session.sample([c for c in problem.config_ids if session.prepared[c].status.ok])
        return list(LOG)
    finally:
        session.close()


def test_a_timed_launch_never_sees_its_own_output(toy):
    problem = problem_for(TOY, SIG, 16, ["chunk1", "chunk4", "torch"])
    assert problem.policy == "ring"
    seen = _sample_all(problem)
    assert len(seen) == 3 * 3 * 8 and not any(seen)  # 3 rounds x 3 arms x 8 calls, all on fresh input
    # today's cloning (rotating weight copies, sharing the rest) times the solver on its own output
    # (ungated: the gate's own in-place handling is the ring's)
    rotated = _sample_all(dataclasses.replace(problem, policy="rotate"), gate=False)
    assert any(rotated)


def test_the_ring_through_the_protocol_and_the_residual_gate(toy):
    problem = problem_for(TOY, SIG, 16, ["chunk1", "chunk4", "skip2", "torch"])
    LOG.clear()
    got = {m.config_id: m for m in protocol.measure_problem(problem, timer=EagerTimer(calls=8), seed=1)}
    assert got["skip2"].status is Status.INCORRECT and "residual" in got["skip2"].detail
    assert all(got[c].status.ok for c in ("chunk1", "chunk4", "torch"))
    assert dict(got["chunk1"].env)["inputs"] == "ring"
    assert not any(LOG)
