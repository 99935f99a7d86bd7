"""confirm(): Triton picks judged inside the model (measurer faked); a slower one is demoted to
torch in the user tier at exactly the M it served, and nothing else changes."""
from __future__ import annotations

import pytest

from runtime_fakes import gemm  # noqa: F401  (fixture)
from tunedb import database
from tunedb.runtime import selector
from tunedb.records import Entry, Point, Region, Signature
from tunedb.runtime.confirm import confirm, demote_regions, slower

A = Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")
B = Signature.parse("gemm|op=gemm_act|dt=bf16|N=128|K=64|act=silu|bias=1")
WIN, WIN2 = "b32x64x128_w4_s3_g8", "b64x64x64_w4_s3_g8"


class Timings:
    """A measurer: a fixed served/torch ratio per signature (or per (signature, Ms)), three
    rounds around it; records what it was asked; a ratio None raises, as a failed capture."""

    def __init__(self, ratios):
        self.ratios, self.asked = ratios, []

    def __call__(self, sig, ms):
        self.asked.append((sig, ms))
        r = self.ratios.get((sig, ms), self.ratios.get(sig))
        if r is None:
            raise RuntimeError("CUDA graph capture failed")
        return 1.0 * r, 1.0, [r * 0.999, r, r * 1.001]


def _points(*pairs):
    return [Point(sig, m, weight=1.0, must_tune=True) for sig, m in pairs]


@pytest.mark.parametrize("regions, ms, expected", [
    # a catch-all split around the demoted M
    (((None, "t"),), (64,), ((63, "t"), (64, "torch"), (None, "t"))),
    # inside a bounded region, its neighbours untouched
    (((8192, "t"), (None, "torch")), (5992,), ((5991, "t"), (5992, "torch"), (8192, "t"), (None, "torch"))),
    # at a region's upper bound, and at its first M (merged with a torch neighbour)
    (((64, "a"), (128, "t"), (None, "b")), (128,), ((64, "a"), (127, "t"), (128, "torch"), (None, "b"))),
    (((16, "t"), (None, "torch")), (1, 16), ((1, "torch"), (15, "t"), (None, "torch"))),
    # past every bounded region: another tier answers there, so nothing changes
    (((64, "a"), (128, "t")), (200,), ((64, "a"), (128, "t"))),
])
def test_demote_regions_changes_exactly_the_demoted_m(regions, ms, expected):
    got = demote_regions(tuple(Region(m, c) for m, c in regions), ms)
    assert got == tuple(Region(m, c) for m, c in expected)
    old, new = Entry(A, tuple(Region(m, c) for m, c in regions)), Entry(A, got)
    probe = sorted({1, 2, 300, *ms, *(m + d for m in ms for d in (-1, 1) if m + d >= 1)})
    changed = {m for m in probe if old.lookup(m) != new.lookup(m)}
    assert changed == {m for m in ms if old.lookup(m) not in (None, "torch")}


def test_a_pick_slower_in_the_model_is_demoted_at_its_m_and_the_rest_is_kept(gemm, tiers_dirs):
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(16, WIN), Region(None, WIN2))),
                                                    Entry(B, (Region(None, WIN),))],
                           [gemm.parse_config(WIN), gemm.parse_config(WIN2)])
    selector.reload()
    timings = Timings({A: 1.02, B: 1.001})
    result = confirm(None, _points((A, 16), (B, 32)), measurer=timings)
    assert sorted(timings.asked) == sorted([(A, (16,)), (B, (32,))])  # each pick timed once, pinned at its Ms
    verdicts = {v.signature: v for v in result.verdicts}
    assert verdicts[A].demoted and verdicts[A].ratio == pytest.approx(1.02)
    assert not verdicts[B].demoted  # inside the noise band: kept
    assert "demoted to torch" in verdicts[A].line() and "kept" in verdicts[B].line()
    # a new epoch serves torch at exactly M=16; every other M keeps its pick
    assert selector.resolve("gemm", A, 16).config.id == "torch"
    assert [selector.resolve("gemm", A, m).config.id for m in (8, 15, 17, 64)] == [WIN, WIN, WIN2, WIN2]
    assert selector.resolve("gemm", B, 32).config.id == WIN
    entry = database.load(database.file_path("user", "sm90", "gemm")).entries[A]
    assert entry.source == "confirm" and any("confirm" in n and "M=16" in n for n in entry.notes)
    assert "1 demoted to torch" in result.summary()


