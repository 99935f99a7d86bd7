"""The partitioner on hand-built tables: regions, the gate, rounding up, thinning, the plan."""
import pytest

from tunedb.errors import BuildError
from tunedb.build.partition import cross_eval_plan, objective_table, partition, set_cover, thin
from tunedb.families.contract import PickRule
from tunedb.records import Entry, Measurement, Point, Region, Signature, Status

SIG = Signature.make("gemm", "gemm", "half", N=512, K=512)


def pts(*ms, weight=1.0, must=()):
    return [Point(SIG, m, weight=weight, calls=1, must_tune=m in must) for m in ms]


def table_from(rows):
    """rows: {config: {M: ms}} -> {(M, config): ms}"""
    return {(m, c): t for c, by_m in rows.items() for m, t in by_m.items()}


def test_two_regimes_and_catch_all():
    ms = (16, 64, 256, 1024, 4096)
    tab = table_from({
        "torch": {m: 2.0 for m in ms},
        "small": {16: 1.0, 64: 1.0, 256: 1.0, 1024: 3.0, 4096: 3.0},
        "large": {16: 3.0, 64: 3.0, 256: 3.0, 1024: 1.0, 4096: 1.0},
    })
    part = partition(pts(*ms), tab, fallback="torch")
    assert part.regions == (Region(256, "small"), Region(4096, "large"), Region(None, "torch"))
    assert set(part.chosen) == {"small", "large"}
    entry = Entry(SIG, part.regions)
    assert [entry.lookup(m) for m in ms] == ["small"] * 3 + ["large"] * 2
    # Regions round up: above the largest measured M, the fallback serves, never a tile.
    assert entry.lookup(4097) == "torch"
    # Without a catch-all (autotune), the last region ends at the largest measured M.
    part = partition(pts(*ms), tab, fallback="torch", catch_all=False)
    assert part.regions == (Region(256, "small"), Region(4096, "large"))


def test_gate_keeps_the_fallback_for_small_wins():
    ms = (16, 64, 256)
    tab = table_from({"torch": {m: 1.04 for m in ms}, "tile": {m: 1.0 for m in ms}})
    part = partition(pts(*ms), tab, fallback="torch", min_speedup=1.05)
    assert part.regions == (Region(None, "torch"),)
    assert any("kept torch" in n for n in part.notes)
    part = partition(pts(*ms), tab, fallback="torch", min_speedup=1.035)
    assert part.regions == (Region(256, "tile"), Region(None, "torch"))


def test_gate_is_weighted_over_the_region():
    ms = (16, 64)
    # 'tile' wins big at the heavy point and loses a little at the light one: the region keeps it.
    tab = table_from({"torch": {16: 2.0, 64: 1.0}, "tile": {16: 1.0, 64: 1.02}})
    points = [Point(SIG, 16, weight=0.9), Point(SIG, 64, weight=0.1)]
    part = partition(points, tab, fallback="torch")
    assert part.regions[0].config_id == "tile"


def test_simpler_arm_wins_inside_the_tie_band():
    ms = (16, 64)
    tab = table_from({"torch": {16: 1.01, 64: 1.01}, "b64": {16: 1.0, 64: 1.0}, "a32": {16: 1.0, 64: 1.0}})
    assert set_cover(ms, tab, {16: 1.0, 64: 1.0}, PickRule()) == ("torch",)


def test_unmeasured_points_are_noted_not_partitioned():
    tab = table_from({"torch": {16: 1.0}})
    part = partition(pts(16, 32), tab, fallback="torch")
    assert part.regions == (Region(None, "torch"),)
    assert any("M=32" in n for n in part.notes)
    assert partition(pts(16), {}, catch_all=False).regions == ()


def test_notes_mark_must_tune_points():
    tab = table_from({"torch": {16: 2.0}, "tile": {16: 1.0}})
    part = partition(pts(16, must=(16,)), tab, fallback="torch")
    assert "M=16*: tile (2.00x vs torch)" in part.notes


@pytest.mark.parametrize("bad", [float("inf"), -1.0, 0.0, float("nan")])
def test_bad_objectives_are_refused(bad):
    with pytest.raises(BuildError, match="objective at M=16"):
        partition(pts(16), {(16, "torch"): bad})


def test_bad_flags_are_refused():
    with pytest.raises(BuildError, match="min_speedup"):
        partition(pts(16), {(16, "torch"): 1.0}, min_speedup=0.9)
    other = Signature.make("gemm", "gemm", "half", N=64, K=64)
    with pytest.raises(BuildError, match="one signature"):
        partition(pts(16) + [Point(other, 16)], {(16, "torch"): 1.0})


