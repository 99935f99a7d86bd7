"""How much the GEMM model tier's local band (confidence.local_band) depends on its parameters: the
leave-one-model-out replay of bench/lomo_regret.py, on the CPU from the same recorded H200 log,
for a grid of (factor in M, residuals needed per population, lanes pooled or not).

    python bench/lomo_local_grid.py [--log LOG.jsonl.gz] [--out JSON]

Each split (a preset model held out, and inside its training set each signature held out in turn:
lomo_regret's --sanity) is fitted once: the model, its regime bands and supports (as
calibration.with_bands), and its held-out decisions' residuals; every grid cell then replays only
the rule. A cell is 'ok' where on every split and every inner split the rule's geomean regret is
at most always-torch's and no served point exceeds 5%. The shipped cell is slack 1 octave (a factor
2), 2 residuals per population, lanes pooled: its row reproduces lomo_regret.py --sanity's 'local band'.
Runs in about 5 min on 2 cores (the fits; the grid itself takes seconds).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lomo_regret as lomo  # noqa: E402
from costmodel_heldout import DEFAULT_DB, Study  # noqa: E402

from tunedb import database, families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import calibration, confidence, costmodel  # noqa: E402
from tunedb.families.gemm.costmodel import ELEM_BYTES  # noqa: E402
from tunedb.measure.log import read_measurements  # noqa: E402

SLACKS = (0.5, 1.0, 2.0)
MINS = (1, 2, 3, 5)
_STUDY: Study | None = None


def _study(log: Path) -> Study:
    global _STUDY
    if _STUDY is None:
        os.environ.setdefault("TUNEDB_COMPILE_SET", "tuned")
        db = database.load(DEFAULT_DB, "gemm")
        _STUDY = Study(read_measurements(log), families.get("gemm"), shipped_profile(db.arch_family),
                       db.referenced_config_ids())
    return _STUDY


def fit_split(log: Path, held: frozenset[str], scored: frozenset[str]) -> dict[str, Any]:
    """The regime-only decisions and the held-out residuals of one split, at the points of `scored`."""
    st = _study(log)
    train = [m for m in st.latest if m.status.ok and m.signature.format() not in held]
    params = calibration.fit(train, st.configs, st.arch)
    top: list = []
    sets = [calibration.loso_residuals(train, st.configs, st.arch, picked=top), top]
    groups = calibration.related_groups(m.signature for m in train)
    gtop: list = []
    sets += [calibration.loso_residuals(train, st.configs, st.arch, picked=gtop, group_of=groups.__getitem__), gtop]
    widest = [confidence.bands(s) for s in sets]
    regime = dataclasses.replace(params, support=confidence.supports(top), uncertainty={
        k: (max(b[k][0] for b in widest if k in b), n) for k, (_b, n) in widest[1].items()})
    points = {}
    for (s, m) in st.points:
        if s.format() not in scored:
            continue
        pool = st.pool("measured", s, m)
        ranked = costmodel.rank(pool, m, s.get("N"), s.get("K"), st.arch, len(pool), st.family.invalid_reason,
                                regime, dt=s.dt, default_config=st.default_of, sig=s)
        epi = confidence.epilogue_kind(s.get("act"))
        d = confidence.serve(ranked, "torch", regime.uncertainty, (m, s.get("N"), s.get("K"), ELEM_BYTES.get(s.dt, 2)),
                             regime.torch_margin, support=regime.support, epilogue=epi)
        points[f"{s.format()}@{m}"] = {"regime": d.config.id, "declined": d.declined, "gain": d.gain, "epi": epi,
                                       "best": d.best.id if d.best is not None else None,
                                       "lane": d.best.lane if d.best is not None else None}
    rows = {"signature": [(lane, m, r) for lane, m, *_x, r in top], "group": [(lane, m, r) for lane, m, *_x, r in gtop]}
    return {"margin": regime.torch_margin, "rows": rows, "points": points}


def pick(split: dict[str, Any], key: str, slack: float, need: int, pooled: bool) -> str:
    """The rule at one point with the local band's parameters (serve()'s local step, replayed)."""
    p = split["points"][key]
    if p["regime"] != "torch" or not p["declined"]:
        return p["regime"]
    kind = p["epi"] if pooled else p["lane"] + p["epi"]
    local = {pop: tuple((("+act" if lane.endswith(confidence.ACT) else "") if pooled else lane,
                         round(math.log2(max(m, 1)), 3), r) for lane, m, r in rows)
             for pop, rows in split["rows"].items()}
    found = confidence.local_band(local, kind, int(key.rsplit("@", 1)[1]), slack, need)
    if found is None or p["gain"] - found[0] <= math.log1p(split["margin"]):
        return "torch"
    return p["best"]


def score(arms: dict[str, dict[str, float]], picks: dict[str, str]) -> dict[str, Any]:
    lt, lr, worst, served = [], [], None, 0
    for key, cid in picks.items():
        a = arms[key]
        best = min(a.values())
        lt.append(math.log(a["torch"] / best))
        lr.append(math.log(a[cid] / best))
        if cid != "torch":
            served += 1
            worst = max(worst or 0.0, a[cid] / best - 1.0)
    t, r = math.expm1(sum(lt) / len(lt)), math.expm1(sum(lr) / len(lr))
    return {"torch": t, "rule": r, "served": served, "served_max": worst,
            "kept": (t - r) / t if t > lomo.GAIN_FLOOR else None,
            "ok": r <= t + 1e-12 and (worst is None or worst <= lomo.GOAL_MAX)}


def run(log: Path, workers: int) -> dict[str, Any]:
    st = _study(log)
    logged = {s.format() for s in st.signatures}
    jobs: list[tuple[str, str | None, frozenset[str], frozenset[str]]] = []
    for workload, named in lomo.models_of(lomo.CENSUS_DIR).items():
        held = frozenset(named & logged)
        if held:
            jobs.append((workload, None, held, held))
            jobs += [(workload, s, held | {s}, frozenset({s})) for s in sorted(logged - named)]
    with ProcessPoolExecutor(workers) as ex:
        fitted = list(ex.map(fit_split, [log] * len(jobs), [j[2] for j in jobs], [j[3] for j in jobs]))
    arms: dict[str, dict[str, float]] = {}
    for m in st.latest:
        v = m.objective(0.0)
        if v is not None and v > 0:
            arms.setdefault(f"{m.signature.format()}@{m.m}", {})[m.config_id] = v
    cells = []
    for slack, need, pooled in itertools.product(SLACKS, MINS, (True, False)):
        per: dict[str, dict[str, Any]] = {}
        inner: dict[str, dict[str, str]] = {}
        for (workload, sig, _h, _s), split in zip(jobs, fitted):
            picks = {k: pick(split, k, slack, need, pooled) for k in split["points"]}
            if sig is None:
                per[workload] = score(arms, picks)
            else:
                inner.setdefault(workload, {}).update(picks)
        for workload, picks in inner.items():
            per[workload]["sanity"] = score(arms, picks)
        ok = all(v["ok"] and v["sanity"]["ok"] for v in per.values())
        cells.append({"slack": slack, "min": need, "pooled": pooled, "ok": ok, "splits": per})
    return {"log": str(log), "cells": cells}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=lomo.DEFAULT_LOG)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not args.log.is_file():
        ap.error(f"--log {args.log} is not a file")
    res = run(args.log, max(args.workers, 1))
    print(f"log: {args.log.name}; cell: kept on conformer / llama-3-8b, served points, worst served, ok on every split and inner split")
    print(f"{'slack':>5} {'min':>3} {'lanes':7} {'conformer':>9} {'llama':>6} {'served':>6} {'worst':>6} {'sanity served/worst':>20}  ok")
    for c in res["cells"]:
        sp = c["splits"]
        served = sum(v["served"] for v in sp.values())
        worst = max((v["served_max"] for v in sp.values() if v["served_max"] is not None), default=None)
        s_served = sum(v["sanity"]["served"] for v in sp.values())
        s_worst = max((v["sanity"]["served_max"] for v in sp.values() if v["sanity"]["served_max"] is not None), default=None)
        print(f"{c['slack']:>5} {c['min']:>3} {'pooled' if c['pooled'] else 'lane':7} "
              f"{_pct(sp.get('conformer', {}).get('kept')):>9} {_pct(sp.get('llama-3-8b', {}).get('kept')):>6} "
              f"{served:>6} {_pct(worst):>6} {s_served:>12}/{_pct(s_worst):>7}  {'yes' if c['ok'] else 'no'}")
    if args.out:
        database.write_atomic(args.out, json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