def test_a_system_tier_pick_is_demoted_in_a_user_tier_copy(gemm, tiers_dirs):
    database.write_entries("system", "gemm", "sm90", [Entry(A, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    selector.reload()
    assert selector.resolve("gemm", A, 40).tier == "system"
    confirm(None, _points((A, 40)), measurer=Timings({A: 1.05}))
    assert selector.resolve("gemm", A, 40).config.id == "torch"
    assert selector.resolve("gemm", A, 41).config.id == WIN
    assert selector.resolve("gemm", A, 41).tier == "user"  # the copy answers the other Ms alike
    system = database.load(database.file_path("system", "sm90", "gemm"))
    assert system.entries[A].regions == (Region(None, WIN),)  # the shipped file is never edited


def test_nothing_is_written_when_every_pick_holds_or_publish_is_off(gemm, tiers_dirs):
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    selector.reload()
    path = database.file_path("user", "sm90", "gemm")
    before = path.read_bytes()
    assert not confirm(None, _points((A, 16)), measurer=Timings({A: 0.97})).demoted
    result = confirm(None, _points((A, 16)), measurer=Timings({A: 1.2}), publish=False)
    assert len(result.demoted) == 1  # judged, not written
    assert path.read_bytes() == before and selector.resolve("gemm", A, 16).config.id == WIN


def test_picks_of_no_tier_entry_and_torch_picks_are_not_timed(gemm, tiers_dirs, monkeypatch):
    database.write_entries("user", "gemm", "sm90", [Entry(B, (Region(None, "torch"),))])
    selector.reload()
    timings = Timings({})
    result = confirm(None, _points((A, 16), (B, 32)), measurer=timings)
    # A: no tier has it, so the default tier serves torch (the fallback); B runs torch
    assert timings.asked == [] and list(result.verdicts) == []
    # a Triton pick no entry holds (the model tier's): reported, not judged
    monkeypatch.setenv("TUNEDB_MODEL_FALLBACK", "auto")
    selector.set_ranker("gemm", lambda s, m, cands: next(c for c in cands if not c.is_sentinel))
    try:
        result = confirm(None, _points((A, 16), (B, 32)), measurer=timings)
    finally:
        selector.set_ranker("gemm", None)
    assert timings.asked == []
    (verdict,) = result.verdicts
    assert verdict.signature == A and verdict.tier == "model" and verdict.ratio is None
    assert "not judged" in verdict.line() and "prewarm" in verdict.line()


def test_bad_arguments_are_clear_errors(gemm, tiers_dirs):
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    selector.reload()
    with pytest.raises(TypeError, match="example inputs"):
        confirm(None, _points((A, 16)))  # Points say which shapes, not how to time them
    with pytest.raises(ValueError, match="tol=1.5"):
        confirm(None, _points((A, 16)), measurer=Timings({A: 1.0}), tol=1.5)


def test_one_noisy_round_cannot_demote_a_pick():
    assert slower([1.01, 1.012, 1.008, 1.011, 0.99, 1.01, 1.009], 0.003)  # one round below 1: still slower
    assert not slower([1.01, 1.012, 0.998, 1.011, 0.99, 1.01, 1.009], 0.003)  # two below: not clear
    assert not slower([1.002, 1.001, 1.002], 0.003)  # inside the band


def test_a_pick_answered_by_another_signatures_entry_is_demoted_for_the_call_only(gemm, tiers_dirs):
    # the bf16 call is answered by the dt=half entry, which fp16 calls share: the demotion is a
    # bf16 entry of its own, and fp16 keeps its pick at every M
    half = Signature.parse("gemm|op=gemm|dt=half|N=64|K=32")
    fp16 = Signature.parse("gemm|op=gemm|dt=fp16|N=64|K=32")
    database.write_entries("user", "gemm", "sm90", [Entry(half, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    selector.reload()
    assert selector.resolve("gemm", A, 16).entry_signature == half
    confirm(None, _points((A, 16)), measurer=Timings({A: 1.05}))
    assert selector.resolve("gemm", A, 16).config.id == "torch"
    assert selector.resolve("gemm", A, 17).config.id == WIN
    assert selector.resolve("gemm", fp16, 16).config.id == WIN
    entries = database.load(database.file_path("user", "sm90", "gemm")).entries
    assert entries[half].regions == (Region(None, WIN),) and A in entries


def test_user_regions_below_a_system_pick_survive_its_demotion(gemm, tiers_dirs):
    # the user tier has A up to M=64 (autotune-style, no catch-all); the system tier answers
    # above; M=16 (user) and M=100 (system) are two picks, each timed and judged on its own
    database.write_entries("system", "gemm", "sm90", [Entry(A, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(64, WIN2),))], [gemm.parse_config(WIN2)])
    selector.reload()
    timings = Timings({(A, (16,)): 1.0, (A, (100,)): 1.05})
    result = confirm(None, _points((A, 16), (A, 100)), measurer=timings)
    assert sorted(timings.asked) == [(A, (16,)), (A, (100,))]
    assert [(v.ms, v.tier, v.demoted) for v in result.verdicts] == [((16,), "user", False), ((100,), "system", True)]
    got = {m: selector.resolve("gemm", A, m) for m in (1, 16, 64, 65, 99, 100, 101, 5000)}
    assert {m: r.config.id for m, r in got.items()} == {1: WIN2, 16: WIN2, 64: WIN2, 65: WIN, 99: WIN,
                                                        100: "torch", 101: WIN, 5000: WIN}


def test_a_failed_timing_is_that_picks_verdict_and_the_others_go_on(gemm, tiers_dirs):
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(None, WIN),)), Entry(B, (Region(None, WIN),))],
                           [gemm.parse_config(WIN)])
    selector.reload()
    result = confirm(None, _points((A, 16), (B, 32)), measurer=Timings({B: 1.05}))  # A's timing raises
    verdicts = {v.signature: v for v in result.verdicts}
    assert verdicts[A].ratio is None and "timing failed: RuntimeError: CUDA graph capture failed" in verdicts[A].line()
    assert verdicts[B].demoted and selector.resolve("gemm", B, 32).config.id == "torch"
    assert selector.resolve("gemm", A, 16).config.id == WIN


def test_an_unwritable_or_disabled_user_tier_is_named_before_anything_is_timed(gemm, tiers_dirs, tmp_path,
                                                                               monkeypatch):
    from tunedb import settings
    from tunedb.database import target
    from tunedb.errors import DatabaseError

    database.write_entries("system", "gemm", "sm90", [Entry(A, (Region(None, WIN),))], [gemm.parse_config(WIN)])
    # a read-only place (root writes anywhere here: the check's answer is faked), then the tier off
    monkeypatch.setattr(target, "unwritable", lambda path: f"{path.parent}: Read-only file system")
    for value, named in ((str(tmp_path / "tiers"), "Read-only file system"), ("off", "TUNEDB_USER_DB=off")):
        timings = Timings({A: 1.05})
        with settings.override(USER_DB=value):
            selector.reload()
            with pytest.raises(DatabaseError, match=named):
                confirm(None, _points((A, 16)), measurer=timings)
            assert timings.asked == []  # refused before the first capture
            judged = confirm(None, _points((A, 16)), measurer=timings, publish=False)  # judging still works
            assert judged.verdicts[0].ratio == pytest.approx(1.05) and timings.asked == [(A, (16,))]


@pytest.mark.parametrize("kw, error, named", [
    ({"roundz": 3}, TypeError, "roundz"),
    ({"rounds": 0}, ValueError, "rounds=0"),
    ({"rounds": 2}, ValueError, "at least 3"),
    ({"block_ms": float("nan")}, ValueError, "block_ms=nan"),
    ({"seed": "a"}, ValueError, "seed='a'"),
    ({"seed": 1.5}, ValueError, "seed=1.5"),
])
def test_bad_measure_keywords_are_named_before_anything_runs(kw, error, named):
    with pytest.raises(error, match=named):
        confirm(object(), (), **kw)


def test_measure_keywords_with_a_given_measurer_are_refused():
    with pytest.raises(TypeError, match="rounds="):
        confirm(None, [], measurer=Timings({}), rounds=5)
