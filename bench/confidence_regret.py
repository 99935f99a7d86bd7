"""Held-out regret of the GEMM model tier with and without its confidence rule (issue 18), on the CPU
from recorded measurement logs.

    python bench/confidence_regret.py [--log LOG.jsonl[.gz] ...] [--pool measured|compiled+torch] [--out JSON]

Leave-one-signature-out, as a user's unmeasured shape is: for each signature S of a log, the model
is fitted (calibration.fit) on every OTHER signature, and its error bands are calibrated on those
same signatures (calibration.with_bands: leave-one-signature-out inside the training set, so S
never informs its own band). At each of S's points the model tier then picks among the pool
(`measured`: every arm measured at the point, torch included -- on an exhaustive-oracle log every
valid config; `compiled+torch`: the runtime's compile set plus torch) by
  * rule: confidence.serve (a config only beyond its regime's band, else torch),
  * margin only: the rule before issue 18 (a config when predicted > torch_margin faster),
and both are scored with always-torch against the best measured arm (tunedb.evaluate).
Runs in a few seconds per log. Default log: the H200 exhaustive oracle of whisper-base.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from costmodel_heldout import DEFAULT_DB, Study  # noqa: E402

from tunedb import database, families  # noqa: E402
from tunedb import evaluate as evaluation  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import calibration, costmodel  # noqa: E402
from tunedb.measure.log import read_measurements  # noqa: E402
from tunedb.records import Signature  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOG = ROOT / "bench/results/h200_oracle_whisper-base_s2.jsonl.gz"
# the rule before issue 18: a zero band that every regime has enough samples for
MARGIN_ONLY = {"*|*|*": (0.0, 1 << 30), "*+act|*|*": (0.0, 1 << 30)}


def study_picks(study: Study, pool: str) -> dict[str, dict[tuple[Signature, int], str | None]]:
    """Per selector ('rule', 'margin only') its held-out pick at every point of the study."""
    picks: dict[str, dict[tuple[Signature, int], str | None]] = {"rule": {}, "margin only": {}}
    for sig in study.signatures:
        train = study.train(sig)
        params = calibration.with_bands(calibration.fit(train, study.configs, study.arch), train,
                                        study.configs, study.arch)
        margin = dataclasses.replace(params, uncertainty=MARGIN_ONLY, support=None)
        for (s, m) in study.points:
            if s == sig:
                picks["rule"][(s, m)] = study.pick(params, pool, s, m)
                picks["margin only"][(s, m)] = study.pick(margin, pool, s, m)
    return picks


def run(log: Path, db_path: Path = DEFAULT_DB, pool: str = "measured") -> dict[str, Any]:
    """{selector: summary json} for one log, plus its point count."""
    family = families.get("gemm")
    db = database.load(db_path, "gemm")
    arch = shipped_profile(db.arch_family)
    os.environ.setdefault("TUNEDB_COMPILE_SET", "tuned")
    study = Study(read_measurements(log), family, arch, db.referenced_config_ids())
    picks = study_picks(study, pool)
    selectors: dict[str, evaluation.Selector] = {"torch": lambda s, m: "torch"}
    for name, table in picks.items():
        selectors[name] = (lambda t: (lambda s, m: t.get((s, m))))(table)
    ev = evaluation.evaluate(study.latest, selectors, equivalents=study.equivalents, worst=0)
    served = sum(1 for cid in picks["rule"].values() if cid not in (None, "torch"))
    return {"log": str(log), "pool": pool, "points": len(ev.points), "signatures": len(study.signatures),
            "rule_served_config": served, "selectors": {s.name: s.to_json() for s in ev.summaries},
            "evaluation": ev}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, action="append", help="measurement log(s); default: the whisper-base oracle")
    ap.add_argument("--db", type=Path, default=DEFAULT_DB)
    ap.add_argument("--pool", choices=("measured", "compiled+torch"), default="measured")
    ap.add_argument("--out", type=Path, help="write every number here (JSON)")
    args = ap.parse_args(argv)
    out = []
    print(f"{'log':58} {'pts':>4} {'selector':12} {'measured':>8} {'unmeas':>6} {'geomean':>8} {'p95':>7} {'max':>7}")
    for log in args.log or [DEFAULT_LOG]:
        if not log.is_file():
            ap.error(f"--log {log} is not a file")
        res = run(log, args.db, args.pool)
        for name in ("torch", "margin only", "rule"):
            s = res["selectors"][name]
            print(f"{log.name[:58]:58} {res['points']:>4} {name:12} {s['measured']:>8} {s['unmeasured']:>6} "
                  f"{_pct(s['geomean']):>8} {_pct(s['p95']):>7} {_pct(s['max']):>7}")
        print(f"{'':58} the rule served a Triton config at {res['rule_served_config']} of {res['points']} point(s)")
        res.pop("evaluation")
        out.append(res)
    if args.out:
        database.write_atomic(args.out, json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
