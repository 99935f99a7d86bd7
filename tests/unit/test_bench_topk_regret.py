"""bench/topk_regret.py on a small synthetic log: the regret of a smaller --top-k is what the
build's own arm choice (buildplan.arms_for_point) would have served from the measured arms."""
from __future__ import annotations

import sys
from pathlib import Path

from tunedb import database, families

from tunedb.build import steps as buildsteps
from tunedb.arch import shipped_profile
from tunedb.measure.log import MeasurementLog
from tunedb.build.plan import arms_for_point
from tunedb.records import Measurement, Provenance, Signature, Status

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import topk_regret  # noqa: E402

sys.path.remove(str(ROOT / "bench"))


def test_a_winner_outside_the_smaller_top_k_costs_its_margin(tmp_path):
    fam, arch = families.get("gemm"), shipped_profile("sm90")
    sig, m = Signature.make("gemm", "gemm", "half", N=4096, K=4096), 64
    db = ROOT / "src/tunedb/db/sm90/gemm.json"
    rankers = buildsteps.rankers(fam, arch, buildsteps.model_params(database.load(db).model))  # analyse()'s
    ranked = [c for c in arms_for_point(fam, sig, m, arch, rankers, top_k=16) if c not in ("default", "torch")]
    top1 = arms_for_point(fam, sig, m, arch, rankers, top_k=1)
    outside = next(c for c in ranked if c not in top1)  # in the top-16, not in the top-1
    times = {c: 1.0 for c in ranked} | {"torch": 0.9, "default": 1.0, outside: 0.6}
    log = tmp_path / "log.jsonl"
    MeasurementLog(log, Provenance(gpu_name="synthetic"), "r").append(
        [Measurement(sig, m, c, Status.OK, median_ms=t, n=5) for c, t in times.items()])
    rows = {r["k"]: r for r in topk_regret.analyse(log, db, [1, 16])}
    assert abs(rows[1]["regret_max"] - (0.9 / 0.6 - 1)) < 1e-9  # torch, always measured, served
    assert rows[16]["regret_max"] == 0.0 and rows[16]["regret_over_1pct"] == 0
    assert abs(rows[1]["gated_max"] - (0.9 / 0.6 - 1)) < 1e-9 and rows[16]["gated_max"] == 0.0
    assert rows[1]["arms_per_point"] < rows[16]["arms_per_point"] and rows[1]["scored"] == 1


def test_the_gate_serves_torch_when_the_best_arm_wins_by_less():
    assert topk_regret.served({"a": 0.97, "torch": 1.0}, 1.0, 1.05) == 1.0
    assert topk_regret.served({"a": 0.90, "torch": 1.0}, 1.0, 1.05) == 0.90
