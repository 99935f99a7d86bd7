"""Nearest-measured-neighbour transfer for the GEMM model tier, held out by model (issue 18, item 1),
on the CPU from a recorded H200 build log: can measured wins on other models be served on a model
nobody measured, without ever serving a point more than 5% slower than the best arm?

    python bench/lomo_transfer.py [--log LOG.jsonl.gz] [--out JSON]    (its column: lomo_regret.py)

The rule (transfer_pick): a held-out point (epilogue kind, M, weight bytes N*K*elem) serves config C
only where C was measured at EVERY training point of the same epilogue kind whose M lies within
`m_oct` octaves and whose weight lies within `w_oct` octaves (or, with `act_up`, for a point whose
activation torch runs as a kernel of its own: whose weight is at least as large, since the
activation pass torch adds is a larger share of a smaller GEMM), at `min_points` of them or more,
and beat torch by `margin` at each; of those, the one with the largest worst-case speedup serves,
the spread of its speedups is its band. Otherwise torch serves.

Its parameters are chosen per split on the OTHER models only (choose: each training model held out
in turn from the training set, the parameters safe on every inner split (served max <= 5%, geomean
<= torch's) with the largest inner gain; ties go to the most conservative), then reported on the
held-out model. The "peeked" line is NOT a result: the best gain kept on each split over the
parameters safe on all four splits, chosen with the test splits in view, i.e. an upper bound of
what any parameter choice of this rule could show here.
The regime table: per regime (epilogue kind x M range x weight range) and model, the oracle's gain
over torch (min..max over points) and the config with the largest worst-case speedup over all the
model's points in the regime, and over ALL models' points in the regime: whether one config beats
torch consistently. Candidates are the arms measured at the held-out point (lomo_regret's
"measured" pool), so a transferred config is always scored. Runs in about 40 s.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

GOAL_MAX = 0.05
GAIN_FLOOR = 0.01
M_RANGES = ((1, "m1"), (16, "m2-16"), (128, "m17-128"), (1024, "m129-1024"), (1 << 62, "m1025+"))
W_RANGES = ((4 << 20, "w<4MB"), (40 << 20, "w4-40MB"), (1 << 62, "w40MB+"))
NON_CONFIGS = ("default", "torch", "fused", "heuristic")  # records.SENTINELS: never transferred


@dataclass(frozen=True)
class Point:
    """One measured (signature, M): its features and every arm's median ms (torch among them)."""

    key: Any  # (Signature, M) in the study; anything hashable in tests
    model: str
    kind: str  # '+act' where torch runs the activation as a kernel of its own, else ''
    m: int
    weight: float  # N * K * elem bytes
    ms: Mapping[str, float]

    @property
    def lm(self) -> float:
        return math.log2(max(self.m, 1))

    @property
    def lw(self) -> float:
        return math.log2(max(self.weight, 1.0))


@dataclass(frozen=True)
class Params:
    m_oct: float = 1.0
    w_oct: float = 1.0
    min_points: int = 2
    margin: float = 0.05
    act_up: bool = False


def neighbours(train: Iterable[Point], p: Point, prm: Params) -> list[Point]:
    """The training points whose evidence speaks for `p` (module docstring)."""
    out = []
    for q in train:
        if q.kind != p.kind or abs(q.lm - p.lm) > prm.m_oct + 1e-9 or "torch" not in q.ms:
            continue
        if prm.act_up and p.kind:
            if q.lw < p.lw - 1e-9:
                continue
        elif abs(q.lw - p.lw) > prm.w_oct + 1e-9:
            continue
        out.append(q)
    return out


