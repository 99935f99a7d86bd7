"""Block-scaled fp8's candidate rule (pruning.py): a build measures the pruning model's top-k plus
the BLOCK_SEEDS of the point's size class that the validity predicate accepts, whatever k; the
seeds are what bench/fp8_block_seeds.py derives from the recorded build (greedy cover of the
near-best configs per size class), and only block-scaled signatures get them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.build import plan as buildplan
from tunedb.build import steps as buildsteps
from tunedb.families.scaled_mm import configs, pruning
from tunedb.families.scaled_mm.pruning import BLOCK_SEEDS, PruningModel, seed_class

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_modules import bench_module  # noqa: E402

SM90 = shipped_profile("sm90")
FAM = families.get("scaled_mm_fp8")
ROOT = Path(__file__).resolve().parents[2]


def sig(n=4096, k=4096, scale="block"):
    return FAM.make_signature("scaled_mm", n, k, "bf16", scale)


def valid(s, m):
    return [c for c in FAM.candidates(s, m, SM90) if not c.is_sentinel]


@pytest.fixture(scope="module")
def seeds_bench():
    return bench_module("fp8_block_seeds")


@pytest.mark.parametrize("n,k", [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
                                 (5120, 1280)])
@pytest.mark.parametrize("m", [1, 16, 2048])
def test_every_valid_seed_is_measured_whatever_k(n, k, m):
    s = sig(n, k)
    cands = valid(s, m)
    ids = {c.id for c in cands}
    want = [c for c in BLOCK_SEEDS[seed_class(m)] if c in ids]
    assert want, "each size class has seeds valid at the census widths"
    ranked = PruningModel(SM90).rank(s, m, cands, 1)
    assert set(want) <= set(ranked)
    assert set(ranked) <= ids | {"heuristic", "torch"}  # nothing the predicate rejected


def test_the_predicate_stays_the_only_filter():
    s = sig()
    # decode seeds never reach a point above the decode sizes: the predicate rejects them there
    at2048 = PruningModel(SM90).rank(s, 2048, valid(s, 2048), 1)
    assert not any(c.startswith("dk") for c in at2048)
    assert "b64x128x128_w4_s4_g8" in at2048
    # a seed missing from the candidates (rejected at this point) is not added back
    cands = [c for c in valid(s, 1) if c.id != "dk8_n64x128_w4_s6"]
    assert "dk8_n64x128_w4_s6" not in PruningModel(SM90).rank(s, 1, cands, 1)


def test_only_block_scales_get_seeds():
    s = sig(scale="row")
    ranked = PruningModel(SM90).rank(s, 2048, valid(s, 2048), 1)
    assert "b64x128x128_w4_s4_g8" not in ranked  # its rank under row scales is far below 1
    assert pruning.block_seeds(s, 2048, valid(s, 2048)) == []


def test_the_build_plan_measures_the_seeds():
    s = sig(14336, 4096)
    ranks = buildsteps.rankers(FAM, SM90, None)
    for m in (1, 2048):
        arms = buildplan.arms_for_point(FAM, s, m, SM90, ranks, top_k=8)
        assert set(pruning.block_seeds(s, m, valid(s, m))) <= set(arms)
        assert arms[-1] == "heuristic"  # the forced sentinel still closes the plan
    # top-8 alone left out the tile that won this point by 1.28x (session 13 A2)
    top8 = PruningModel(SM90).rank(s, 2048, valid(s, 2048), 8)
    with_seeds = set(top8)
    saved = pruning.BLOCK_SEEDS
    try:
        pruning.BLOCK_SEEDS = {"decode": (), "prefill": ()}
        assert "b64x128x128_w4_s4_g8" not in PruningModel(SM90).rank(s, 2048, valid(s, 2048), 8)
    finally:
        pruning.BLOCK_SEEDS = saved
    assert "b64x128x128_w4_s4_g8" in with_seeds


def test_seeds_are_the_cover_of_the_recorded_build(seeds_bench):
    times = seeds_bench.read_times(seeds_bench.LOG)
    assert len(times) == 14
    sweep = seeds_bench.read_sweep(seeds_bench.SWEEP)
    assert len(sweep) == 14
    exh = seeds_bench.read_times(seeds_bench.EXH)
    assert len(exh) == 14
    exh_gv = seeds_bench.read_times(seeds_bench.EXH_GV)
    assert len(exh_gv) == 6
    assert (seeds_bench.derive(times, sweep=sweep, exh=exh, exh_gv=exh_gv)
            == {k: tuple(v) for k, v in BLOCK_SEEDS.items()})
    assert seeds_bench.derive(times, sweep=sweep, exh=exh)["decode"] == BLOCK_SEEDS["decode"][:14]
    # each sweep only extends the cover before it
    assert seeds_bench.derive(times)["decode"] == BLOCK_SEEDS["decode"][:7]
    assert seeds_bench.derive(times, sweep=sweep)["decode"] == BLOCK_SEEDS["decode"][:10]
    # the protocol sweep's cover is tighter: every point has a seed within 2% of its best
    for p, t in list(exh.items()) + list(exh_gv.items()):
        best = min(t.values())
        assert any(t.get(c, float("inf")) <= 1.02 * best for c in BLOCK_SEEDS[seed_class(p[2])]), p
    # the cover's promise: every recorded point has a seed within 3% of its best
    for p, t in times.items():
        best = min(t.values())
        assert any(t.get(c, float("inf")) <= 1.03 * best for c in BLOCK_SEEDS[seed_class(p[2])]), p
    for p, t in sweep.items():
        best = min(t.values())
        assert any(t.get(c, float("inf")) <= 1.03 * best for c in BLOCK_SEEDS[seed_class(p[2])]), p


def test_cover_is_a_greedy_cover(seeds_bench):
    pts = {(1, 1, 1): {"a": 1.0, "b": 1.01, "c": 2.0},
           (2, 2, 1): {"a": 1.0, "c": 1.02},
           (3, 3, 1): {"b": 1.0, "c": 1.5},
           (4, 4, 1): {"d": 1.0, "a": 1.2}}
    out = seeds_bench.cover(pts)
    assert out[0] == "a"  # near-best at two points, nearest on the points left
    covered = {p for p in pts for c in out if c in seeds_bench.near(pts[p])}
    assert covered == set(pts) and len(out) == 3


def test_size_classes_follow_the_decode_lane():
    assert seed_class(1) == seed_class(configs.DECODE_MAX_M) == "decode"
    assert seed_class(configs.DECODE_MAX_M + 1) == seed_class(2048) == "prefill"


@pytest.fixture(scope="module")
def exhaustive_bench():
    return bench_module("fp8_block_exhaustive")


def test_the_exhaustive_bench_sweeps_the_whole_valid_space(exhaustive_bench):
    pts = exhaustive_bench.census_points(exhaustive_bench.CENSUS)
    assert len(pts) == 14 and (128256, 4096, 1) in pts and (14336, 4096, 2048) in pts
    space = set(exhaustive_bench.block_space())
    for m in (1, 16, 2048):
        assert {c.id for c in valid(sig(14336, 4096), m)} <= space
    assert set(BLOCK_SEEDS["decode"]) | set(BLOCK_SEEDS["prefill"]) <= space


def test_the_verdict_names_why_a_pick_misses(exhaustive_bench):
    v = {"table_vs_best": 1.10, "best": "dk8_n64x128_w4_s6_pdl", "table_pick": "sk4_b16x128x128_w4_s4"}
    assert exhaustive_bench.cause(v, {"sk4_b16x128x128_w4_s4": 10.0}) == "not a candidate of the build"
    both = exhaustive_bench.cause(v, {"sk4_b16x128x128_w4_s4": 10.0, "dk8_n64x128_w4_s6_pdl": 10.5})
    assert "timing disagree" in both and "10.5" in both
    assert exhaustive_bench.cause(dict(v, table_vs_best=1.02), {}) == "within 3%"
    built = exhaustive_bench.build_times(seeds_log())
    assert built[(4096, 4096, 1)]["sk4_b16x128x128_w4_s4"] == pytest.approx(9.52, abs=0.01)
    assert "heuristic" in built[(4096, 4096, 1)]


def seeds_log():
    return ROOT / "bench" / "results" / "s13_F" / "block_measurements.jsonl.gz"


@pytest.mark.parametrize("n,k", [(4096, 4096), (1024, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [1, 16])
def test_a_seed_brings_its_pdl_twin(n, k, m):
    s = sig(n, k)
    ids = {c.id for c in valid(s, m)}
    ranked = set(PruningModel(SM90).rank(s, m, valid(s, m), 1))
    pdl_seeds = [c for c in BLOCK_SEEDS["decode"] if c.endswith("_pdl") and c[:-4] in ids]
    plain_seeds = [c for c in BLOCK_SEEDS["decode"] if c.startswith("dk") and not c.endswith("_pdl")
                   and c + "_pdl" in ids]
    assert pdl_seeds and plain_seeds
    assert {c[:-4] for c in pdl_seeds} <= ranked  # dk8_n32x128_w4_s6_pdl brings dk8_n32x128_w4_s6
    assert {c + "_pdl" for c in plain_seeds} <= ranked
    # a twin the predicate rejects stays out: none on a row-scaled signature either
    assert pruning.block_seeds(sig(n, k, "row"), m, valid(sig(n, k, "row"), m)) == []


def test_the_protocol_sweep_is_covered_by_the_seeds_and_their_twins(seeds_bench):
    """Session 14 E measured every block-valid config at every census point through the build's
    protocol: every point has a seed or a seed's PDL twin within 3% of its best."""
    sweep = seeds_bench.read_times(ROOT / "bench" / "results" / "s14_E" / "fp8_block_exh_measurements.jsonl.gz")
    assert len(sweep) == 14
    for p, t in sweep.items():
        best = min(t.values())
        seeds = set(BLOCK_SEEDS[seed_class(p[2])])
        seeds |= {pruning._pdl_twin(c) for c in seeds}
        assert any(t.get(c, float("inf")) <= 1.03 * best for c in seeds), p
    # session 14's seeds alone (no twins) left the 4 MB width's M=16 point out: their twins covered it
    p = (1024, 4096, 16)
    assert not any(sweep[p].get(c, float("inf")) <= 1.03 * min(sweep[p].values()) for c in BLOCK_SEEDS["decode"][:10])


def test_score_reads_a_table_against_an_exhaustive_log(seeds_bench, tmp_path):
    """`fp8_block_seeds.py --score`: the shipped table's block picks at the decode points against
    session 16 F's exhaustive log (every valid config, the gv tensor-core path included, so every
    pick is measured there; heuristic / table over the goal's 1.3x), and a table serving a config
    the log never measured says so instead of scoring it."""
    log = seeds_bench.EXH_GV
    table = ROOT / "src" / "tunedb" / "db" / "sm90" / "scaled_mm_fp8.json"
    res = seeds_bench.score(table, log)
    assert len(res["rows"]) == 6 and res["unmeasured_picks"] == 0
    assert 1.0 <= res["worst"] and res["heuristic_vs_table"] > 1.3
    import json
    doc = json.loads(table.read_text())
    key = "scaled_mm_fp8|op=scaled_mm|dt=fp8|N=4096|K=4096|scale=block|out=bf16"
    doc["entries"][key]["regions"] = [[None, "b16x16x16_w1_s1_g1"]]  # nothing the log holds
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps(doc))
    assert seeds_bench.score(bad, log)["unmeasured_picks"] == 2
