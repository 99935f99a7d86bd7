"""What a smaller build costs in regret: the build's --top-k replayed on a recorded measurement log.

    python bench/topk_regret.py [--log LOG.jsonl[.gz]] [--db gemm.json] [--k 4,6,8,12,16] [--md FILE]

A build measures, at every point, the union of each ranker's top-k valid configs (the
uncalibrated cost model, and the calibrated one when the target file ships its parameters) plus
the family's sentinels (default, torch, fused). Tuning time grows with the arms measured, so the
question is how small k can be before the pick gets worse. For each point of the log this
recomputes the arm set at each k (buildplan.arms_for_point, the build's own code) and scores
the best arm measured among it against the best measured at all (regret = objective / best - 1),
and what the build would serve: a region must beat torch by the build's gate (1.05x, applied here
per point), so the gated regret compares the served arm at k with the one served from every arm.
Only arms the log measured count. A log from a top-16 build lacks some arms the replay picks
(another model ranked that build; cross-evaluation added others), so its oracle is incomplete
and the figures can err either way: an exhaustive log (`tunedb build --exhaustive`) settles it.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from tunedb import database, families

from tunedb.build import steps as buildsteps
from tunedb.arch import shipped_profile
from tunedb.measure.log import read_log
from tunedb.build.plan import arms_for_point

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOG = ROOT / "bench/results/2026-11-30_s3_system_sm90_buildall_measurements.jsonl.gz"
DEFAULT_DB = ROOT / "src/tunedb/db/sm90/gemm.json"


GATE = families.hook(families.get("gemm"), "pick_rule")().min_speedup  # a build's gate over torch


def analyse(log: Path, db: Path, ks: list[int], gate: float = GATE) -> list[dict]:
    family = families.get("gemm")
    arch = shipped_profile("sm90")
    parsed = database.load(db)
    rankers = buildsteps.rankers(family, arch, buildsteps.model_params(parsed.model))
    points: dict[tuple, dict[str, float]] = defaultdict(dict)
    for rec in read_log(log):
        m = rec.measurement
        if m.status.ok and m.median_ms:
            best = points[(m.signature, m.m)].get(m.config_id)
            points[(m.signature, m.m)][m.config_id] = min(best or math.inf, m.median_ms)
    # per point, whatever k: the best measured arm, and what a build serves from all of them
    oracle = {key: (min(measured.values()), served(measured, measured["torch"], gate) if "torch" in measured else None)
              for key, measured in points.items()}
    rows = []
    for k in ks:
        regrets, gated, arms, missing = [], [], [], 0
        for (sig, m), measured in points.items():
            ids = arms_for_point(family, sig, m, arch, rankers, top_k=k)
            got = {c: measured[c] for c in ids if c in measured}
            arms.append(len(ids))
            missing += sum(1 for c in ids if c not in measured)
            if not got:
                continue
            best, best_served = oracle[(sig, m)]
            regrets.append(min(got.values()) / best - 1.0)
            if best_served is not None:
                gated.append(served(got, measured["torch"], gate) / best_served - 1.0)
        rows.append({"k": k, "points": len(points), "scored": len(regrets), "arms_per_point": statistics.mean(arms),
                     "unmeasured_arms": missing, **summary(regrets, "regret"), **summary(gated, "gated")})
    return rows


def served(times: dict[str, float], torch_ms: float, gate: float) -> float:
    """The time of what a build serves from `times`: its best arm if that beats torch by the
    gate, else torch."""
    best = min(times.values())
    return best if torch_ms / best >= gate else torch_ms


def summary(values: list[float], name: str) -> dict[str, float]:
    if not values:
        return {f"{name}_geomean": math.nan, f"{name}_max": math.nan, f"{name}_over_1pct": 0}
    return {f"{name}_geomean": math.exp(statistics.mean(math.log1p(v) for v in values)) - 1,
            f"{name}_max": max(values), f"{name}_over_1pct": sum(1 for v in values if v > 0.01)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", default=str(DEFAULT_LOG))
    p.add_argument("--db", default=str(DEFAULT_DB), help="the tier file whose cost-model parameters the build ranks with")
    p.add_argument("--k", default="4,6,8,12,16", help="comma-separated top-k values")
    p.add_argument("--md", default=None, help="append the table to this file")
    args = p.parse_args(argv)
    try:
        ks = sorted({int(v) for v in args.k.split(",") if v.strip()})
    except ValueError:
        p.error(f"--k {args.k!r}: comma-separated positive integers")
    if not ks or ks[0] < 1:
        p.error(f"--k {args.k!r}: comma-separated positive integers")
    rows = analyse(Path(args.log), Path(args.db), ks)
    lines = [f"top-k replay of `{Path(args.log).name}` (ranked with `{Path(args.db).name}`'s model)", "",
             "| top-k | arms per point | arms the log lacks | points scored | best-arm regret geomean | max "
             f"| points > 1% | served regret ({GATE:.2f}x gate) geomean | max | points > 1% |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['k']} | {r['arms_per_point']:.1f} | {r['unmeasured_arms']} | {r['scored']} of {r['points']} | "
                     f"{100 * r['regret_geomean']:.2f}% | {100 * r['regret_max']:.1f}% | {r['regret_over_1pct']} | "
                     f"{100 * r['gated_geomean']:.2f}% | {100 * r['gated_max']:.1f}% | {r['gated_over_1pct']} |")
    print("\n".join(lines))
    if args.md:
        with open(args.md, "a", encoding="utf-8") as fh:
            fh.write("\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