def transfer_pick(train: Sequence[Point], p: Point, candidates: Iterable[str], prm: Params) -> tuple[str, float | None]:
    """(config, band) the rule serves at `p`: band = max/min - 1 of its speedups over torch at its
    neighbours; ('torch', None) where no candidate qualifies."""
    nb = neighbours(train, p, prm)
    if len(nb) < max(prm.min_points, 1):
        return "torch", None
    best: tuple[float, str, float] | None = None
    for c in sorted(set(candidates)):
        if c in NON_CONFIGS or not all(c in q.ms for q in nb):
            continue  # a config unmeasured at one neighbour is unknown there: no evidence of consistency
        sp = [q.ms["torch"] / q.ms[c] for q in nb]
        lo = min(sp)
        if lo >= 1.0 + prm.margin and (best is None or lo > best[0]):
            best = (lo, c, max(sp) / lo - 1.0)
    return ("torch", None) if best is None else (best[1], best[2])


def score(points: Sequence[Point], picks: Mapping[Any, str]) -> dict[str, Any]:
    """Geomean/max regret of torch and of `picks` against the best measured arm, the largest regret
    where a config (not torch) served, and the share of torch's geomean regret kept."""
    lt = lr = 0.0
    tmax = rmax = 0.0
    smax: float | None = None
    served = 0
    scored = [p for p in points if "torch" in p.ms]
    for p in scored:
        best = min(p.ms.values())
        t, r = p.ms["torch"] / best - 1.0, p.ms[picks.get(p.key, "torch")] / best - 1.0
        lt, lr, tmax, rmax = lt + math.log1p(t), lr + math.log1p(r), max(tmax, t), max(rmax, r)
        if picks.get(p.key, "torch") != "torch":
            served += 1
            smax = r if smax is None else max(smax, r)
    n = max(len(scored), 1)
    tg, rg = math.expm1(lt / n), math.expm1(lr / n)
    return {"points": len(scored), "torch_geomean": tg, "torch_max": tmax, "rule_geomean": rg, "rule_max": rmax,
            "served": served, "served_max": smax, "gain_kept": (tg - rg) / tg if tg > GAIN_FLOOR else None,
            "log_gain": (lt - lr) / n}


def safe(s: Mapping[str, Any]) -> bool:
    return (s["served_max"] is None or s["served_max"] <= GOAL_MAX) and s["rule_geomean"] <= s["torch_geomean"] + 1e-12


def apply(train: Sequence[Point], held: Sequence[Point], prm: Params) -> dict[Any, str]:
    return {p.key: transfer_pick(train, p, p.ms, prm)[0] for p in held}


def grid() -> list[Params]:
    """Most conservative first (choose keeps the first of equals)."""
    out = [Params(m, w, n, g, up) for up in (False, True) for m in (0.5, 1.0, 2.0) for w in (1.0, 2.0, 3.0, 99.0)
           for n in (4, 3, 2, 1) for g in (0.05, 0.02, 0.0)]
    return sorted(out, key=lambda p: (p.act_up, p.m_oct, p.w_oct, -p.min_points, -p.margin))


def choose(train: Sequence[Point], params: Sequence[Params] | None = None) -> tuple[Params, float, int]:
    """(params, inner log gain, inner splits): chosen on leave-one-model-out splits of `train` alone."""
    models = sorted({p.model for p in train})
    best: tuple[float, Params] | None = None
    for prm in params or grid():
        total, ok = 0.0, True
        for w in models:
            inner_train = [p for p in train if p.model != w]
            inner_held = [p for p in train if p.model == w]
            s = score(inner_held, apply(inner_train, inner_held, prm))
            if not safe(s):
                ok = False
                break
            total += s["log_gain"]
        if ok and (best is None or total > best[0] + 1e-12):
            best = (total, prm)
    if best is None:  # nothing safe: the strictest rule (it serves least)
        return Params(0.5, 1.0, 4, 0.05, False), 0.0, len(models)
    return best[1], best[0], len(models)


def _bucket(v: float, ranges: Sequence[tuple[float, str]]) -> str:
    return next(name for edge, name in ranges if v <= edge)


