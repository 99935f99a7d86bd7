"""The linalg pick rule on paired rounds (pick.decide_paired, pick.ambiguous, the tune's extra
rounds for an ambiguous cell): the interval, margin, tie band, simplicity order, agreement with
the median rule on clean data, and stability under resampling noise where the median rule flips;
the tune's --pick/--max-rounds/--samples and the CPU replays of recorded logs."""
from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import pytest

from tunedb.errors import TunedbError
from tunedb.families.linalg import cli, ladder, pick
from tunedb.families.linalg.ladder import Cell
from bench_modules import bench_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
THREAD, WARP, BLOCK = "thread_p64_w2", "warp_p8_w4", "block_w4"


def rounds(base: float, ratios: list[float], shared: list[float]) -> list[float]:
    return [base * r * s for r, s in zip(ratios, shared)]


def test_the_order_statistic_interval_covers_the_median_at_the_asked_level():
    assert pick.order_stat_index(9, 0.9) == 1  # [2nd, 8th] of 9: 96.1% coverage; [3rd, 7th] only 82%
    for n in range(5, 40):
        k = pick.order_stat_index(n, 0.9)
        cover = lambda j: 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n  # noqa: E731
        assert cover(k) >= 0.9 and (2 * (k + 2) >= n or cover(k + 1) < 0.9)
    with pytest.raises(ValueError, match="coverage=1.5"):
        pick.order_stat_index(9, 1.5)


def test_pairing_cancels_what_a_round_shares():
    shared = [1.0, 1.2, 0.8, 1.1, 0.9, 1.3, 0.7, 1.05, 0.95]  # a drifting clock: +-30% per round
    lo, mid, hi = pick.ratio_interval(rounds(1.01, [1.0] * 9, shared), rounds(1.0, [1.0] * 9, shared))
    assert lo == pytest.approx(1.01) and mid == pytest.approx(1.01) and hi == pytest.approx(1.01)


def test_a_simpler_arm_shown_within_the_band_takes_the_cell_in_both_tests():
    shared = [1.0 + 0.01 * (i % 3) for i in range(9)]
    got = {BLOCK: rounds(1.0, [1.0] * 9, shared), WARP: rounds(1.015, [1.0] * 9, shared),
           THREAD: rounds(1.03, [1.0] * 9, shared), "torch": rounds(10.0, [1.0] * 9, shared)}
    for tie in pick.TIE_TESTS:
        assert pick.decide_paired(got, tie=tie).winner == WARP  # thread is 3% slower: outside
    got[THREAD] = rounds(1.019, [1.0] * 9, shared)
    assert pick.decide_paired(got, tie="shown").winner == THREAD  # the simplest tied arm
    assert not pick.ambiguous(got)


def test_the_library_arm_keeps_a_cell_it_ties_and_serves_when_nothing_else_ran():
    one = [1.0] * 9
    assert pick.decide_paired({"torch": [1.01] * 9, THREAD: one}).winner == "torch"
    assert pick.decide_paired({"torch": [1.03] * 9, THREAD: one}).winner == THREAD
    got = pick.decide_paired({"torch": None, THREAD: [math.inf] * 9, WARP: []})
    assert got.winner == got.native == "torch" and "fallback" in got.reason


def test_an_arm_straddling_the_band_edge_is_ambiguous_and_the_tests_split():
    shared = [1.0] * 9
    straddle = [1.00, 1.01, 1.015, 1.02, 1.025, 1.03, 1.035, 1.04, 1.045]  # median 1.025
    got = {BLOCK: rounds(1.0, [1.0] * 9, shared), WARP: rounds(1.0, straddle, shared)}
    assert pick.decide_paired(got, tie="plausible").winner == WARP  # not shown beyond the band
    assert pick.decide_paired(got, tie="shown").winner == BLOCK  # not shown within it
    assert pick.ambiguous(got)
    with pytest.raises(ValueError, match="tie='maybe'"):
        pick.decide_paired(got, tie="maybe")


