"""Shape-neighbour transfer for the GEMM model tier, held out by model (issue 18, session 41), on
the CPU from a recorded H200 build log: bench/lomo_transfer.py's rule with its neighbourhood taken
in M, N and K separately (not in M and weight bytes N*K) and with a near-best condition on the
evidence, so that a config is transferred only where it was (nearly) the best arm measured, not
merely faster than torch.

    python bench/lomo_nk.py [--log LOG.jsonl.gz] [--out JSON]     (its column: lomo_regret.py "nk transfer")

The rule (nk_pick): a held-out point (epilogue kind, M, N, K) serves config C only where C was
measured at EVERY training point of the same epilogue kind whose log2 M, log2 N and log2 K lie
within (m_oct, n_oct, k_oct) of the point's, at `min_points` of them or more, and at each of them
(1) beat torch by `margin` and (2) was within `tol` of the best arm measured there; of those, the C
with the largest worst-case speedup over torch serves. Otherwise torch serves. Separate N and K
keep 512x9728 (conformer, where the split-K decode kernels win) apart from 1024x4096 (Llama,
where the `lr` GEMV wins), which one weight axis merges (10 MB vs 8 MB).

Its parameters are chosen per split on the OTHER models only, exactly as lomo_transfer.choose:
each training model held out in turn from the training set, the parameters safe on every inner
split (served max <= 5%, geomean <= torch's) with the largest summed inner log gain; ties go to
the most conservative (grid order). The held-out model never informs the choice.
Also printed (NOT results, the held-out splits in view): "fixed" rows, the rule at a few fixed
parameter sets on every split, and the share of each held-out model's oracle log gain at points
that have a training neighbour (factor 2 in M, N and K, same kind) on 0, 1 or 2+ training models:
gain only one training model speaks for cannot be validated by an inner leave-one-model-out split,
which is why the two Llama splits (77-89% of their gain there: each is the other's only decode
neighbour) choose conservative parameters. Runs in about 30 s.
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lomo_transfer as lt  # noqa: E402

NON_CONFIGS = lt.NON_CONFIGS


@dataclass(frozen=True)
class Params:
    m_oct: float = 0.5
    n_oct: float = 0.5
    k_oct: float = 1.0
    min_points: int = 1
    margin: float = 0.05
    tol: float = 0.02  # largest regret against the best measured arm at a neighbour


# a few a-priori parameter sets shown on every split ("fixed", NOT results)
FIXED = (Params(0.5, 0.5, 1.0, 1, 0.05, 0.02), Params(0.5, 0.5, 1.0, 1, 0.05, 0.05),
         Params(1.0, 1.0, 1.0, 1, 0.05, 0.02), Params(1.0, 1.0, 1.0, 2, 0.05, 0.02))


_NK: dict[Any, tuple[float, float]] = {}


def _nk(p: lt.Point) -> tuple[float, float]:
    """(log2 N, log2 K) of a point's signature (cached: the grid asks for it millions of times)."""
    got = _NK.get(p.key[0])
    if got is None:
        sig = p.key[0]
        got = _NK[sig] = (math.log2(max(int(sig.get("N")), 1)), math.log2(max(int(sig.get("K")), 1)))
    return got


def neighbours(train: Iterable[lt.Point], p: lt.Point, prm: Params) -> list[lt.Point]:
    ln, lk = _nk(p)
    out = []
    for q in train:
        if q.kind != p.kind or "torch" not in q.ms or abs(q.lm - p.lm) > prm.m_oct + 1e-9:
            continue
        qn, qk = _nk(q)
        if abs(qn - ln) <= prm.n_oct + 1e-9 and abs(qk - lk) <= prm.k_oct + 1e-9:
            out.append(q)
    return out


Evidence = tuple[int, tuple[tuple[float, float, str], ...]]  # (neighbours, ((worst speedup, worst regret, config), ...))


