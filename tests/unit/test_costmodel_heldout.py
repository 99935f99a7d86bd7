"""bench/costmodel_heldout.py and bench/refit_model.py on a small synthetic log (CPU, seconds).

The held-out script must score every selector against the best arm measured at each point, count
a pick that was never measured as unmeasured (never give it a number), and write its JSON and
markdown; the refit script must replace a file's model and nothing else.
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb import database, families

from tunedb.families.gemm import costmodel
from tunedb.arch import shipped_profile
from tunedb.measure.log import MeasurementLog
from tunedb.records import Entry, Measurement, Provenance, Region, Signature, Status

ROOT = Path(__file__).resolve().parents[2]
ARCH = shipped_profile("sm90")
SIGS = [Signature.make("gemm", "gemm", "half", N=n, K=k) for n, k in ((512, 2048), (4096, 4096), (1280, 5120))]
MS = (1, 64, 4096)
IDS = ("b16x64x256_w4_s3_g8", "sk4_b16x64x256_w4_s3", "b64x128x64_w4_s3_g8",
       "tma_b128x256x64_w8_s3_g8", "b128x128x64_w8_s3_g8", "b64x64x64_w4_s3_g8")


@pytest.fixture()
def files(tmp_path):
    fam = families.get("gemm")
    rng = random.Random(5)
    truth = costmodel.ModelParams(scale=1.3)
    meas = []
    for sig in SIGS:
        for m in MS:
            times = {}
            for cid in IDS:
                ms = costmodel.predict(fam.parse_config(cid), (sig, m), ARCH, truth)
                if not isinstance(ms, Status):
                    times[cid] = ms * math.exp(rng.gauss(0, 0.03))
            times["torch"] = min(times.values()) * (0.9 if m >= 4096 else 1.04)
            times["default"] = times[fam.default_config(sig, ARCH).id] * 1.01
            meas += [Measurement(sig, m, cid, Status.OK, median_ms=t, n=5) for cid, t in times.items()]
    log = tmp_path / "log.jsonl"
    MeasurementLog(log, Provenance(gpu_name="synthetic"), "r1").append(meas)
    entry = Entry(SIGS[0], (Region(64, "sk4_b16x64x256_w4_s3"), Region(None, "torch")))
    db = database.write_entries(tmp_path / "gemm.json", "gemm", "sm90", [entry],
                                {IDS[1]: fam.parse_config(IDS[1])}, model={"schema": 1, "scale": 9.0})
    return log, db, meas


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TUNEDB_USER_DB="off", COLUMNS="200")
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_heldout_scores_every_selector_against_the_measured_oracle(files, tmp_path):
    log, db, meas = files
    out, md = tmp_path / "out.json", tmp_path / "BENCH.md"
    res = _run("costmodel_heldout.py", "--log", str(log), "--db", str(db), "--out", str(out), "--md", str(md))
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    points = len(SIGS) * len(MS)
    by_name = {s["name"]: s for s in data["selectors"]}
    for name in ("held-out model (compiled)", "held-out model (compiled+torch)", "held-out model (measured)",
                 "structure (compiled)", "in-sample model (measured)", "default", "torch"):
        assert by_name[name]["measured"] + by_name[name]["unmeasured"] == points
    # Picking among the measured arms can never pick an unmeasured one.
    assert by_name["held-out model (measured)"]["unmeasured"] == 0
    best = {}
    for x in meas:
        key = (x.signature.format(), x.m)
        best[key] = min(best.get(key, math.inf), x.median_ms)
    torch = {(x.signature.format(), x.m): x.median_ms for x in meas if x.config_id == "torch"}
    for p in data["points"]:
        key = (p["signature"], p["M"])
        assert p["picks"]["torch"]["regret"] == pytest.approx(torch[key] / best[key] - 1.0)
        for pick in p["picks"].values():  # unmeasured: no number, ever
            assert (pick["regret"] is None) == (pick["measured_as"] is None)
    assert data["prediction_error"]["uncalibrated"] > 0
    assert len(data["prediction_error"]["per_signature"]) == len(SIGS)
    text = md.read_text()
    assert "cost-model held-out regret" in text and "| held-out model (compiled+torch) |" in text


def test_heldout_refuses_a_missing_log(tmp_path, files):
    _, db, _ = files
    res = _run("costmodel_heldout.py", "--log", str(tmp_path / "nope.jsonl"), "--db", str(db))
    assert res.returncode == 2 and "nope.jsonl" in res.stderr


def test_refit_replaces_only_the_model(files):
    log, db, meas = files
    before = database.load(db, "gemm")
    database.lock_path(db).unlink()  # as in the package data: no lock file beside the shipped file
    res = _run("refit_model.py", "--log", str(log), "--db", str(db))
    assert res.returncode == 0, res.stderr
    after = database.load(db, "gemm")
    assert after.entries == before.entries
    assert after.configs == before.configs and after.validators == before.validators
    model = costmodel.ModelParams.from_json(after.model)
    assert model.fitted_on == len(meas)
    assert "torch" in model.sentinel and model.scale != 9.0
    assert not database.lock_path(db).exists()