def test_a_dependency_arm_must_be_shown_beyond_the_dependency_margin():
    base = {"torch": [10.0] * 9, WARP: [1.0] * 9}
    assert pick.decide_paired({**base, "nvmath_block": [1.0 / 1.06] * 9}).winner == "nvmath_block"
    assert pick.decide_paired({**base, "nvmath_block": [1.0 / 1.04] * 9}).winner == WARP
    # 6% faster at the median, but two rounds of nine say 2%: not shown beyond 5%
    noisy = [1.0 / r for r in (1.02, 1.02, 1.06, 1.06, 1.06, 1.07, 1.07, 1.08, 1.08)]
    got = pick.decide_paired({**base, "nvmath_block": noisy})
    assert got.winner == got.native == WARP


def test_on_clean_rounds_the_paired_rule_is_the_median_rule():
    rng = random.Random(3)
    arms = ["torch", THREAD, "thread_p32_w1", WARP, "warp_p16_w1", BLOCK, "block_w1"]
    for _ in range(300):
        times = {a: rng.choice([1.0, 1.005, 1.01, 1.03, 1.1]) * rng.uniform(0.98, 1.02) for a in arms}
        shared = [rng.uniform(0.8, 1.2) for _ in range(9)]
        paired = {a: [t * s for s in shared] for a, t in times.items()}
        want = pick.decide(times).winner
        for tie in pick.TIE_TESTS:
            assert pick.decide_paired(paired, tie=tie).winner == want


def edge_cost(cell: Cell, arm: str, warp: float = 1.025) -> float:
    """warp `warp` x block's time (default 2.5%: just beyond the band), torch far behind."""
    return {"torch": 50.0, WARP: warp, BLOCK: 1.0}[arm]


def picks(decide: str, seeds: range, *, noise: float, round_noise: float, max_rounds: int | None = None,
          warp: float = 1.025) -> list[str]:
    cell = Cell("gemm", "fp32", 8, 4096)
    cost = lambda c, a: edge_cost(c, a, warp)  # noqa: E731
    return [ladder.measure_cell(ladder.FakeTimer(cost, noise=noise, round_noise=round_noise, seed=s), cell,
                                ["torch", WARP, BLOCK], decide=decide, max_rounds=max_rounds).pick.winner
            for s in seeds]


def test_a_clock_drifting_between_rounds_does_not_move_the_paired_pick():
    # warp 1% slower than block (inside the band); each round's clock moves every arm by up to
    # 10%, each arm's own noise is 1%: the per-round ratio stays near 1.01, the medians do not
    median = picks("median", range(40), noise=0.01, round_noise=0.10, warp=1.01)
    paired = picks("paired", range(40), noise=0.01, round_noise=0.10, warp=1.01)
    assert set(paired) == {WARP}  # the simpler arm, tied in every draw
    assert set(median) == {BLOCK, WARP}  # medians of drifting rounds land either side of the edge
    # an arm well beyond the band never takes the cell, however the rounds drift
    assert set(picks("paired", range(20), noise=0.02, round_noise=0.05, warp=1.06)) == {BLOCK}


def test_extra_rounds_go_to_an_ambiguous_cell_only_and_stop_at_the_cap():
    cell = Cell("gemm", "fp32", 8, 4096)
    noisy = ladder.FakeTimer(edge_cost, noise=0.03, seed=5)
    got = ladder.measure_cell(noisy, cell, ["torch", WARP, BLOCK], max_rounds=27)
    assert len(got.samples[BLOCK]) in (9, 18, 27) and len({len(v) for v in got.samples.values()}) == 1
    clear = ladder.measure_cell(ladder.FakeTimer(lambda c, a: {"torch": 50.0, WARP: 2.0, BLOCK: 1.0}[a],
                                                 noise=0.03, seed=5), cell, ["torch", WARP, BLOCK], max_rounds=27)
    assert len(clear.samples[BLOCK]) == 9
    rng_cells = [ladder.measure_cell(ladder.FakeTimer(edge_cost, noise=0.03, seed=s), cell, ["torch", WARP, BLOCK],
                                     max_rounds=27) for s in range(12)]
    assert any(len(r.samples[BLOCK]) > 9 for r in rng_cells)  # ambiguous cells did get more rounds
    assert all(len(r.samples[BLOCK]) <= 27 for r in rng_cells)
    with pytest.raises(TunedbError, match="max_rounds=5 is below rounds=9"):
        ladder.measure_cell(noisy, cell, ["torch", BLOCK], max_rounds=5)
    with pytest.raises(TunedbError, match="decide='mean'"):
        ladder.measure_cell(noisy, cell, ["torch", BLOCK], decide="mean")