def evidence(train: Sequence[lt.Point], p: lt.Point, candidates: Iterable[str], prm: Params) -> Evidence:
    """What the training points near `p` say (the part of the rule that depends only on the
    neighbourhood): their count and, per candidate measured at every one of them, its worst
    speedup over torch and its worst regret against the best arm there."""
    nb = neighbours(train, p, prm)
    rows = []
    for c in sorted(set(candidates)):
        if c in NON_CONFIGS or not nb or not all(c in q.ms for q in nb):
            continue  # a config unmeasured at one neighbour is unknown there: no evidence of consistency
        rows.append((min(q.ms["torch"] / q.ms[c] for q in nb), max(q.ms[c] / min(q.ms.values()) - 1.0 for q in nb), c))
    return len(nb), tuple(rows)


def decide(ev: Evidence, prm: Params) -> str:
    """The config the evidence lets serve under `prm` (module docstring), or 'torch'."""
    count, rows = ev
    if count < max(prm.min_points, 1):
        return "torch"
    best: tuple[float, str] | None = None
    for lo, worst, c in rows:
        if lo >= 1.0 + prm.margin and worst <= prm.tol + 1e-12 and (best is None or lo > best[0]):
            best = (lo, c)
    return "torch" if best is None else best[1]


def nk_pick(train: Sequence[lt.Point], p: lt.Point, candidates: Iterable[str], prm: Params) -> str:
    """The config the rule serves at `p` (module docstring), or 'torch'."""
    return decide(evidence(train, p, candidates, prm), prm)


def apply(train: Sequence[lt.Point], held: Sequence[lt.Point], prm: Params) -> dict[Any, str]:
    return {p.key: nk_pick(train, p, p.ms, prm) for p in held}


def grid() -> list[Params]:
    """Most conservative first (choose keeps the first of equals)."""
    out = [Params(m, n, k, c, g, t) for m in (0.5, 1.0, 1.6, 2.0) for n in (0.5, 1.0, 1.5) for k in (0.5, 1.0, 1.5)
           for c in (4, 3, 2, 1) for g in (0.05, 0.02, 0.0) for t in (0.02, 0.05, 9.0)]
    return sorted(out, key=lambda p: (p.m_oct, p.n_oct, p.k_oct, -p.min_points, -p.margin, p.tol))


def choose(train: Sequence[lt.Point], params: Sequence[Params] | None = None) -> tuple[Params, float, int]:
    """(params, inner summed log gain, inner splits): chosen on leave-one-model-out splits of `train`."""
    models = sorted({p.model for p in train})
    splits = [([p for p in train if p.model != w], [p for p in train if p.model == w]) for w in models]
    cache: dict[tuple[float, float, float], list[dict[Any, Evidence]]] = {}
    best: tuple[float, Params] | None = None
    for prm in params or grid():
        geom = (prm.m_oct, prm.n_oct, prm.k_oct)
        if geom not in cache:
            cache[geom] = [{p.key: evidence(it, p, p.ms, prm) for p in ih} for it, ih in splits]
        total, ok = 0.0, True
        for (_it, inner_held), ev in zip(splits, cache[geom]):
            s = lt.score(inner_held, {k: decide(e, prm) for k, e in ev.items()})
            if not lt.safe(s):
                ok = False
                break
            total += s["log_gain"] * s["points"]
        if ok and (best is None or total > best[0] + 1e-12):
            best = (total, prm)
    if best is None:  # nothing safe: the strictest cell (serves least)
        return Params(0.5, 0.5, 0.5, 4, 0.05, 0.02), 0.0, len(models)
    return best[1], best[0], len(models)


def coverage(points: Sequence[lt.Point], held_sigs: set[str], slack: float = 1.0) -> dict[str, float]:
    """Share of the held-out model's oracle log gain over torch at points with a training neighbour
    (same kind, within `slack` octaves in M, N and K) on 0, 1 or 2+ training models."""
    train = [q for q in points if q.key[0].format() not in held_sigs]
    out = {"0": 0.0, "1": 0.0, "2+": 0.0}
    for p in points:
        if p.key[0].format() not in held_sigs or "torch" not in p.ms:
            continue
        n = len({q.model for q in neighbours(train, p, Params(slack, slack, slack, 1, 0.0, 9.0))})
        out["0" if n == 0 else "1" if n == 1 else "2+"] += math.log(p.ms["torch"] / min(p.ms.values()))
    total = sum(out.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in out.items()}


