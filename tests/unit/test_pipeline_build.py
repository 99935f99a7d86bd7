"""The build end to end on the CPU: fake timers with hand-set truths, the real GEMM family."""
from __future__ import annotations

import json

import pytest

from tunedb import database, families, pipeline, settings

from tunedb.build import checkpoint
from tunedb.measure.timers import FakeTimer
from tunedb.errors import BuildError
from tunedb.records import Point, Region, ShapeSet, Signature, Status

FLAT = Signature.make("gemm", "gemm", "half", N=512, K=256)  # nothing beats torch by the gate
WINS = Signature.make("gemm", "gemm", "half", N=1024, K=1024)  # 16-row tiles win at small M
ACT = Signature.make("gemm", "gemm_act", "half", N=768, K=256, act="relu", bias=1)


def truth(sig: Signature, m: int, cid: str) -> float:
    """Per-call ms. torch is 10 us everywhere; Triton configs are 2% slower than torch on FLAT,
    on WINS a BM=16 tile runs 6 us up to M=32 and 20 us above, others 11 us; fused wins on ACT."""
    if cid == "torch":
        return 0.010
    if cid == "default":
        return 0.012
    if cid == "fused":
        return 0.007
    offset = (sum(map(ord, cid)) % 7) * 1e-5  # distinct, stable, small
    if sig == FLAT:
        return 0.0102 + offset
    if sig == WINS and cid.startswith(("b16x", "sk")) and "b16x" in cid:
        return 0.006 + offset if m <= 32 else 0.020
    return 0.011 + offset


def census(*sigs_ms: tuple[Signature, tuple[int, ...]]) -> ShapeSet:
    return ShapeSet(tuple(Point(sig, m, weight=1.0, calls=10) for sig, ms in sigs_ms for m in ms))


