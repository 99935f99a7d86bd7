"""Leave-one-model-out regret of the GEMM model tier (issue 18, item 4), on the CPU from a recorded
H200 build log.

    python bench/lomo_regret.py [--log LOG.jsonl.gz] [--pool measured|compiled+torch] [--sanity]
                                [--decode-report] [--out JSON]

For each preset model W named by the census files in bench/census/, the cost model is fitted
(calibration.fit) on the measurements of every signature that W's census does NOT name (so a
signature two models share never trains the split that holds one of them out), its confidence
bands are calibrated on that same training set (calibration.with_bands: leave-one-signature-out
inside it), and the tiers then pick at each of W's measured points:
  * rule: the model tier as it serves by default (a config only beyond its regime's band, else torch),
  * local band: the rule with TUNEDB_MODEL_LOCAL_BAND=1 (also a config beyond its local band),
  * margin only: the rule before issue 18 (a config whenever predicted faster than torch),
  * torch: always the fallback,
  * transfer: bench/lomo_transfer.py's nearest-measured-neighbour rule (a config measured to beat
    torch at every training point of the same epilogue kind near the point's M and weight), its
    parameters chosen on the training models' own leave-one-model-out splits, never on the held-out one,
  * nk transfer: bench/lomo_nk.py's variant of it (neighbours within octaves in M, N and K apart,
    and the config within a tolerance of the best arm at each of them), chosen the same way,
scored by tunedb.evaluate against the best arm measured at the point. The oracle is the build's
measured set (the cost model's top configs, the sentinels and the coverage basis), not an
exhaustive sweep: an exhaustive oracle per model needs a device call per model (whisper-base's
took 342 s for 8 signatures), so the regrets here are lower bounds of the exhaustive ones.
"gain kept" = (torch's geomean regret - the selector's) / torch's geomean regret: the share of the
oracle's geomean gain over torch that the selector keeps (issue 18: at least half), shown where
torch's geomean regret exceeds 1% (below that there is next to nothing to keep). "served max" is
the largest regret at a point where the selector served a Triton config (issue 18: <= 5%; where
torch serves, torch's own regret is no fault of the model tier).
--decode-report also prints bench/lomo_decode.py's table (the model's decode-regime error and rank
correlation held out by model, with and without its decode term; its rows go to the JSON's
"decode_report" when --out is given, which then holds {"lomo": rows, "decode_report": rows}).
--sanity adds a check on splits the rule was not tuned on: inside each split's training set, each
signature held out in turn (model and bands fitted on the others), the rule and the local band
against torch.
Default log: the shipped tier's build (2026-11-30, call M). Runs in about 90 s (--sanity: ~7 min).
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

import lomo_nk  # noqa: E402
import lomo_transfer  # noqa: E402
from lomo_cli import DEFAULT_LOG  # noqa: E402,F401  (the other LOMO benches read it from here too)
from costmodel_heldout import DEFAULT_DB, Study  # noqa: E402

from tunedb import database, families, settings  # noqa: E402
from tunedb import evaluate as evaluation  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import calibration  # noqa: E402
from tunedb.measure.log import read_measurements  # noqa: E402
from tunedb.records import Signature  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CENSUS_DIR = ROOT / "bench/census"
MARGIN_ONLY = {"*|*|*": (0.0, 1 << 30), "*+act|*|*": (0.0, 1 << 30)}
GOAL_MAX = 0.05
GAIN_FLOOR = 0.01  # torch geomean regret below which "gain kept" is not reported


def models_of(census_dir: Path) -> dict[str, set[str]]:
    """{workload: signature strings its census files name}."""
    out: dict[str, set[str]] = {}
    for path in sorted(census_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        out.setdefault(doc["workload"], set()).update(p["signature"] for p in doc["points"])
    return out


def split_picks(study: Study, held: set[str], pool: str) -> dict[str, dict[tuple[Signature, int], str | None]]:
    train = [m for m in study.latest if m.status.ok and m.signature.format() not in held]
    params = calibration.with_bands(calibration.fit(train, study.configs, study.arch), train,
                                    study.configs, study.arch)
    margin = dataclasses.replace(params, uncertainty=MARGIN_ONLY, support=None, local={})
    picks: dict[str, dict[tuple[Signature, int], str | None]] = {"rule": {}, "local band": {}, "margin only": {}}
    for (s, m) in study.points:
        if s.format() in held:
            with settings.override(MODEL_LOCAL_BAND="0"):
                picks["rule"][(s, m)] = study.pick(params, pool, s, m)
            with settings.override(MODEL_LOCAL_BAND="1"):
                picks["local band"][(s, m)] = study.pick(params, pool, s, m)
            picks["margin only"][(s, m)] = study.pick(margin, pool, s, m)
    return picks


def served_max(ev: evaluation.Evaluation, name: str, picks: dict[tuple[Signature, int], str | None]) -> float | None:
    """The largest regret of `name` at the points where it served a Triton config (not torch)."""
    out = None
    for p in ev.points:
        if picks.get((p.signature, p.m)) in (None, "torch"):
            continue
        pick = p.picks.get(name)
        r = pick.regret if pick is not None else None
        if r is not None:
            out = r if out is None else max(out, r)
    return out


def sanity(study: Study, held: set[str], pool: str) -> dict[str, Any]:
    """Leave-one-signature-out inside the split's training set: the rule (model and bands fitted
    on the other training signatures) against torch, on points the rule was never tuned on."""
    train_sigs = [s for s in study.signatures if s.format() not in held]
    picks: dict[str, dict[tuple[Signature, int], str | None]] = {"rule": {}, "local band": {}}
    for sig in train_sigs:
        train = [m for m in study.latest if m.status.ok and m.signature.format() not in held and m.signature != sig]
        params = calibration.with_bands(calibration.fit(train, study.configs, study.arch), train,
                                        study.configs, study.arch)
        for (s, m) in study.points:
            if s == sig:
                for name, flag in (("rule", "0"), ("local band", "1")):
                    with settings.override(MODEL_LOCAL_BAND=flag):
                        picks[name][(s, m)] = study.pick(params, pool, s, m)
    meas = [m for m in study.latest if m.signature in set(train_sigs)]
    selectors: dict[str, evaluation.Selector] = {"torch": lambda s, m: "torch"}
    for name, table in picks.items():
        selectors[name] = (lambda t: (lambda s, m: t.get((s, m))))(table)
    ev = evaluation.evaluate(meas, selectors, equivalents=study.equivalents, worst=0)
    summ = {s.name: s.to_json() for s in ev.summaries}
    out: dict[str, Any] = {"points": len(ev.points), "torch_geomean": summ["torch"]["geomean"]}
    for name, key in (("rule", "rule"), ("local band", "local")):
        out.update({f"{key}_geomean": summ[name]["geomean"], f"{key}_served_max": served_max(ev, name, picks[name]),
                    f"{key}_served_config": sum(1 for c in picks[name].values() if c not in (None, "torch"))})
    return out


def run(log: Path, pool: str = "measured", db_path: Path = DEFAULT_DB, check: bool = False) -> list[dict[str, Any]]:
    family = families.get("gemm")
    db = database.load(db_path, "gemm")
    arch = shipped_profile(db.arch_family)
    os.environ.setdefault("TUNEDB_COMPILE_SET", "tuned")
    study = Study(read_measurements(log), family, arch, db.referenced_config_ids())
    logged = {s.format() for s in study.signatures}
    owner: dict[str, str] = {}
    for workload, named in sorted(models_of(CENSUS_DIR).items()):
        for sig in sorted(named & logged):
            owner.setdefault(sig, workload)
    tpoints = lomo_transfer.points_of(study, owner)
    rows = []
    for workload, named in models_of(CENSUS_DIR).items():
        held = named & logged
        if not held:
            continue
        picks = split_picks(study, held, pool)
        tr = lomo_transfer.run_split(tpoints, held)
        picks["transfer"] = tr["picks"]
        nk = lomo_nk.run_split(tpoints, held)
        picks["nk transfer"] = nk["picks"]
        selectors: dict[str, evaluation.Selector] = {"torch": lambda s, m: "torch"}
        for name, table in picks.items():
            selectors[name] = (lambda t: (lambda s, m: t.get((s, m))))(table)
        meas = [m for m in study.latest if m.signature.format() in held]
        ev = evaluation.evaluate(meas, selectors, equivalents=study.equivalents, worst=0)
        summ = {s.name: s.to_json() for s in ev.summaries}
        base = summ["torch"]["geomean"] or 0.0
        for name in summ:
            g = summ[name]["geomean"]
            summ[name]["gain_kept"] = None if base <= GAIN_FLOOR or g is None else (base - g) / base
            summ[name]["served_max"] = served_max(ev, name, picks[name]) if name in picks else None
        served = {k: sum(1 for c in picks[name].values() if c not in (None, "torch"))
                  for k, name in (("rule", "rule"), ("local", "local band"), ("transfer", "transfer"),
                                  ("nk", "nk transfer"))}
        row = {"held_out": workload, "signatures": len(held), "points": len(ev.points),
               "train_signatures": len(logged - named), "rule_served_config": served["rule"],
               "local_served_config": served["local"], "transfer_served_config": served["transfer"],
               "transfer_params": tr["params"], "nk_served_config": served["nk"], "nk_params": nk["params"],
               "selectors": summ}
        if check:
            row["sanity"] = sanity(study, held, pool)
        rows.append(row)
    return rows


def _params(p: dict[str, Any]) -> str:
    act = ", +act from heavier weights" if p["act_up"] else ""
    return (f"M within {p['m_oct']} octave(s), weight within {p['w_oct']}{act}, >= {p['min_points']} "
            f"points, margin {100 * p['margin']:.0f}%")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG)
    ap.add_argument("--pool", choices=("measured", "compiled+torch"), default="measured")
    ap.add_argument("--sanity", action="store_true",
                    help="also hold out each training signature inside every split (about 6 min)")
    ap.add_argument("--decode-report", action="store_true",
                    help="also print the decode-regime error and rank correlation (bench/lomo_decode.py)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not args.log.is_file():
        ap.error(f"--log {args.log} is not a file")
    rows = run(args.log, args.pool, check=args.sanity)
    print(f"log: {args.log.name}, pool: {args.pool}; oracle = best measured arm (not exhaustive)")
    print(f"{'held out':18} {'sigs':>4} {'pts':>4} {'selector':12} {'geomean':>8} {'max':>7} {'served max':>10} "
          f"{'gain kept':>9} {'served<=5%':>10} {'<=torch':>7}")
    for r in rows:
        base = r["selectors"]["torch"]["geomean"]
        for name in ("torch", "margin only", "rule", "local band", "transfer", "nk transfer"):
            s = r["selectors"][name]
            sm = s.get("served_max")
            ok_max = "-" if name == "torch" else "yes" if sm is None or sm <= GOAL_MAX else "no"
            ok_t = "yes" if s["geomean"] is not None and base is not None and s["geomean"] <= base + 1e-12 else "no"
            print(f"{r['held_out']:18} {r['signatures']:>4} {r['points']:>4} {name:12} {_pct(s['geomean']):>8} "
                  f"{_pct(s['max']):>7} {_pct(sm):>10} {_pct(s.get('gain_kept')):>9} {ok_max:>10} {ok_t:>7}")
        print(f"{'':18} the rule served a Triton config at {r['rule_served_config']} of {r['points']} point(s), "
              f"the local band at {r['local_served_config']}, the transfer rule at {r['transfer_served_config']} "
              f"(its parameters, chosen on the other models: {_params(r['transfer_params'])})")
        print(f"{'':18} the nk transfer rule served a Triton config at {r['nk_served_config']} point(s) (its "
              f"parameters, chosen on the other models: {lomo_nk.describe(r['nk_params'])})")
        if "sanity" in r:
            c = r["sanity"]
            for name, key in (("rule", "rule"), ("local band", "local")):
                print(f"{'':18} sanity (each of its training signatures held out, {c['points']} points): {name} "
                      f"{_pct(c[f'{key}_geomean'])} vs torch {_pct(c['torch_geomean'])} geomean, served max "
                      f"{_pct(c[f'{key}_served_max'])}, served a config at {c[f'{key}_served_config']} point(s)")
    doc: Any = rows
    if args.decode_report:
        import lomo_decode

        decode_rows = lomo_decode.run(args.log)
        lomo_decode.print_report(decode_rows)
        doc = {"lomo": rows, "decode_report": decode_rows}
    if args.out:
        database.write_atomic(args.out, json.dumps(doc, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