def run_split(points: Sequence[lt.Point], held_sigs: set[str], params: Sequence[Params] | None = None) -> dict[str, Any]:
    """The rule on one held-out model: parameters chosen on the training models, scored held out."""
    train = [p for p in points if p.key[0].format() not in held_sigs]
    held = [p for p in points if p.key[0].format() in held_sigs]
    prm, inner_gain, inner = choose(train, params)
    picks = apply(train, held, prm)
    return {"params": asdict(prm), "inner_splits": inner, "inner_log_gain": inner_gain, "picks": picks,
            "gain_coverage": coverage(points, held_sigs), **lt.score(held, picks)}


def run(log: Path) -> dict[str, Any]:
    points, held, _study = lt.study_points(log)
    splits = {w: run_split(points, sigs) for w, sigs in held.items()}
    fixed = []
    for prm in FIXED:
        res = {}
        for w, sigs in held.items():
            tr = [p for p in points if p.key[0].format() not in sigs]
            he = [p for p in points if p.key[0].format() in sigs]
            res[w] = {k: v for k, v in lt.score(he, apply(tr, he, prm)).items()}
        fixed.append({"params": asdict(prm), "splits": res, "safe_everywhere": all(lt.safe(s) for s in res.values())})
    return {"splits": splits, "fixed": fixed}


_pct = lt._pct


def describe(p: Mapping[str, Any]) -> str:
    tol = "-" if p["tol"] > 1 else f"{p['tol']:.0%}"
    return (f"M/N/K +-{p['m_oct']}/{p['n_oct']}/{p['k_oct']} oct, >={p['min_points']} pts, margin "
            f"{p['margin']:.0%}, tol {tol}")


def print_report(doc: Mapping[str, Any]) -> None:
    print("shape-neighbour (M, N, K) transfer, parameters chosen on the training models only:")
    print(f"{'held out':18} {'torch geo':>9} {'rule geo':>9} {'served':>7} {'served max':>10} {'kept':>6}  "
          f"gain with neighbours on 0/1/2+ models   params")
    for w, s in doc["splits"].items():
        cov = " / ".join(_pct(s["gain_coverage"][k]) for k in ("0", "1", "2+"))
        print(f"{w:18} {_pct(s['torch_geomean']):>9} {_pct(s['rule_geomean']):>9} {s['served']:>3}/{s['points']:<3} "
              f"{_pct(s['served_max']):>10} {_pct(s['gain_kept']):>6}  {cov:37} {describe(s['params'])}")
    print("fixed parameters (NOT results: chosen with every split in view), kept / served max / served per split:")
    for f in doc["fixed"]:
        cells = ", ".join(f"{w} {_pct(s['gain_kept'])}/{_pct(s['served_max'])}/{s['served']}" for w, s in f["splits"].items())
        print(f"  {describe(f['params'])}{' (safe on every split)' if f['safe_everywhere'] else ''}: {cells}")


def to_json(doc: Mapping[str, Any]) -> dict[str, Any]:
    splits = {w: {k: v for k, v in s.items() if k != "picks"} | {
        "served_configs": sorted(f"{key[0].format()} M={key[1]}: {c}" for key, c in s["picks"].items() if c != "torch")}
        for w, s in doc["splits"].items()}
    return {"splits": splits, "fixed": doc["fixed"]}


def main(argv: Sequence[str] | None = None) -> int:
    from lomo_cli import replay_main

    return replay_main(argv, __doc__, run, lambda doc, _log: print_report(doc), to_json=to_json)


if __name__ == "__main__":
    sys.exit(main())
