"""How reproducible a build's regions are, replayed on the CPU from real measurement logs of the
same census (e.g. session 12's eight GPU builds of the Llama-3-8B decode census, one and two
GPUs over three device calls): each log is partitioned again under each pick-rule variant, and
every pair of logs is compared at every measured point (signature, M): do they serve the same
config, and what does serving one log's pick cost when timed by the other log (cross regret)?
The served gain (torch time over the pick's, timed by the other log) shows what stability costs.

    python bench/partition_stability.py --logs 'bench/results/s12_*/scaling/*/measurements.jsonl' \
        --census bench/census/llama-3-8b_decode.json --top-k 8 --gate-noise 0,0.02,0.04,0.06

Pure CPU (no GPU): the logs carry every arm's median; the plan comes from the census (dry run).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import itertools
import json
import sys
from pathlib import Path

from tunedb import families, pipeline
from tunedb.build import steps as buildsteps
from tunedb.build.partition import objective_table, partition
from tunedb.measure.log import read_measurements
from tunedb.records import Entry

from region_agreement import geomean  # noqa: E402 - bench/ is this script's directory


def regions_of(plans, meas, rule) -> dict:
    by_sig: dict = {}
    for x in meas:
        by_sig.setdefault(x.signature, []).append(x)
    out = {}
    for p in plans:
        got = by_sig.get(p.signature, [])
        alpha = {q.m: q.eager_share for q in p.points}
        out[p.signature] = Entry(p.signature, partition(p.points, objective_table(got, alpha, reference=rule.fallback), rule, catch_all=True).regions)
    return out


def times(meas) -> dict:
    return {(x.signature, x.m, x.config_id): x.median_ms for x in meas if x.status.ok}


def compare(plans, ra, rb, judge) -> tuple[int, int, list[float], list[float]]:
    """Points served the same; points; B's pick over A's pick and torch over B's pick, timed by `judge`."""
    same = total = 0
    regret, gain = [], []
    for p in plans:
        for q in p.points:
            a, b = ra[p.signature].lookup(q.m), rb[p.signature].lookup(q.m)
            total += 1
            same += a == b
            ta, tb = judge.get((p.signature, q.m, a)), judge.get((p.signature, q.m, b))
            tt = judge.get((p.signature, q.m, "torch"))
            if ta and tb:
                regret.append(tb / ta)
            if tb and tt:
                gain.append(tt / tb)
    return same, total, regret, gain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", required=True, help="glob of measurement logs of one census (>= 2)")
    ap.add_argument("--census", required=True)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--family", default="gemm")
    ap.add_argument("--gate-noise", default="0,0.02,0.04", help="comma-separated PickRule.gate_noise values")
    ap.add_argument("--tie-band", default="", help="comma-separated tie bands (default: the family's)")
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.logs))
    if len(paths) < 2:
        raise SystemExit(f"--logs {args.logs!r} matched {len(paths)} file(s); need at least 2 logs of one census")
    opts = pipeline.BuildOptions(out="/nonexistent", simulate=True, dry_run=True, top_k=args.top_k)
    plans = pipeline.build([("census", pipeline.read_census(args.census))], opts).plans
    logs = {p: read_measurements(p) for p in paths}
    judge = {p: times(m) for p, m in logs.items()}
    base = buildsteps.pick_rule(families.get(args.family), None)
    bands = [float(x) for x in args.tie_band.split(",") if x] or [base.tie_band]
    rows = []
    print(f"{len(paths)} logs, {sum(len(p.points) for p in plans)} points, {len(paths) * (len(paths) - 1) // 2} pairs")
    print(f"{'tie band':>8} {'gate noise':>10} {'same pts':>9} {'worst pair':>10} {'regret gm':>9} "
          f"{'regret max':>10} {'gain gm':>8}")
    for band, noise in itertools.product(bands, [float(x) for x in args.gate_noise.split(",")]):
        rule = dataclasses.replace(base, tie_band=band, gate_noise=noise)
        regs = {p: regions_of(plans, m, rule) for p, m in logs.items()}
        fracs, regret, gain = [], [], []
        for a, b in itertools.combinations(paths, 2):
            same, total, r1, _ = compare(plans, regs[a], regs[b], judge[a])
            _, _, r2, _ = compare(plans, regs[b], regs[a], judge[b])
            fracs.append(same / total)
            regret += r1 + r2
        for a, b in itertools.permutations(paths, 2):  # a's picks timed by b's run
            gain += compare(plans, regs[a], regs[a], judge[b])[3]
        row = {"tie_band": band, "gate_noise": noise, "same_mean": sum(fracs) / len(fracs), "same_min": min(fracs),
               "regret_gm": geomean(regret), "regret_max": max(regret), "gain_gm": geomean(gain)}
        rows.append(row)
        print(f"{band:>8.3f} {noise:>10.3f} {100 * row['same_mean']:>8.1f}% {100 * row['same_min']:>9.1f}% "
              f"{row['regret_gm']:>9.4f} {row['regret_max']:>10.4f} {row['gain_gm']:>8.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"logs": paths, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