def test_extra_rounds_make_two_noisy_remeasurements_agree_more_often():
    # warp 4% slower than block (beyond the band), per-arm noise 2%, clock drift 5%: nine
    # rounds leave the warp arm plausibly tied in about half the draws, so two re-measurements
    # split; extra rounds (only while the cell is open, up to 45) settle it beyond the band
    def agreement(decide, max_rounds):
        a = picks(decide, range(0, 40), noise=0.02, round_noise=0.05, max_rounds=max_rounds, warp=1.04)
        b = picks(decide, range(100, 140), noise=0.02, round_noise=0.05, max_rounds=max_rounds, warp=1.04)
        return sum(x == y for x, y in zip(a, b))
    assert agreement("paired", 45) == 40 > agreement("paired", 9)
    assert agreement("paired", 45) > agreement("median", None)


def _args(out: Path, **kw) -> argparse.Namespace:
    base = dict(prebuild=False, quick=True, legs="ladder", ops="gemm,gemv", dtypes=None, margin=None, rounds=9,
                max_arms=4, build_jobs=None, dry_run=False, out=str(out), seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def tune_cost(cell: Cell, arm: str) -> float:
    return 50.0 if arm == "torch" else 1.0 + 0.004 * (sum(map(ord, arm)) % 7)


def test_the_tune_writes_raw_samples_and_records_its_pick_mode(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        args = _args(tmp_path / name / "linalg.json", pick="paired", max_rounds=27,
                     samples=str(tmp_path / f"{name}.jsonl"))
        assert cli.tune(args, timer=ladder.FakeTimer(tune_cost, noise=0.01, seed=seed), arch_family="sm90") == 0
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 4 and {x["op"] for x in lines} == {"gemm", "gemv"}
    assert all(len(v) >= 9 and len(v) % 9 == 0 for x in lines for v in x["samples"].values())
    model = json.loads((tmp_path / "a" / "linalg.json").read_text())["model"]["tune"]["rule"]
    assert model["decide"] == "paired" and model["rounds_max"] == 27
    replay = _bench("linalg_pick_replay")
    rec_a, rec_b = {}, {}
    rows = replay.cross(replay.load(str(tmp_path / "a.jsonl"), recorded=rec_a),
                        replay.load(str(tmp_path / "b.jsonl"), recorded=rec_b), list(replay.RULES), pick.TIE_BAND,
                        (rec_a, rec_b))
    assert all(r["cells"] == 8 and r["same"] + r["moves"] == 8 for r in rows)
    tuned = next(r for r in rows if r["rule"] == "as tuned")  # the tune's own picks, from the files
    assert tuned["cells"] == 8 and tuned["same"] == next(r for r in rows if r["rule"] == "paired-plausible")["same"]
    with pytest.raises(TunedbError, match="--max-rounds 5 is below --rounds 9"):
        cli.tune(_args(tmp_path / "c.json", max_rounds=5), timer=ladder.FakeTimer(tune_cost), arch_family="sm90")


_bench = bench_module


def test_the_replay_of_the_session9_ladders_runs_every_rule(tmp_path):
    replay = _bench("linalg_pick_replay")
    w1 = str(ROOT / "bench/results/2026-12-01_s9_W1_linalg_ladder.json.gz")
    w2 = str(ROOT / "bench/results/2026-12-01_s9_W2_linalg_quick.json.gz")
    out = tmp_path / "cross.json"
    assert replay.main(["cross", w1, w2, "--ops", "gemm,gemv", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    for which in ("native", "served"):  # both by default: the served pick is the full winner
        assert [r["rule"] for r in rows if r["picks"] == which] == list(replay.RULES)
    assert all(r["cells"] == 32 for r in rows)
    got = replay.resample(replay.load(w2), ["paired-shown"], pick.TIE_BAND, draws=2, seed=0, rounds=9, max_rounds=18)
    assert got[0]["cells"] == 64 and 0.0 <= got[0]["agree"] <= 1.0


def test_the_gate_noise_held_out_replay_reads_every_group(tmp_path):
    held = _bench("gate_noise_heldout")
    out = tmp_path / "held.json"
    assert held.main(["--gate-noise", "0,0.06", "--groups", "llama tune", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["gate_noise"] for r in rows] == [0.0, 0.06] and rows[0]["points"] == 15
    assert rows[1]["served_mean"] <= rows[0]["served_mean"]  # a stricter gate serves torch more often
    with pytest.raises(SystemExit, match="unknown group"):
        held.main(["--groups", "nope"])


def test_a_table_without_raw_samples_flags_the_cells_its_sigmas_leave_open(tmp_path):
    replay = _bench("linalg_pick_replay")
    ev = lambda warp_ms, warp_sigma: {"M=256": {"torch": [0.01, 1e-5, 9], BLOCK: [0.001, 1e-6, 9],  # noqa: E731
                                                WARP: [warp_ms, warp_sigma, 9]}}
    table = {"entries": {"linalg|op=gemm|dt=fp32|n=8": {"evidence": ev(0.00102, 0.00003)},   # 2.0% +- 1.5%
                         "linalg|op=gemm|dt=fp32|n=16": {"evidence": ev(0.00101, 0.000001)},  # 1.0% +- 0.05%
                         "linalg|op=gemm|dt=fp32|n=32": {"evidence": ev(0.00110, 0.00003)}}}  # 10%
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    total, amb = replay.table_ambiguous(str(path))
    assert total == 3 and amb == {("gemm", "fp32", 8, 256)}


def test_the_replay_compares_the_served_picks_where_the_native_ones_agree(tmp_path):
    """Session 25: two tunes agreed on 215 of 216 native picks while the CUDA tier's picks, which
    serve wherever NVRTC runs, moved in nine cells; the replay reports both."""
    replay = _bench("linalg_pick_replay")
    def run(name: str, fast: str) -> str:
        slow = "cuda_p4_w2" if fast == "cuda_p2_w1" else "cuda_p2_w1"
        rec = {"op": "potrf", "dt": "fp32", "n": 16, "batch": 65536, "native": "block_w1", "winner": fast,
               "samples": {"torch": [9.0] * 9, "block_w1": [3.0] * 9, fast: [1.0] * 9, slow: [1.3] * 9}}
        path = tmp_path / name
        path.write_text(json.dumps(rec) + "\n")
        return str(path)
    out = tmp_path / "cross.json"
    assert replay.main(["cross", run("a.jsonl", "cuda_p2_w1"), run("b.jsonl", "cuda_p4_w2"),
                        "--rules", "low", "--out", str(out)]) == 0
    rows = {(r["picks"], r["rule"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows[("native", "low")]["same"] == rows[("native", "as tuned")]["same"] == 1
    assert rows[("served", "low")]["same"] == rows[("served", "as tuned")]["same"] == 0
    move = rows[("served", "as tuned")]["move_list"][0]
    assert (move["a"], move["b"]) == ("cuda_p2_w1", "cuda_p4_w2") and move["regret"] > move["band"]
    assert rows[("served", "as tuned")]["edge_ties"] == 0  # 30% apart in both runs: no tie flip
