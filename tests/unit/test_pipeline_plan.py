"""The build plan (points, ladder fill, arms per point) and run checkpoints."""
from __future__ import annotations

import json

import pytest

from tunedb import arch, families

from tunedb.build import plan as buildplan

from tunedb.build import steps as buildsteps

from tunedb.build import checkpoint

from tunedb.build import partition
from tunedb.errors import BuildError
from tunedb.records import Entry, Point, Region, Signature

GEMM = families.get("gemm")
SM90 = arch.shipped_profile("sm90")
SIG = Signature.make("gemm", "gemm", "half", N=1024, K=1024)
ACT = Signature.make("gemm", "gemm_act", "half", N=768, K=256, act="gelu_tanh", bias=1)


def test_fill_points_add_the_ladder_and_merge_duplicate_census_rows():
    pts = buildplan.fill_points([Point(SIG, 20, 0.25, 2), Point(SIG, 20, 0.25, 6, must_tune=True, eager_share=1.0),
                                 Point(SIG, 300, 0.5, 8)])
    ms = [p.m for p in pts]
    assert ms == sorted(ms) and ms[0] == 20 and ms[-1] == 368  # bucket_of(300) = 368
    assert {24, 128, 184, 256} <= set(ms)
    at20 = pts[0]
    assert (at20.weight, at20.calls, at20.must_tune, at20.eager_share) == (0.5, 8, True, 0.75)
    assert all(p.weight == 0 for p in pts if p.m not in (20, 300))


def test_arms_are_top_k_plus_forced_with_the_default_once():
    ranks = buildsteps.rankers(GEMM, SM90, None)
    ids = buildplan.arms_for_point(GEMM, ACT, 64, SM90, ranks, top_k=5)
    assert ids[-3:] == ("default", "torch", "fused")  # forced arms last; fused applies to gelu_tanh+bias
    assert len(ids) == 8 and len(set(ids)) == 8
    concrete_default = GEMM.default_config(SIG, SM90).id

    def always_default(sig, m, configs, k):
        return [concrete_default] + [c.id for c in configs[: k - 1]]

    ids = buildplan.arms_for_point(GEMM, SIG, 64, SM90, [always_default], top_k=4)
    assert concrete_default not in ids and ids.count("default") == 1  # measured once, as 'default'
    assert "fused" not in ids


def test_exhaustive_measures_every_valid_config():
    ids = buildplan.arms_for_point(GEMM, SIG, 64, SM90, [], exhaustive=True)
    valid = [c for c in GEMM.config_space("sm90") if GEMM.invalid_reason(c, SIG, 64, SM90) is None]
    assert len(ids) == len(valid) - 1 + 2  # the concrete default runs as 'default'; + torch


def test_thin_caps_census_and_fill_points_together():
    census = [Point(SIG, m, 1.0 / 40, 1) for m in range(8, 8 * 41, 8)]
    plan = buildplan.plan_signature(GEMM, census, SM90, buildsteps.rankers(GEMM, SM90, None), top_k=2,
                                    thin=lambda pts: partition.thin(pts, 6))
    assert len(plan.points) == 6
    assert sum(p.weight for p in plan.points) == pytest.approx(1.0)  # dropped weight moved up
    assert plan.points[0].m == 8


def test_checkpoint_roundtrip_and_torn_files(tmp_path):
    run = checkpoint.open_run("r-1", {"census": "abc"}, root=tmp_path)
    assert not run.resumed and run.finished() == {}
    entry = Entry(SIG, (Region(64, "b16x64x256_w4_s3_g8"), Region(None, "torch")),
                  {"M=64": {"torch": [0.01, 0.0001, 9], "_l2": "warm"}}, "build", {}, ("M=64: x",))
    run.save(checkpoint.Finished(entry, ("b16x64x256_w4_s3_g8",), 12, 1.5))
    (run.path / "finished" / "torn.json").write_text('{"entry": ')
    again = checkpoint.open_run("r-1", {"census": "abc"}, root=tmp_path)
    assert again.resumed
    done = again.finished()
    assert list(done) == [SIG] and done[SIG].entry == entry and done[SIG].arms_measured == 12
    with pytest.raises(BuildError, match="census was 'abc', now 'xyz'"):
        checkpoint.open_run("r-1", {"census": "xyz"}, root=tmp_path)
    assert json.loads((tmp_path / "r-1" / "run.json").read_text()) == {"census": "abc"}