def test_objective_table_adds_host_time_by_alpha():
    ok = Measurement(SIG, 16, "torch", Status.OK, median_ms=0.010, host_us=4.0)
    bad = Measurement(SIG, 16, "tile", Status.INCORRECT)
    assert objective_table([ok, bad], {16: 0.0}) == {(16, "torch"): 0.010}
    assert objective_table([ok, bad], {16: 1.0})[(16, "torch")] == pytest.approx(0.014)


def _timed(cid, samples, run, m=16, host_us=0.0):
    med = sorted(samples)[len(samples) // 2]
    return Measurement(SIG, m, cid, Status.OK, median_ms=med, n=len(samples), samples=tuple(samples),
                       host_us=host_us, env=(("run", run),))


def test_a_level_shift_mid_call_does_not_make_an_arm_look_faster():
    """The GPU's level doubles after round 3; the tile is halved away after 5 rounds, torch runs
    on: their medians, taken apart, make the tile look 2x faster; paired rounds say 0.9x."""
    torch_ = _timed("torch", [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], "a")
    tile = _timed("tile", [0.9, 0.9, 0.9, 1.8, 1.8], "a")
    unpaired = objective_table([torch_, tile], 0.0)
    assert unpaired[(16, "tile")] / unpaired[(16, "torch")] == pytest.approx(0.45)
    paired = objective_table([torch_, tile], 0.0, reference="torch")
    assert paired[(16, "tile")] / paired[(16, "torch")] == pytest.approx(0.9)


def test_cross_arms_pair_with_the_reference_timed_in_their_own_call():
    first = [_timed("torch", [1.0] * 5, "a"), _timed("tile", [1.1] * 5, "a")]
    cross = [_timed("other", [1.5] * 5, "b", host_us=10.0), _timed("torch", [1.6] * 5, "b")]  # a slower call
    table = objective_table(first + cross, {16: 0.5}, reference="torch")
    level = (1.0 + 1.6) / 2  # the reference's level: the median of its calls' medians
    assert table[(16, "torch")] == pytest.approx(level)
    assert table[(16, "tile")] == pytest.approx(1.1 * level)
    assert table[(16, "other")] == pytest.approx(1.5 / 1.6 * level + 0.5 * 0.010)  # host time still added
    orphan = _timed("lone", [0.7] * 5, "c")  # no reference in its call: its own median
    assert objective_table(first + [orphan], 0.0, reference="torch")[(16, "lone")] == pytest.approx(0.7)
    short = _timed("brief", [0.5, 0.5], "a")  # fewer shared rounds than PAIRED_MIN_ROUNDS: its median
    assert objective_table(first + [short], 0.0, reference="torch")[(16, "brief")] == pytest.approx(0.5)


def test_evidence_without_call_ids_keeps_medians():
    """Logs from before call ids (session 32) pair nothing: no point claims a paired statistic."""
    from tunedb.build.partition import paired_points
    from tunedb.build.signature_steps import evidence

    old = [Measurement(SIG, 16, "torch", Status.OK, median_ms=0.010, n=5, samples=(0.01,) * 5),
           Measurement(SIG, 16, "tile", Status.OK, median_ms=0.008, n=5, samples=(0.008,) * 5)]
    assert 16 not in paired_points(old, "torch")
    row = evidence(old, {"torch", "tile"}, {})["M=16"]
    assert "_stat" not in row and not any(k.startswith("_stat:") for k in row)


def test_cross_eval_plan():
    ranked = {16: ["a", "b", "c", "d"], 64: ["e", "a"]}
    plan = cross_eval_plan(pts(16, 64), ranked, top=3)
    assert plan == ((16, "e"), (64, "b"), (64, "c"))
    assert cross_eval_plan(pts(16, 64), ranked, top=3, measured=[(16, "e")]) == ((64, "b"), (64, "c"))


def test_thin_moves_weight_to_the_next_kept_point_above():
    ms = [8, 9, 10, 11, 12, 100, 101, 1000]
    points = [Point(SIG, m, weight=1.0, calls=2, must_tune=(m == 9)) for m in ms]
    points[3] = Point(SIG, 11, weight=5.0, calls=2)  # heaviest of the low bin
    kept = thin(points, 3)
    assert [p.m for p in kept] == [8, 11, 1000]
    by_m = {p.m: p for p in kept}
    assert by_m[8].weight == 1.0 and by_m[8].calls == 2
    # 9 and 10 move into 11 (9 brings must-tune); 12, 100, 101 move into 1000.
    assert by_m[11].weight == 7.0 and by_m[11].calls == 6 and by_m[11].must_tune
    assert by_m[1000].weight == 4.0 and by_m[1000].calls == 8 and not by_m[1000].must_tune
    assert sum(p.weight for p in kept) == sum(p.weight for p in points)
    assert thin(points, 20) == tuple(sorted(points, key=lambda p: p.m))
    with pytest.raises(BuildError, match="max-points"):
        thin(points, 1)


def test_thin_to_two_points_keeps_only_the_ends():
    out = thin(pts(8, 64, 512, 4096), 2)
    assert [p.m for p in out] == [8, 4096]
    assert out[-1].weight == 3.0  # the dropped points' weight moved up to the next kept point


SPEC003 = PickRule(fallback="block", min_speedup=1.0, tie_band=0.02, dep_margin=0.05,
                   simplicity={"thread": 0, "warp": 1, "block": 2, "nv": 3}.__getitem__,
                   dependency=lambda c: "mathdx" if c == "nv" else None)


def test_spec003_rule_dependency_margin_tie_band_and_native_regions():
    # M=16: nv 4% ahead of the best native (inside the 5% margin), thread within 2% of warp;
    # M=64 and M=128: nv 10%+ ahead: it takes those points
    tab = table_from({"thread": {16: 1.015, 64: 2.0, 128: 4.0}, "warp": {16: 1.0, 64: 1.0, 128: 2.0},
                      "block": {16: 1.1, 64: 1.1, 128: 1.5}, "nv": {16: 1.0 / 1.04, 64: 0.9, 128: 1.3}})
    part = partition(pts(16, 64, 128), tab, SPEC003)
    assert [(r.m_hi, r.config_id) for r in part.regions] == [(16, "thread"), (128, "nv"), (None, "block")]
    # natives alone: warp is inside the band at 16 and best at 64, so one region serves both
    assert [(r.m_hi, r.config_id) for r in part.regions_native] == [(64, "warp"), (None, "block")]


def test_no_dependency_arms_means_no_native_regions():
    tab = table_from({"torch": {16: 1.0}, "b64": {16: 0.5}})
    assert partition(pts(16), tab).regions_native is None


def test_peers_serve_the_faster_and_set_the_gate():
    """rule.peers (conv: cuDNN's autotuner beside torch's default): the faster of the fallback's
    group serves a region, and another arm must beat that faster one by min_speedup."""
    rule = PickRule(fallback="torch", peers=("bench",))
    ms = (16, 64, 256)
    # the peer 1.5% faster: inside the tie band, where the simpler fallback used to stay
    tab = table_from({"torch": {m: 1.0 for m in ms}, "bench": {m: 0.985 for m in ms}})
    part = partition(pts(*ms), tab, rule)
    assert part.regions == (Region(256, "bench"), Region(None, "torch"))  # above: the fallback
    assert any("gave way to its peer bench" in n for n in part.notes)
    # a tile 1.07x over torch but 1.04x over the faster peer: the peer serves
    tab = table_from({"torch": {m: 1.0 for m in ms}, "bench": {m: 0.97 for m in ms},
                      "tile": {m: 0.97 / 1.04 for m in ms}})
    part = partition(pts(*ms), tab, rule)
    assert part.regions == (Region(256, "bench"), Region(None, "torch"))
    assert any("kept bench" in n for n in part.notes)
    # a tile beating both by the gate serves; the fallback faster than its peer keeps its regions
    tab = table_from({"torch": {16: 0.9, 64: 1.0, 256: 1.0}, "bench": {16: 1.0, 64: 1.0, 256: 1.01},
                      "tile": {16: 2.0, 64: 0.9, 256: 0.9}})
    part = partition(pts(*ms), tab, rule)
    assert part.regions == (Region(16, "torch"), Region(256, "tile"), Region(None, "torch"))
    # a peer not measured at every point of the region is no reference there
    tab = table_from({"torch": {m: 1.0 for m in ms}, "bench": {16: 0.99}})
    assert partition(pts(*ms), tab, rule).regions == (Region(None, "torch"),)


def test_gate_noise_asks_more_of_a_one_point_win_than_of_a_region():
    # "lone" wins by 8% at one point; "wide" by 6% over four; torch everywhere else
    ms = (1, 2, 4, 8, 16, 32, 64)
    tab = table_from({
        "torch": {m: 1.0 for m in ms},
        "wide": {1: 1 / 1.06, 2: 1 / 1.06, 4: 1 / 1.06, 8: 1 / 1.06, 16: 1.2, 32: 1.2, 64: 1.2},
        "lone": {1: 1.2, 2: 1.2, 4: 1.2, 8: 1.2, 16: 1.2, 32: 1 / 1.08, 64: 1.2},
    })
    plain = PickRule(fallback="torch", min_speedup=1.05)
    assert partition(pts(*ms), tab, plain).regions == (
        Region(8, "wide"), Region(16, "torch"), Region(32, "lone"), Region(None, "torch"))
    # 0.06: one point must clear 1.05 x 1.06 = 1.113 (lone's 1.08 fails), four 1.05 x 1.03 = 1.0815
    # (wide's 1.06 fails too); 0.01: one point 1.0605 (lone passes), four 1.0553 (wide passes);
    # 0.04: one point 1.092 (lone fails), four 1.071 (wide fails)
    stable = PickRule(fallback="torch", min_speedup=1.05, gate_noise=0.06)
    assert partition(pts(*ms), tab, stable).regions == (Region(None, "torch"),)
    loose = PickRule(fallback="torch", min_speedup=1.05, gate_noise=0.01)
    assert partition(pts(*ms), tab, loose).regions == (
        Region(8, "wide"), Region(16, "torch"), Region(32, "lone"), Region(None, "torch"))
    tighter = PickRule(fallback="torch", min_speedup=1.05, gate_noise=0.04)
    assert partition(pts(*ms), tab, tighter).regions == (Region(None, "torch"),)
    # 0.04 with wide at 1.075: four points need 1.071 (wide passes) while one needs 1.092 (lone's
    # 1.08, the larger win, fails): the gate shrinks with the points a region rests on
    tab = table_from({"torch": {m: 1.0 for m in ms}, "wide": {m: 1 / 1.075 if m <= 8 else 1.2 for m in ms},
                      "lone": {m: 1 / 1.08 if m == 32 else 1.2 for m in ms}})
    assert partition(pts(*ms), tab, tighter).regions == (Region(8, "wide"), Region(None, "torch"))
    with pytest.raises(ValueError, match="gate_noise=1.5 must be in"):
        PickRule(gate_noise=1.5)


def test_gate_noise_option_reaches_the_build_rule():
    from tunedb import families, pipeline
    from tunedb.build import steps as buildsteps

    rule = buildsteps.pick_rule(families.get("gemm"), None, 0.06)
    assert rule.gate_noise == 0.06 and rule.min_speedup == buildsteps.pick_rule(families.get("gemm")).min_speedup
    opts = pipeline.BuildOptions(out="/nonexistent", simulate=True, gate_noise=-0.1)
    with pytest.raises(BuildError, match="--gate-noise=-0.1 must be in"):
        buildsteps.check_options(opts, gpu=False)


def test_gate_noise_counts_a_region_by_where_its_traffic_is():
    from tunedb.build.partition import effective_points

    assert effective_points([1, 2, 3, 4], {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}) == pytest.approx(4.0)
    assert effective_points([1, 2, 3, 4], {1: 100.0, 2: 0.01, 3: 0.01, 4: 0.01}) == pytest.approx(1.0, abs=0.01)
    rule = PickRule(fallback="torch", min_speedup=1.05, gate_noise=0.06)
    assert rule.required(4.0) == pytest.approx(1.05 * 1.03) and rule.required(1.0) == pytest.approx(1.05 * 1.06)
    # four points, 9% faster (clears 1.0815), but all the traffic on one: it must clear 1.113
    ms = (1, 2, 3, 4)
    tab = table_from({"torch": {m: 1.0 for m in ms}, "cfg": {m: 1 / 1.09 for m in ms}})
    even = [Point(SIG, m, weight=1.0, calls=1) for m in ms]
    skewed = [Point(SIG, m, weight=100.0 if m == 2 else 0.01, calls=1) for m in ms]
    assert partition(even, tab, rule).regions == (Region(4, "cfg"), Region(None, "torch"))
    assert partition(skewed, tab, rule).regions == (Region(None, "torch"),)


def test_a_one_point_pick_clears_the_same_gate_a_one_point_region_does():
    rule = PickRule(fallback="torch", min_speedup=1.05, gate_noise=0.06)
    times = {"torch": 1.0, "cfg": 1 / 1.08}  # 1.08x: past 1.05, short of 1.05 x 1.06
    assert rule.gate("cfg", times["cfg"], times)[0] == "torch"
    assert rule.pick(times).winner == "torch"
    assert PickRule(fallback="torch", min_speedup=1.05).pick(times).winner == "cfg"