def regime_table(points: Sequence[Point]) -> list[dict[str, Any]]:
    """Per (kind, M range, weight range): per model and over all models, the oracle gain range and
    the config with the best worst-case speedup over torch across every point of the group."""
    groups: dict[tuple[str, str, str], list[Point]] = {}
    for p in points:
        if "torch" in p.ms:
            groups.setdefault((p.kind or "plain", _bucket(p.m, M_RANGES), _bucket(p.weight, W_RANGES)), []).append(p)
    rows = []
    for key, pts in sorted(groups.items()):
        for model in sorted({p.model for p in pts}) + ["ALL"]:
            sub = [p for p in pts if model in ("ALL", p.model)]
            gains = [p.ms["torch"] / min(p.ms.values()) - 1.0 for p in sub]
            common = set.intersection(*(set(p.ms) for p in sub)) - set(NON_CONFIGS)
            cons = max(((min(p.ms["torch"] / p.ms[c] for p in sub) - 1.0, c) for c in common), default=None)
            rows.append({"kind": key[0], "m": key[1], "w": key[2], "model": model, "points": len(sub),
                         "oracle_gain_min": min(gains), "oracle_gain_max": max(gains),
                         "consistent_config": cons[1] if cons else None, "consistent_worst_gain": cons[0] if cons else None,
                         "models": len({p.model for p in sub})})
    return rows


def coverage(points: Sequence[Point], held_sigs: set[str]) -> dict[str, float]:
    """Where the held-out model's oracle gain over torch lies: the share of its summed log gain at
    points whose regime (kind x M range x weight range) the training set measured on 0, 1, or 2+
    models (a rule validated held out by model needs 2+: one to learn from, one to check on)."""
    def regime(p: Point) -> tuple[str, str, str]:
        return (p.kind, _bucket(p.m, M_RANGES), _bucket(p.weight, W_RANGES))
    seen: dict[tuple[str, str, str], set[str]] = {}
    for q in points:
        if q.key[0].format() not in held_sigs:
            seen.setdefault(regime(q), set()).add(q.model)
    out = {"0": 0.0, "1": 0.0, "2+": 0.0}
    for q in points:
        if q.key[0].format() in held_sigs and "torch" in q.ms:
            n = len(seen.get(regime(q), ()))
            out["0" if n == 0 else "1" if n == 1 else "2+"] += math.log(q.ms["torch"] / min(q.ms.values()))
    total = sum(out.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in out.items()}


def points_of(study: Any, owner: Mapping[str, str]) -> list[Point]:
    """The study's measured points whose signature one model's census names (owner: sig -> model)."""
    from tunedb.families.gemm import confidence

    ms: dict[Any, dict[str, float]] = {}
    for m in study.latest:
        if m.status.ok:
            ms.setdefault((m.signature, m.m), {})[m.config_id] = m.median_ms
    out = []
    for (sig, m), arms in sorted(ms.items(), key=lambda kv: (kv[0][0].format(), kv[0][1])):
        model = owner.get(sig.format())
        if model is not None:
            elem = 1 if sig.dt in ("int8", "float8_e4m3fn") else 4 if sig.dt == "float" else 2
            out.append(Point((sig, m), model, confidence.epilogue_kind(sig.get("act")), m,
                             float(sig.get("N")) * float(sig.get("K")) * elem, arms))
    return out


def run_split(points: Sequence[Point], held_sigs: set[str], params: Sequence[Params] | None = None) -> dict[str, Any]:
    """The rule on one held-out model: parameters chosen on the training models, scored held out.
    `points`' model field names the training model of each point (held-out points are recognised
    by their signature: a signature two censuses share is held out of both splits)."""
    train = [p for p in points if p.key[0].format() not in held_sigs]
    held = [p for p in points if p.key[0].format() in held_sigs]
    prm, inner_gain, inner = choose(train, params)
    picks = apply(train, held, prm)
    return {"params": asdict(prm), "inner_splits": inner, "inner_log_gain": inner_gain, "picks": picks,
            "gain_coverage": coverage(points, held_sigs), **score(held, picks)}