@pytest.mark.parametrize("bad", ["", "../up", "a/b", "x" * 65, "-lead"])
def test_bad_run_ids_are_refused(tmp_path, bad):
    with pytest.raises(BuildError, match="bad run id"):
        checkpoint.open_run(bad, {}, root=tmp_path)


def _edge_ranker(sig, m, configs, k):
    """A model whose favourite changes at M = 32: configs[0] below, configs[1] from 32 up."""
    return [configs[0].id if m < 32 else configs[1].id]


def test_a_point_measures_its_neighbours_ranked_configs_across_a_region_edge():
    census = [Point(SIG, m, 1.0 / 5, 1) for m in (24, 28, 32, 36, 128)]
    plan = buildplan.plan_signature(GEMM, census, SM90, [_edge_ranker], top_k=1, fill=False)
    valid = [c for c in GEMM.config_space("sm90") if GEMM.invalid_reason(c, SIG, 28, SM90) is None]
    low, high = valid[0].id, valid[1].id
    assert plan.arms[28][:2] == (low, high)  # its own pick first, then the one borrowed from M = 32
    assert plan.arms[32][:2] == (high, low)
    assert plan.arms[24][:1] == (low,) and high not in plan.arms[24]  # two points from the edge: not borrowed
    assert plan.arms[128][:1] == (high,) and low not in plan.arms[128]
    for ids in plan.arms.values():
        assert ids[-2:] == ("default", "torch")  # the forced arms stay last


def test_only_close_neighbours_lend_their_arms():
    """The ladder's sqrt(2) and 2x steps above 128 do not borrow (NEIGHBOUR_SPAN): whisper's
    1500 / 3000 / 6000 / 12000 would nearly double their arms."""
    arms = {1500: ("a", "torch"), 3000: ("b", "torch"), 3600: ("c", "torch")}
    got = buildplan.borrow_neighbours(arms, ("torch",), lambda m, cid: True)
    assert got[1500] == ("a", "torch")
    assert got[3000] == ("b", "c", "torch")  # 3600 <= 1.25 x 3000
    assert got[3600] == ("c", "b", "torch")


def test_borrowing_respects_the_validity_predicate_at_the_borrowing_point():
    arms = {8: ("a", "default", "torch"), 16: ("b", "default", "torch"), 64: ("c", "default", "torch")}
    got = buildplan.borrow_neighbours(arms, ("default", "torch"), lambda m, cid: not (m == 8 and cid == "b"), span=2.0)
    assert got[8] == ("a", "default", "torch")  # b is refused at M = 8
    assert got[16] == ("b", "a", "default", "torch")  # 64 is more than 2x away
    assert got[64] == ("c", "default", "torch")


def test_the_first_pass_is_the_same_whatever_the_measurements():
    """What makes two builds comparable: the pairs measured before any result exists come from the
    plan alone (the model's ranking and the neighbours), never from a timing."""
    census = [Point(SIG, m, 1.0 / 16, 1) for m in range(1, 17)]
    ranks = buildsteps.rankers(GEMM, SM90, None)
    a = buildplan.plan_signature(GEMM, census, SM90, ranks, top_k=4)
    b = buildplan.plan_signature(GEMM, census, SM90, ranks, top_k=4)
    assert dict(a.arms) == dict(b.arms)
    for m, ids in a.arms.items():
        assert len(ids) == len(set(ids))
        for cid in ids:
            cfg = next((c for c in GEMM.config_space("sm90") if c.id == cid), None)
            assert cfg is None or GEMM.invalid_reason(cfg, SIG, m, SM90) is None
