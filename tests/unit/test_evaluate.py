"""Regret against the measured oracle, on a hand-written log (tests/data/eval/log.jsonl).

The log and the two database files there were written by hand (numbers chosen so every regret
below can be checked on paper), serialized with the package's own log/database writers:
    N=512,K=256  M=16: torch 10us, default 20, b16x32x128 8 (best), b32x64x64 9
                 M=64: torch 10, default 12, b16x32x128 12.5, b32x64x64 8 (best)
    N=1024,K=1024 M=16: torch 20, default 30, b16x32x128 16 (best)
                 M=256: torch 40 (best), default 50, b16x32x128 compile_error
An earlier line gives torch 500us at (N=512, M=16); the later line wins.
new.json: N=512 -> b16x32x128 up to 16, then b32x64x64; N=1024 -> b16x32x128 everywhere.
old.json: N=512 -> torch; no N=1024 entry (the cost model answers there).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tunedb import evaluate, pipeline
from tunedb.cli import main
from tunedb.records import Measurement, Point, ShapeSet, Signature, Status

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"
S1 = Signature.make("gemm", "gemm", "half", N=512, K=256)
S2 = Signature.make("gemm", "gemm", "half", N=1024, K=1024)
DEFAULT_GEO = (2.5 * 1.5 * 1.875 * 1.25) ** 0.25 - 1


def run_eval(censuses=()):
    return pipeline.evaluate_logs([DATA / "log.jsonl"], [("new", DATA / "new.json"), ("old", DATA / "old.json")],
                                  censuses)


def test_hand_checked_regrets():
    ev, regions = run_eval()
    assert [(p.signature, p.m) for p in ev.points] == [(S1, 16), (S1, 64), (S2, 16), (S2, 256)]
    assert [p.best_id for p in ev.points] == ["b16x32x128_w4_s3_g8", "b32x64x64_w4_s3_g8",
                                               "b16x32x128_w4_s3_g8", "torch"]
    d = ev.summary("default")
    assert d.measured == 4 and d.unmeasured == 0
    assert d.geomean == pytest.approx(DEFAULT_GEO)
    assert d.max == pytest.approx(1.5) and d.p95 == pytest.approx(1.5)
    t = ev.summary("torch")
    assert t.geomean == pytest.approx(1.25 ** 0.75 - 1)  # 25% at three points, 0 at one
    assert t.max == pytest.approx(0.25) and t.p95 == pytest.approx(0.25)
    new = ev.summary("new")
    # its pick at (N=1024, M=256) failed to compile: unmeasured, not a number
    assert (new.measured, new.unmeasured) == (3, 1)
    assert new.geomean == pytest.approx(0.0) and new.max == pytest.approx(0.0)
    old = ev.summary("old")
    assert old.measured + old.unmeasured == 4
    at_s1 = [p.picks["old"] for p in ev.points if p.signature == S1]
    assert [k.regret for k in at_s1] == [pytest.approx(0.25), pytest.approx(0.25)]
    cm = ev.summary("cost model")
    assert cm.measured + cm.unmeasured == 4
    # the worst signature of the default selector is N=512 (geomean of 150% and 50%)
    assert d.per_signature[0][0] == S1.format()
    assert d.per_signature[0][1] == pytest.approx(math.sqrt(2.5 * 1.5) - 1)
    assert regions["new"][S1.format()][0].config_id == "b16x32x128_w4_s3_g8"


def test_census_weights_the_geomean():
    census = ShapeSet((Point(S1, 16, weight=3.0), Point(S2, 256, weight=1.0)))
    ev, _ = run_eval([census])
    d = ev.summary("default")
    assert d.weighted == pytest.approx(math.exp((3 * math.log(2.5) + math.log(1.25)) / 4) - 1)
    assert d.geomean == pytest.approx(DEFAULT_GEO)  # the plain geomean is unweighted
    assert ev.summary("torch").weighted == pytest.approx(1.25 ** 0.75 - 1)


def test_default_sentinel_and_its_concrete_config_are_one_arm():
    """A DB naming the family's concrete default config is scored on the 'default' arm's numbers."""
    meas = [Measurement(S1, 16, "default", Status.OK, 0.02), Measurement(S1, 16, "torch", Status.OK, 0.01)]
    ev = evaluate.evaluate(meas, {"db": lambda s, m: "b64x64x64_w4_s3_g8"},
                           equivalents=lambda s, c: ("default",) if c == "b64x64x64_w4_s3_g8" else ())
    pick = ev.points[0].picks["db"]
    assert pick.measured_as == "default" and pick.regret == pytest.approx(1.0)


def test_alpha_counts_host_time_on_eager_points():
    meas = [Measurement(S1, 16, "torch", Status.OK, 0.010, host_us=10.0),
            Measurement(S1, 16, "a", Status.OK, 0.012, host_us=2.0)]
    sel = {"torch": lambda s, m: "torch", "a": lambda s, m: "a"}
    captured = evaluate.evaluate(meas, sel)  # alpha 0: GPU time only, torch is best
    assert captured.points[0].best_id == "torch"
    assert captured.summary("a").geomean == pytest.approx(0.2)
    eager = evaluate.evaluate(meas, sel, alphas={(S1, 16): 1.0})  # 20 us vs 14 us
    assert eager.points[0].best_id == "a"
    assert eager.summary("torch").geomean == pytest.approx(0.020 / 0.014 - 1)


def test_percentile_is_nearest_rank():
    assert evaluate.percentile([0.1 * i for i in range(1, 21)], 95) == pytest.approx(1.9)
    assert evaluate.percentile([], 95) is None


def test_cli_table_json_and_png(tmp_path, capsys):
    png = tmp_path / "eval.png"
    rc = main(["evaluate", "--log", str(DATA / "log.jsonl"), "--db", f"new={DATA / 'new.json'}",
               "--json", "--png", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in out["selectors"]}
    assert by_name["default"]["geomean"] == pytest.approx(DEFAULT_GEO)
    assert by_name["new"]["unmeasured"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["evaluate", "--log", str(DATA / "log.jsonl"), "--db", f"new={DATA / 'new.json'}"]) == 0
    text = capsys.readouterr().out
    assert "regret against the measured oracle" in text and "not measured" in text


def test_cli_rejects_bad_db_argument(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--log", str(DATA / "log.jsonl"), "--db", "no-equals-sign"])
    assert "NAME=PATH" in capsys.readouterr().err
    assert main(["evaluate", "--log", str(DATA / "log.jsonl"), "--db", f"torch={DATA / 'new.json'}"]) == 2
    assert "reserved" in capsys.readouterr().err


def test_plot_draws_a_database(tmp_path, capsys):
    png = tmp_path / "regions.png"
    assert main(["plot", str(DATA / "new.json"), "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "2 signature(s)" in capsys.readouterr().out


def test_thinned_census_weight_counts_at_the_measured_point_above():
    from tunedb.evaluate import carry_weights

    sig = Signature.make("gemm", "gemm", "half", N=512, K=512)
    weights = {(sig, 8): 0.25, (sig, 16): 0.25, (sig, 64): 0.5, (sig, 5000): 0.1}
    got = carry_weights(weights, [(sig, 16), (sig, 64), (sig, 16)])
    assert got == {(sig, 16): 0.5, (sig, 64): 0.5}  # 8 -> 16; 5000 has no measured point above


def test_a_failed_remeasurement_does_not_hide_an_ok_one():
    from tunedb.evaluate import latest
    from tunedb.records import Measurement, Status

    sig = Signature.make("gemm", "gemm", "half", N=512, K=512)
    ok = Measurement(sig, 8, "torch", Status.OK, median_ms=0.01)
    bad = Measurement(sig, 8, "torch", Status.TIMEOUT)
    assert latest([ok, bad])[(sig, 8, "torch")] is ok
    assert latest([bad, ok])[(sig, 8, "torch")] is ok


def test_the_table_says_when_its_oracle_was_simulated(tmp_path, capsys):
    # a --simulate build's log (timer "fake") read as a measured oracle said nothing of it
    assert main(["evaluate", "--log", str(DATA / "log.jsonl"), "--db", f"new={DATA / 'new.json'}"]) == 0
    assert "simulate" not in capsys.readouterr().out
    fake = tmp_path / "log.jsonl"
    lines = []
    for line in (DATA / "log.jsonl").read_text().splitlines():
        row = json.loads(line)
        row.setdefault("env", {})["timer"] = "fake"
        lines.append(json.dumps(row))
    fake.write_text("\n".join(lines) + "\n")
    assert main(["evaluate", "--log", str(fake), "--db", f"new={DATA / 'new.json'}"]) == 0
    assert "--simulate logs (timer 'fake')" in capsys.readouterr().out