def study_points(log: Path) -> tuple[list[Point], dict[str, set[str]], Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_heldout import DEFAULT_DB, Study
    from lomo_regret import CENSUS_DIR, models_of
    from tunedb import database, families
    from tunedb.arch import shipped_profile
    from tunedb.measure.log import read_measurements

    db = database.load(DEFAULT_DB, "gemm")
    os.environ.setdefault("TUNEDB_COMPILE_SET", "tuned")
    study = Study(read_measurements(log), families.get("gemm"), shipped_profile(db.arch_family),
                  db.referenced_config_ids())
    logged = {s.format() for s in study.signatures}
    held = {w: named & logged for w, named in models_of(CENSUS_DIR).items() if named & logged}
    owner: dict[str, str] = {}
    for w in sorted(held):  # a shared signature is owned by the first model naming it; held out of both
        for s in held[w]:
            owner.setdefault(s, w)
    return points_of(study, owner), held, study


def run(log: Path) -> dict[str, Any]:
    points, held, _study = study_points(log)
    splits = {w: run_split(points, sigs) for w, sigs in held.items()}
    peek: dict[str, float | None] = {w: None for w in held}
    for prm in grid():
        res = {w: score([p for p in points if p.key[0].format() in sigs],
                        apply([p for p in points if p.key[0].format() not in sigs],
                              [p for p in points if p.key[0].format() in sigs], prm)) for w, sigs in held.items()}
        if all(safe(s) for s in res.values()):
            for w, s in res.items():
                if s["gain_kept"] is not None and (peek[w] is None or s["gain_kept"] > peek[w]):
                    peek[w] = s["gain_kept"]
    return {"splits": splits, "peeked_gain_kept": peek, "regimes": regime_table(points)}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def print_report(doc: Mapping[str, Any]) -> None:
    print("nearest-measured-neighbour transfer, parameters chosen on the training models only:")
    print(f"{'held out':18} {'torch geo/max':>15} {'rule geo/max':>15} {'served':>7} {'served max':>10} {'kept':>6}  params")
    for w, s in doc["splits"].items():
        p = s["params"]
        print(f"{w:18} {_pct(s['torch_geomean']):>7}/{_pct(s['torch_max']):>7} {_pct(s['rule_geomean']):>7}/"
              f"{_pct(s['rule_max']):>7} {s['served']:>3}/{s['points']:<3} {_pct(s['served_max']):>10} "
              f"{_pct(s['gain_kept']):>6}  M+-{p['m_oct']} oct, W+-{p['w_oct']} oct{' (act: heavier)' if p['act_up'] else ''},"
              f" >={p['min_points']} pts, margin {p['margin']:.0%}")
    print("share of each held-out model's oracle gain (log) in regimes the training set measured on 0 / 1 / 2+ models: "
          + ", ".join(f"{w} {' / '.join(_pct(s['gain_coverage'][k]) for k in ('0', '1', '2+'))}"
                      for w, s in doc["splits"].items()))
    print("peeked (NOT a result: best gain kept over the parameters safe on all splits, test splits in view): "
          + ", ".join(f"{w} {_pct(v)}" for w, v in doc["peeked_gain_kept"].items()))
    print("regimes: oracle gain over torch (min..max) and the config with the best worst-case speedup at every point")
    for r in doc["regimes"]:
        cg = r["consistent_worst_gain"]
        print(f"  {r['kind']:5} {r['m']:9} {r['w']:8} {r['model']:17} {r['points']:>3} pts  oracle "
              f"{100 * r['oracle_gain_min']:+6.1f}..{100 * r['oracle_gain_max']:+6.1f}%  consistent "
              f"{r['consistent_config'] or '-':28} {'-' if cg is None else f'{100 * cg:+.1f}%'}")


def to_json(doc: Mapping[str, Any]) -> dict[str, Any]:
    splits = {w: {k: v for k, v in s.items() if k != "picks"} | {
        "served_configs": sorted(f"{key[0].format()} M={key[1]}: {c}" for key, c in s["picks"].items() if c != "torch")}
        for w, s in doc["splits"].items()}
    return {"splits": splits, "peeked_gain_kept": doc["peeked_gain_kept"], "regimes": doc["regimes"]}


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lomo_cli import replay_main

    return replay_main(argv, __doc__, run, lambda doc, _log: print_report(doc), to_json=to_json)


if __name__ == "__main__":
    sys.exit(main())
