"""PickRule.gate_noise checked on held-out data: repeated GEMM builds of censuses other than the
Llama-3-8B decode census it was chosen on (session 12), replayed on the CPU.

A group is two or more measurement logs of one census from separate device calls (sessions 3-8:
the system tier's build-all, the Llama / Whisper / Conformer model tunes). Every log of a group is
partitioned again under each gate_noise value, over the points every log of the group measured
and, at each point, only the configs every log measured there (so two logs choose among the same
arms; the config space changed between sessions). Then every pair of logs is compared at every
point: served the same config? what does one log's pick cost timed by the other log (cross
regret)? and the served gain over torch (torch's time over the pick's, timed by the other log).
The objective is GPU time (alpha 0: these tunes recorded no census eager shares). "served":
the share of points a log serves with a config other than torch; ">band": the share of
cross-timed comparisons where the other log's pick is more than the tie band slower.

    python bench/gate_noise_heldout.py --gate-noise 0,0.02,0.04,0.06,0.08 --out heldout.json

Pure CPU; the logs carry every arm's median.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import itertools
import json
import sys
import tempfile
from pathlib import Path

from tunedb import families
from tunedb.build import steps as buildsteps
from tunedb.build.partition import objective_table, partition
from tunedb.measure.log import read_measurements
from tunedb.records import Entry, Point

from region_agreement import geomean  # noqa: E402 - bench/ is this script's directory

RESULTS = Path(__file__).resolve().parent / "results"
# census -> its logs, each from its own device call (same GPU kind, driver, torch, Triton)
GROUPS: dict[str, tuple[str, ...]] = {
    "buildall (system tier)": ("2026-11-30_system_sm90_buildall_measurements.jsonl.gz",
                               "2026-11-30_s3_system_sm90_buildall_measurements.jsonl.gz",
                               "2026-11-29_system_sm90_buildall_measurements.jsonl.gz"),
    "llama tune": ("2026-11-30_s5_call1_tune_llama_outhost.jsonl.gz", "2026-11-30_s5_call5_tune_llama.jsonl.gz",
                   "2026-11-30_s6_call1_tune_llama.jsonl.gz", "2026-11-30_s8_V4_tune_llama.jsonl.gz"),
    "whisper-b8 tune": ("2026-11-30_s6_call3_tune_whisper-b8.jsonl.gz", "2026-11-30_s8_V1_tune_whisper-b8.jsonl.gz",
                        "2026-11-30_s8_V3_tune_whisper-b8.jsonl.gz", "2026-11-30_s8_V5_tune_whisper-b8.jsonl.gz"),
    "whisper-b1 tune": ("2026-11-30_s5_call2_tune_whisper-b1_outhost.jsonl.gz",
                        "2026-11-30_s5_call4_tune_whisper-b1.jsonl.gz"),
    "conformer tune": ("2026-11-30_s5_call3_tune_conformer-b8_outhost.jsonl.gz",
                       "2026-11-30_s6_call4_tune_conformer.jsonl.gz", "2026-11-30_s8_V3_tune_conformer.jsonl.gz"),
}


def load(path: Path, tmp: Path) -> list:
    if path.suffix == ".gz":
        plain = tmp / path.stem
        plain.write_bytes(gzip.decompress(path.read_bytes()))
        path = plain
    return [m for m in read_measurements(path) if m.status.ok]


def common_tables(logs: dict[str, list]) -> dict[str, dict]:
    """Per log: {signature: {(M, config): objective}} restricted to the (signature, M, config)
    triples every log of the group measured; a point needs torch and one other config."""
    keys = [{(m.signature, m.m, m.config_id) for m in meas} for meas in logs.values()]
    shared = set.intersection(*keys)
    points = {(s, mm) for s, mm, _ in shared}
    keep = {(s, mm) for s, mm in points
            if (s, mm, "torch") in shared and sum(1 for k in shared if k[:2] == (s, mm)) >= 2}
    out = {}
    for name, meas in logs.items():
        by_sig: dict = {}
        for m in meas:
            if (m.signature, m.m, m.config_id) in shared and (m.signature, m.m) in keep:
                by_sig.setdefault(m.signature, []).append(m)
        out[name] = {s: objective_table(ms, 0.0) for s, ms in by_sig.items()}
    return out


def regions(tables: dict, rule) -> dict:
    out = {}
    for sig, table in tables.items():
        pts = [Point(sig, m) for m in sorted({m for m, _ in table})]
        out[sig] = Entry(sig, partition(pts, table, rule, catch_all=True).regions)
    return out


def compare(tables_a: dict, ra: dict, rb: dict, judge: dict) -> tuple[int, int, list[float]]:
    """Points served the same by ra and rb; points; rb's pick over ra's, timed by `judge`."""
    same = total = 0
    regret = []
    for sig, table in tables_a.items():
        for m in sorted({m for m, _ in table}):
            a, b = ra[sig].lookup(m), rb[sig].lookup(m)
            total += 1
            same += a == b
            ta, tb = judge[sig].get((m, a)), judge[sig].get((m, b))
            if ta and tb:
                regret.append(tb / ta)
    return same, total, regret


def gains(ra: dict, judge: dict) -> list[float]:
    """Torch's time over ra's pick at each point, timed by `judge` (another log)."""
    out = []
    for sig, table in judge.items():
        for m in sorted({m for m, _ in table}):
            pick = ra[sig].lookup(m)
            tp, tt = table.get((m, pick)), table.get((m, "torch"))
            if tp and tt:
                out.append(tt / tp)
    return out


def replay(group: str, logs: dict[str, list], noises: list[float], base) -> list[dict]:
    tables = common_tables(logs)
    names = list(tables)
    npts = sum(len({m for m, _ in t}) for t in tables[names[0]].values())
    print(f"\n{group}: {len(names)} logs, {npts} shared points, {len(names) * (len(names) - 1) // 2} pairs")
    print(f"{'gate noise':>10} {'same pts':>9} {'worst pair':>10} {'regret gm':>9} {'regret max':>10} "
          f"{'gain gm':>8} {'served':>7} {'>band':>6}")
    rows = []
    for noise in noises:
        rule = dataclasses.replace(base, gate_noise=noise)
        regs = {n: regions(tables[n], rule) for n in names}
        fracs, regret, gain = [], [], []
        for a, b in itertools.combinations(names, 2):
            same, total, r1 = compare(tables[a], regs[a], regs[b], tables[a])
            _, _, r2 = compare(tables[b], regs[b], regs[a], tables[b])
            fracs.append(same / total)
            regret += r1 + r2
        for a, b in itertools.permutations(names, 2):
            gain += gains(regs[a], tables[b])
        served = [sum(regs[n][sig].lookup(m) != base.fallback for sig, t in tables[n].items()
                      for m in {m for m, _ in t}) / npts for n in names]
        row = {"group": group, "gate_noise": noise, "points": npts, "pairs": len(fracs),
               "same_mean": sum(fracs) / len(fracs), "same_min": min(fracs),
               "regret_gm": geomean(regret), "regret_max": max(regret, default=1.0), "gain_gm": geomean(gain),
               "served_mean": sum(served) / len(served),
               "beyond_band": sum(r > 1.0 + base.tie_band for r in regret) / max(1, len(regret))}
        rows.append(row)
        print(f"{noise:>10.3f} {100 * row['same_mean']:>8.1f}% {100 * row['same_min']:>9.1f}% "
              f"{row['regret_gm']:>9.4f} {row['regret_max']:>10.4f} {row['gain_gm']:>8.4f}"
              f" {100 * row['served_mean']:>6.1f}%"
              f" {100 * row['beyond_band']:>5.1f}%")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gate-noise", default="0,0.02,0.04,0.06,0.08")
    ap.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    noises = [float(x) for x in args.gate_noise.split(",") if x]
    want = [g.strip() for g in args.groups.split(",") if g.strip()] or list(GROUPS)
    bad = [g for g in want if g not in GROUPS]
    if bad:
        raise SystemExit(f"unknown group(s) {bad}; groups: {', '.join(GROUPS)}")
    base = buildsteps.pick_rule(families.get("gemm"), None, 0.0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for group in want:
            logs = {name: load(RESULTS / name, Path(tmp)) for name in GROUPS[group]}
            rows += replay(group, logs, noises, base)
    if args.out:
        Path(args.out).write_text(json.dumps({"groups": {g: GROUPS[g] for g in want}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
