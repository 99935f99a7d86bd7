"""The GEMM cost model's decode regime held out by model (issue 18, item 1), on the CPU from a
recorded H200 build log: how well it prices and ranks the configs at M <= 64.

    python bench/lomo_decode.py [--log LOG.jsonl.gz] [--out JSON]      (or lomo_regret.py --decode-report)

For each preset model W (bench/census), the model is fitted (calibration.fit) on every signature
W's census does not name, and at each of W's measured points with M <= 64 (torch measured there):
  * error: median |log(predicted / measured)| of torch and of the Triton configs,
  * rho top: Spearman rank correlation, over the points, of the predicted and the measured gain
    (log torch / config) of the Triton config predicted fastest (the one the tier would serve),
  * rho all: the same over every measured Triton config at every point (how it orders configs).
Each is shown for the fit as it ships ('decode') and the same fit with its decode term removed
('no decode': the throughput model alone, as before decode_cost.py), in the same run.
Runs in about 10 s.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from costmodel_heldout import DEFAULT_DB, Study  # noqa: E402
from lomo_cli import DEFAULT_LOG, replay_main  # noqa: E402

from tunedb import database, families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import calibration, costmodel, decode_cost  # noqa: E402
from tunedb.measure.log import read_measurements  # noqa: E402
from tunedb.records import SENTINELS, Config, Status  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CENSUS_DIR = ROOT / "bench/census"


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None below 3 pairs or without spread."""
    if len(x) != len(y) or len(x) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                out[order[t]] = (i + j) / 2.0
            i = j + 1
        return out

    a, b = ranks(x), ranks(y)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = sum((p - ma) * (q - mb) for p, q in zip(a, b))
    den = math.sqrt(sum((p - ma) ** 2 for p in a) * sum((q - mb) ** 2 for q in b))
    return num / den if den > 0 else None


def score(study: Study, params: costmodel.ModelParams, points: dict) -> dict[str, Any]:
    """The decode report of one fitted model over `points` ({(sig, m): {config id: measured ms}})."""
    err: dict[str, list[float]] = {"torch": [], "triton": []}
    top_p, top_m, all_p, all_m = [], [], [], []
    for (sig, m), meas in sorted(points.items(), key=lambda kv: (kv[0][0].format(), kv[0][1])):
        preds = {}
        for cid in meas:
            if cid in SENTINELS and cid != "torch":
                continue
            c = Config.sentinel(cid) if cid == "torch" else study.configs[cid]
            p = costmodel.predict(c, (sig, m), study.arch, params, default_config=study.default_of)
            if not isinstance(p, Status) and p > 0:
                preds[cid] = p
        if "torch" not in preds:
            continue
        for cid, p in preds.items():
            err["torch" if cid == "torch" else "triton"].append(abs(math.log(p / meas[cid])))
        triton = {c: p for c, p in preds.items() if c != "torch"}
        if not triton:
            continue
        top = min(triton, key=lambda c: (triton[c], c))
        top_p.append(math.log(preds["torch"] / triton[top]))
        top_m.append(math.log(meas["torch"] / meas[top]))
        for c, p in triton.items():
            all_p.append(math.log(preds["torch"] / p))
            all_m.append(math.log(meas["torch"] / meas[c]))
    med = {k: statistics.median(v) if v else None for k, v in err.items()}
    return {"points": len(top_p), "torch_error": med["torch"], "triton_error": med["triton"],
            "rho_top": spearman(top_p, top_m), "rho_all": spearman(all_p, all_m)}


def run(log: Path, db_path: Path = DEFAULT_DB) -> list[dict[str, Any]]:
    from lomo_regret import models_of

    family = families.get("gemm")
    db = database.load(db_path, "gemm")
    os.environ.setdefault("TUNEDB_COMPILE_SET", "tuned")
    study = Study(read_measurements(log), family, shipped_profile(db.arch_family), db.referenced_config_ids())
    logged = {s.format() for s in study.signatures}
    rows = []
    for workload, named in models_of(CENSUS_DIR).items():
        held = named & logged
        points: dict = {}
        for m in study.latest:
            if m.status.ok and m.m <= decode_cost.DECODE_M and m.signature.format() in held:
                points.setdefault((m.signature, m.m), {})[m.config_id] = m.median_ms
        points = {k: v for k, v in points.items() if "torch" in v}
        if not points:
            continue
        train = [m for m in study.latest if m.status.ok and m.signature.format() not in held]
        params = calibration.fit(train, study.configs, study.arch)
        rows.append({"held_out": workload, "decode_fit": {k: list(v) for k, v in params.decode.items()},
                     "decode": score(study, params, points),
                     "no decode": score(study, dataclasses.replace(params, decode={}), points)})
    return rows


def _f(v: float | None, pct: bool) -> str:
    return "-" if v is None else f"{100 * v:.1f}%" if pct else f"{v:+.2f}"


def print_report(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'held out (M<=64)':18} {'model':10} {'pts':>4} {'torch err':>9} {'triton err':>10} "
          f"{'rho top':>7} {'rho all':>7}")
    for r in rows:
        for name in ("no decode", "decode"):
            s = r[name]
            print(f"{r['held_out']:18} {name:10} {s['points']:>4} {_f(s['torch_error'], True):>9} "
                  f"{_f(s['triton_error'], True):>10} {_f(s['rho_top'], False):>7} {_f(s['rho_all'], False):>7}")
        print(f"{'':18} decode fit: {r['decode_fit'] or 'none (too few decode points)'}")


def main(argv: Sequence[str] | None = None) -> int:
    def report(rows, log):
        print(f"log: {log.name}; fitted on the other models' signatures, scored at the held-out M <= 64 points")
        print_report(rows)

    return replay_main(argv, __doc__, run, report, default_log=DEFAULT_LOG)


if __name__ == "__main__":
    sys.exit(main())