@pytest.fixture
def cache(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def opts(out, **kw) -> pipeline.BuildOptions:
    base = dict(out=str(out), simulate=True, top_k=6, fresh=False)
    base.update(kw)
    return pipeline.BuildOptions(**base)


def test_build_regions_cover_and_keep_the_fallback(cache):
    timer = FakeTimer(truth, noise_sigma=0.002, seed=1)
    shapes = census((FLAT, (16, 40)), (WINS, (8, 24, 64)), (ACT, (16, 32)))
    res = pipeline.build([("c", shapes)], opts(cache / "out"), timer=timer)
    path = cache / "out" / "sm90" / "gemm.json"
    assert res.path == path and path.exists()
    assert (cache / "out" / "measurements.jsonl").exists() and res.log_path == cache / "out" / "measurements.jsonl"
    db = database.load(path, "gemm", "sm90")
    assert set(db.entries) == {FLAT, WINS, ACT}
    for entry in db.entries.values():
        assert entry.source == "simulated"
        his = [r.m_hi for r in entry.regions]
        assert his[-1] is None and all(isinstance(h, int) for h in his[:-1])
        assert his[:-1] == sorted(his[:-1])
        assert all(k.startswith("M=") for k in entry.evidence)
    # FLAT: every Triton config is slower than torch: torch keeps the whole axis
    assert [r.to_json() for r in db.entries[FLAT].regions] == [[None, "torch"]]
    # WINS: a 16-row tile up to M=32 (rounded up to the largest measured M it serves), torch above
    wins = db.entries[WINS].regions
    assert wins[0].config_id.startswith("b16x") and wins[0].m_hi == 32
    assert wins[-1].config_id == "torch"
    # ACT: the fused epilogue, a forced arm, wins everywhere by 1.4x
    act = [r.to_json() for r in db.entries[ACT].regions]
    assert len(act) == 2 and act[0][1] == "fused" and act[1] == [None, "torch"]  # fused up to its largest M
    assert db.model and db.model.get("schema") == 1  # the fitted cost model is stored
    assert res.arms_measured > 0 and set(res.census_seconds) == {"c"}
    # where the time went: in-process (the fake timer) there are no worker phases; the build's
    # own setup and write are timed around the measuring
    assert set(res.phase_seconds) == {"setup", "prepare", "rounds", "write"}
    assert sum(res.phase_seconds.values()) <= res.seconds
    # evidence keeps the fallback and the winners with [median, sigma, n] and the L2 state
    ev = db.entries[WINS].evidence["M=24"]
    assert ev["torch"][2] > 0 and ev["_l2"] in ("cold", "warm")


def test_simulate_refuses_the_system_tier(cache, capsys):
    with pytest.raises(BuildError, match="--simulate refuses --out system"):
        pipeline.build([("c", census((FLAT, (16,))))], opts("system"))
    from tunedb.cli import main

    shapes_file = cache / "census.json"
    shapes_file.write_text("{}")
    assert main(["build", "--census", str(shapes_file), "--out", "system", "--simulate"]) == 2
    assert "--simulate refuses --out system" in capsys.readouterr().err


def test_dry_run_measures_nothing(cache):
    seen = []

    def cost(sig, m, cid):
        seen.append((sig, m, cid))
        return 0.01

    timer = FakeTimer(cost)
    res = pipeline.build([("c", census((WINS, (16, 100))))], opts(cache / "out", dry_run=True), timer=timer)
    assert seen == [] and timer.calls == []
    assert not (cache / "out").exists() and not (cache / "cache" / "runs").exists()
    (plan,) = res.plans
    assert plan.census_ms == (16, 100)
    # the ladder from 16 up to bucket_of(100) = 104, so the largest census M has a measured size above it
    assert set(plan.fill_ms) == set(range(24, 105, 8)) - {100}
    assert max(p.m for p in plan.points) == 104
    assert all(set(ids) >= {"default", "torch"} for ids in plan.arms.values())
    assert plan.est_seconds > 0 and plan.cross_pairs >= 0


def test_killed_build_resumes_without_remeasuring(cache):
    shapes = census((FLAT, (16, 24)), (WINS, (16, 24)))
    first_sig = sorted([FLAT, WINS])[0]
    seen: list[Signature] = []

    def dying(sig, m, cid):
        if sig != first_sig:
            raise RuntimeError("killed")
        return truth(sig, m, cid)

    with pytest.raises(RuntimeError, match="killed"):
        pipeline.build([("c", shapes)], opts(cache / "out", run_id="r1"), timer=FakeTimer(dying))
    run = checkpoint.RunDir(cache / "cache" / "runs" / "r1", "r1")
    assert set(run.finished()) == {first_sig}
    assert not (cache / "out" / "sm90" / "gemm.json").exists()

    def recording(sig, m, cid):
        seen.append(sig)
        return truth(sig, m, cid)

    res = pipeline.build([("c", shapes)], opts(cache / "out", run_id="r1"), timer=FakeTimer(recording))
    assert seen and first_sig not in seen
    assert res.resumed == (first_sig.format(),)
    db = database.load(cache / "out" / "sm90" / "gemm.json")
    assert set(db.entries) == {FLAT, WINS}
    # the run's log holds both attempts under one run id; the model was fitted over it
    lines = [json.loads(x) for x in (cache / "out" / "measurements.jsonl").read_text().splitlines()]
    assert {x["run_id"] for x in lines} == {"r1"} and {x["signature"] for x in lines} == {FLAT.format(), WINS.format()}


def test_resume_with_other_inputs_is_refused(cache):
    pipeline.build([("c", census((FLAT, (16,))))], opts(cache / "out", run_id="r2"),
                   timer=FakeTimer(truth))
    with pytest.raises(BuildError, match="run r2 .* other inputs .*census"):
        pipeline.build([("c", census((FLAT, (16, 24))))], opts(cache / "out", run_id="r2"),
                       timer=FakeTimer(truth))


def test_rebuild_on_noise_emits_the_same_regions(cache):
    """Two --simulate builds (cost-model truth), noise seeds 1 and 2, noise well inside the
    margins: the files differ only in measured numbers (evidence, notes' speedups, the fitted
    model), never in regions, configs or sources; `tunedb diff` reports no entry change."""
    shapes = census((FLAT, (8, 48, 200)), (WINS, (16, 64, 600)), (ACT, (24, 300)))
    files = []
    for seed in (1, 2):
        out = cache / f"out{seed}"
        pipeline.build([("c", shapes)], opts(out, seed=seed, noise=0.002, top_k=8))
        files.append(database.load(out / "sm90" / "gemm.json"))
    a, b = files
    changes = database.diff(a, b)
    assert [c for c in changes if c.subject != "file"] == []
    assert all(not c.counted and c.what.startswith("model refit:") for c in changes)  # the refit only

    def choices(db):
        return json.dumps({s.format(): [r.to_json() for r in e.regions] for s, e in db.entries.items()},
                          sort_keys=True)
    assert choices(a) == choices(b)
    assert a.entries[WINS].evidence != b.entries[WINS].evidence  # the noise was real


def test_no_write_prints_the_diff_and_writes_nothing(cache):
    out = cache / "out"
    pipeline.build([("c", census((FLAT, (16,))))], opts(out), timer=FakeTimer(truth))
    before = (out / "sm90" / "gemm.json").read_text()
    res = pipeline.build([("c", census((FLAT, (16,)), (WINS, (16, 24))))], opts(out, no_write=True),
                         timer=FakeTimer(truth))
    assert res.path is None
    assert (out / "sm90" / "gemm.json").read_text() == before
    assert any(c.kind == "added" and c.subject == WINS.format() for c in res.changes)


def test_a_real_build_without_a_gpu_says_so(cache, monkeypatch):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    with pytest.raises(BuildError, match="no CUDA GPU"):
        pipeline.build([("c", census((FLAT, (16,))))], pipeline.BuildOptions(out=str(cache / "o")))


@pytest.mark.parametrize("kw, message", [
    (dict(min_speedup=0.9), "--min-speedup"),
    (dict(max_points=4), "--max-points needs --thin"),
    (dict(thin=True), "--thin needs --max-points"),
])
def test_bad_flags_are_named(cache, kw, message):
    with pytest.raises(BuildError, match=message):
        pipeline.build([("c", census((FLAT, (16,))))], opts(cache / "o", **kw))


def test_failed_arms_are_evidence_not_numbers(cache):
    def some_fail(sig, m, cid):
        return Status.COMPILE_ERROR if cid.startswith("b16x") else truth(sig, m, cid)

    pipeline.build([("c", census((WINS, (16, 24))))], opts(cache / "o"), timer=FakeTimer(some_fail))
    db = database.load(cache / "o" / "sm90" / "gemm.json")
    regions = db.entries[WINS].regions
    assert all(not r.config_id.startswith("b16x") for r in regions)


def test_replacing_an_entry_measured_at_other_sizes_warns(cache):
    """One census at a time into one file: the second build replaces the shared signature's
    entry, and says which measured sizes that drops (build such censuses together)."""
    from tunedb.errors import TunedbWarning

    out = cache / "shared"
    pipeline.build([("a", census((WINS, (16, 600))))], opts(out, top_k=4))
    with pytest.warns(TunedbWarning, match=r"replacing gemm\|op=gemm\|dt=half\|N=1024\|K=1024: .*M=.*600"):
        pipeline.build([("b", census((WINS, (16, 64))))], opts(out, top_k=4))
    db = database.load(out / "sm90" / "gemm.json")
    assert not any(k == "M=600" for k in db.entries[WINS].evidence)


BIG = Signature.make("gemm", "gemm_act", "half", N=5120, K=1280, act="gelu", bias=1)
SQUARE = Signature.make("gemm", "gemm_act", "half", N=1280, K=1280, act="none", bias=1)
SCORES = Signature.make("gemm", "bmm", "half", B=20, N=1500, K=64)


def test_working_set_is_every_weight_one_forward_reads_per_model():
    from tunedb.build.steps import working_sets

    # 10 forwards of a 4-layer encoder: fc1 once per layer, the square projections 3x per layer
    encoder = ShapeSet((Point(BIG, 1500, calls=30), Point(BIG, 12000, calls=10),
                        Point(SQUARE, 1500, calls=120), Point(SCORES, 1500, calls=40)),
                       "enc", (("forwards", "10"),))
    layers = 4 * 5120 * 1280 * 2 + 12 * 1280 * 1280 * 2  # the bmm has no weight
    other = ShapeSet((Point(SQUARE, 16, calls=5),), "small", (("forwards", "5"),))
    unknown = ShapeSet((Point(FLAT, 16, calls=7),), "no-forwards")
    got = working_sets([("enc", encoder), ("small", other), ("x", unknown)], families.get("gemm"))
    assert got[BIG] == layers
    assert got[SQUARE] == layers  # shared with a smaller model: the larger working set
    assert got[FLAT] == 512 * 256 * 2  # no forward count: one copy of its own weight
    assert SCORES not in got


def test_build_measures_each_signature_behind_its_models_working_set(cache):
    seen = {}

    class Spy(FakeTimer):
        def open(self, problem, *, seed, working_set_bytes):
            seen.setdefault(problem.signature, set()).add(working_set_bytes)
            return super().open(problem, seed=seed, working_set_bytes=working_set_bytes)

    deep = ShapeSet((Point(WINS, 16, weight=1.0, calls=320),), "deep", (("forwards", "10"),))
    shallow = ShapeSet((Point(FLAT, 16, weight=1.0, calls=10),), "shallow", (("forwards", "10"),))
    pipeline.build([("deep", deep), ("shallow", shallow)], opts(cache / "out"), timer=Spy(truth))
    assert seen[WINS] == {32 * 1024 * 1024 * 2}  # 32 layers of a 1024x1024 weight: beyond L2
    assert seen[FLAT] == {512 * 256 * 2}  # another model: its own working set, not the sum


def test_no_fill_measures_the_census_sizes_only(cache):
    from tunedb.measure.log import read_log

    shapes = census((WINS, (24,)), (ACT, (16, 40)))
    filled = pipeline.build([("c", shapes)], opts(cache / "filled"), timer=FakeTimer(truth, seed=1))
    exact = pipeline.build([("c", shapes)], opts(cache / "exact", fill=False), timer=FakeTimer(truth, seed=1))
    measured = {r.measurement.m for r in read_log(exact.log_path)}
    assert measured == {16, 24, 40}  # the ladder's edges (32, and 48 above 40) are not measured
    assert {r.measurement.m for r in read_log(filled.log_path)} > measured
    assert exact.arms_measured < filled.arms_measured
    db = database.load(cache / "exact" / "sm90" / "gemm.json", "gemm", "sm90")
    # the call's own size is served by its winner; above the largest measured size, torch
    wins = db.entries[WINS].regions
    assert wins[0].config_id.startswith("b16x") and wins[0].m_hi == 24 and wins[-1] == Region(None, "torch")
    assert db.entries[WINS].lookup(25) == "torch"


def test_the_build_and_tune_commands_take_no_fill():
    import argparse

    from tunedb.commands.build import add_build_options, options_from

    parser = argparse.ArgumentParser()
    add_build_options(parser, out_default="user")
    assert options_from(parser.parse_args([])).fill is True
    assert options_from(parser.parse_args(["--no-fill"])).fill is False


def test_only_a_signatures_sole_point_stops_at_the_gate(cache):
    """A signature measured at one M serves exactly that point's gate verdict, so its rounds stop
    once no arm can pass it; where several points share a region's geomean gate they sample on."""
    timer = FakeTimer(truth, noise_sigma=0.03, seed=2)
    shapes = census((FLAT, (24,)), (WINS, (64, 96)))
    pipeline.build([("c", shapes)], opts(cache / "out"), timer=timer)
    from tunedb.measure.log import read_measurements

    stops = {(x.signature, x.m): dict(x.env)["stop"] for x in read_measurements(cache / "out" / "measurements.jsonl")}
    assert stops[(FLAT, 24)] == "fallback gate"
    assert all(stops[(WINS, m)] != "fallback gate" for m in (64, 96))


def test_cross_evaluation_never_carries_a_config_past_its_valid_sizes(cache):
    """A triton_decode config (M <= 16) that wins the small points is cross-evaluated only where
    the predicate accepts it: never measured above M=16, so its region ends at a measured M <= 16."""
    def decode_wins(sig, m, cid):
        if cid.startswith("dk"):
            assert m <= 16, f"{cid} measured at M={m}"
            return 0.005
        return truth(sig, m, cid)

    res = pipeline.build([("c", census((WINS, (4, 16, 64))))], opts(cache / "out", top_k=40),
                         timer=FakeTimer(decode_wins))
    db = database.load(res.path, "gemm", "sm90")
    regions = db.entries[WINS].regions
    assert any(r.config_id.startswith("dk") for r in regions)
    assert all(r.m_hi is not None and r.m_hi <= 16 for r in regions if r.config_id.startswith("dk"))
    lines = [json.loads(x) for x in (cache / "out" / "measurements.jsonl").read_text().splitlines()]
    assert not [x for x in lines if x.get("config_id", "").startswith("dk") and x.get("m", 0) > 16]


@pytest.mark.parametrize("pair", [True, False])
def test_the_cross_call_times_torch_again_unless_tune_opts_out(cache, pair):
    """A build's cross-evaluation call also times torch, so its arms pair with torch from their
    own rounds (partition.objective_table); `tunedb tune` trades that for wall time."""
    from tunedb.measure.log import read_measurements

    shapes = census((WINS, (8, 24, 64)))
    pipeline.build([("c", shapes)], opts(cache / "out", pair_cross=pair), timer=FakeTimer(truth, noise_sigma=0.002, seed=1))
    calls: dict = {}
    for x in read_measurements(cache / "out" / "measurements.jsonl"):
        calls.setdefault((x.m, dict(x.env)["run"]), []).append(x.config_id)
    cross = [ids for ids in calls.values() if "default" not in ids]  # a point's first call holds every forced arm
    assert cross
    for ids in cross:
        assert ("torch" in ids) is pair
        assert not pair or ids[-1] == "torch"


def test_torch_is_timed_for_as_many_rounds_as_any_arm_of_its_call(cache):
    """The fallback is never halved away (Measurer.request's keep), so every arm pairs with it
    over all of its rounds; each call has its own id."""
    from tunedb.measure.log import read_measurements

    pipeline.build([("c", census((WINS, (8, 24, 64))))], opts(cache / "out"), timer=FakeTimer(truth, noise_sigma=0.02, seed=3))
    calls: dict = {}
    for x in read_measurements(cache / "out" / "measurements.jsonl"):
        calls.setdefault(dict(x.env)["run"], []).append(x)
    assert len(calls) >= 3
    for got in calls.values():
        assert len({x.m for x in got}) == 1  # one call times one point
        torch_ = [x for x in got if x.config_id == "torch"]
        if torch_:
            assert len(torch_[0].samples) == max(len(x.samples) for x in got if x.status.ok)


def test_evidence_keeps_what_the_partition_compared(cache):
    """Where the arms paired with torch, the evidence names it ('_stat': 'paired') and keeps each
    arm's paired time, the numbers the runtime's gate checks read (serving.point_times)."""
    from tunedb.runtime import serving

    pipeline.build([("c", census((WINS, (8, 24, 64))))], opts(cache / "out"), timer=FakeTimer(truth, noise_sigma=0.002, seed=1))
    entry = database.load(cache / "out" / "sm90" / "gemm.json", "gemm", "sm90").entries[WINS]
    for key, row in entry.evidence.items():
        arms = [a for a, v in row.items() if not a.startswith("_") and isinstance(v, list)]
        assert row.get("_stat") == "paired" and all(f"_stat:{a}" in row for a in arms), key
        times = serving.point_times(row, *arms)
        assert times == tuple(row[f"_stat:{a}"] for a in arms)
