"""The linalg pick rule replayed on recorded raw samples: how often two measurements of the same
cell crown the same arm, under the median rule (pick.decide, session 9's tables) and the
paired-rounds variants (pick.decide_paired: the tie decided on the interval of the per-round
ratio to the fastest arm, "plausible" or "shown" within the band).

Two modes, both pure CPU:
  cross A B   two runs (different calls, or two regenerations in one call): the cells and arms
              both measured; per rule the cells with the same winner and, for every
              disagreement, its regret: how much slower one run's pick is than the other's,
              timed by the other run's medians (the worse direction), inside or beyond the band;
              for the native picks and the served ones (the full winner, optional tiers
              included: --picks, both by default since session 25).
  resample A  one run: every cell's rounds drawn with replacement (paired: one draw of round
              indices for all arms) twice, `--draws` times; the share of draws whose two picks
              agree, and of disagreements beyond the band, timed by the full run's medians.

  blocks A  a tune's samples (session 17 on): in cells measured in several blocks (each on fresh
            CUDA graphs and buffers), how far a near-edge arm's ratio moved between blocks, in ns a
            call: near the between-process shift, the noise is per capture (the blocks average it
            away); near zero, it is per process.

  table T   a shipped table keeps only each arm's [median, sigma, rounds]: the cells whose pick
              depends on which end of a normal 90% interval of each ratio is believed (unpaired,
              se of a median 1.253 sigma / sqrt(rounds)); --moved LOG: a later tune's log, and
              how many of the cells it moved were flagged (session 9: W3's table, W4's dry run).

Inputs: bench/linalg_ladder.py's JSON (`cells[].arms[arm].samples_us`, .json or .json.gz) or
`tunedb linalg tune --samples FILE.jsonl` (one cell a line: op, dt, n, batch, samples{arm: [ns]}).
The eager-only arm (`torch_checked`) is never served and is left out.

    python bench/linalg_pick_replay.py cross W1.json.gz W2.json.gz --ops gemm,gemv
    python bench/linalg_pick_replay.py resample W1.json.gz --draws 200
    python bench/linalg_pick_replay.py table W3_linalg.json --moved W4_repro.log
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

from tunedb.families.linalg import configs, pick

Samples = Mapping[str, list[float]]


def load(path: str, first: int | None = None, recorded: dict | None = None) -> dict[tuple, dict[str, list[float]]]:
    """{(op, dtype, n, batch): {arm: [per-round times]}} of a ladder JSON or a tune samples file
    (several comma-separated files merge); `first`: keep only each cell's first rounds (what a
    run without extra rounds would have recorded). A tune's own pick per cell goes to `recorded`."""
    out: dict[tuple, dict[str, list[float]]] = {}
    for one in path.split(","):
        raw = Path(one).read_bytes()
        text = (gzip.decompress(raw) if one.endswith(".gz") else raw).decode()
        if one.endswith((".jsonl", ".jsonl.gz")):
            for line in text.splitlines():
                if line.strip():
                    rec = json.loads(line)
                    key = (rec["op"], rec["dt"], rec["n"], rec["batch"])
                    out[key] = {a: list(s) for a, s in rec["samples"].items() if a != configs.EAGER_ONLY and s}
                    if recorded is not None and "native" in rec:
                        recorded[key] = {"native": rec["native"], "served": rec.get("winner", rec["native"])}
            continue
        for cell in json.loads(text)["cells"]:
            arms = {a: list(r["samples_us"]) for a, r in cell["arms"].items()
                    if a != configs.EAGER_ONLY and r.get("ok") and r.get("samples_us")}
            out[(cell["op"], cell["dtype"], cell["n"], cell["batch"])] = arms
    if first is not None:
        out = {k: {a: v[:first] for a, v in arms.items()} for k, arms in out.items()}
    return out


def median(xs: list[float]) -> float:
    return pick.median(xs)


JITTER = {"ns": pick.LAUNCH_JITTER_NS}  # --jitter-ns: the "low" rule's launch jitter

# each rule: (samples, batch) -> the cell's pick (CellPick: `winner` serves where the optional
# tiers run, `native` elsewhere); PICKS["which"] says which of the two a comparison reads
RULES: dict[str, Callable[[Samples, int], pick.CellPick]] = {
    "median": lambda s, b: pick.decide({a: median(v) for a, v in s.items()}),
    "paired-plausible": lambda s, b: pick.decide_paired(s, tie="plausible"),
    "paired-shown": lambda s, b: pick.decide_paired(s, tie="shown"),
    "low": lambda s, b: pick.decide_low(s, b, jitter_ns=JITTER["ns"]),
    # what `tune --pick low` decides since session 17: the median over blocks of 9 rounds of each
    # block's lower quartile (one block: "low")
    "low-blocks": lambda s, b: pick.decide_low(s, b, jitter_ns=JITTER["ns"], block=pick_blocks()),
}
# --keep TABLE: each cell's (winner, native) in the table a re-tune starts from; the "-keep" rules
# let those arms keep their cells while they tie (families/linalg/keep.py)
INCUMBENT: dict[tuple, tuple[str, str]] = {}
CELL: dict[str, tuple] = {}  # the cell the rules are deciding now (cross sets it)


def _kept(s: Samples, b: int, block: int | None) -> pick.CellPick:
    from tunedb.families.linalg import keep

    got = pick.decide_low(s, b, jitter_ns=JITTER["ns"], block=block)
    return keep.keep_incumbent(got, pick.block_times(s, block), b, INCUMBENT.get(CELL.get("key")),
                               jitter_ns=JITTER["ns"])


RULES["low-keep"] = lambda s, b: _kept(s, b, None)
RULES["low-blocks-keep"] = lambda s, b: _kept(s, b, pick_blocks())
PICKS = {"which": "native"}  # "native" (no optional tier) or "served" (the full winner: session 25)


def chosen(got: pick.CellPick) -> str:
    return got.winner if PICKS["which"] == "served" else got.native


def pick_blocks() -> int:
    from tunedb.families.linalg import ladder

    return ladder.MIN_ROUNDS


def block_shifts(path: str) -> dict:
    """Per arm near its cell's band edge (pick.near_edge on the first block) in cells measured in
    two or more blocks (each on fresh graphs since session 17): how much its ratio to the
    fastest moved between blocks, in ns a call (the ratio's range x the fastest arm's call).
    Compare with the between-process shift (s15: p50 36-40 ns, p90 101-110 ns): near it, the
    noise is per capture and the blocks average it; near zero, it is per process."""
    shifts = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        blocks = [r.get("block", 0) for r in rec.get("rounds", [])]
        arms = {a: v for a, v in rec["samples"].items() if a != configs.EAGER_ONLY and v}
        if not arms or len(set(blocks)) < 2:
            continue
        n = pick_blocks()
        edge_arms = pick.near_edge({a: v[:n] for a, v in arms.items()}, rec["batch"], n)
        k = min(len(v) for v in arms.values()) // n
        per = [{a: pick.quantile(v[i * n:(i + 1) * n], pick.LOW_QUANTILE) for a, v in arms.items()} for i in range(k)]
        call = min(per[0].values()) * rec["batch"]
        for a in edge_arms:
            ratios = [p[a] / min(p.values()) for p in per]
            shifts.append({"cell": [rec["op"], rec["dt"], rec["n"], rec["batch"]], "arm": a, "blocks": k,
                           "shift_ns": round((max(ratios) - min(ratios)) * call, 1)})
    ns = sorted(s["shift_ns"] for s in shifts)
    at = lambda q: ns[min(len(ns) - 1, int(q * len(ns)))] if ns else None  # noqa: E731
    return {"arms": len(ns), "p50_ns": at(0.5), "p90_ns": at(0.9), "rows": shifts}


def regret(judge: Samples, a: str, b: str, stat: Callable[[list[float]], float] = median) -> float:
    """b's pick over a's, timed by `judge`'s medians (or `stat`)."""
    return stat(judge[b]) / stat(judge[a]) - 1.0


def low(xs: list[float]) -> float:
    return pick.quantile(xs, pick.LOW_QUANTILE)


def cell_band(name: str, runs: tuple[Samples, ...], batch: int, band: float, picks: tuple[str, str] = ("", "")) -> float:
    """The band a rule judged the cell with: the tie band, or for "low" the wider of the two
    runs' noise bands (each run widened its own, from its fastest native arm, as pick.decide_low);
    between two picks of the optional tiers, their own band (PickRule.dep_band: the dependency
    margin, session 25); between one of them and a native pick, the dependency margin."""
    rule = pick.LINALG_RULE
    deps = [bool(p) and not rule.is_native(p) for p in picks]
    if all(deps):
        band = max(band, rule.dep_band())
    elif any(deps):  # a dependency arm against a native one: the edge is the dependency margin
        band = max(band, rule.dep_margin)
    if not name.startswith("low") and name != "as tuned":  # tunes decide by "low" since session 17
        return band
    banded = replace(rule, tie_band=band)
    return max(pick.cell_band(pick.low_times(s), batch, banded, JITTER["ns"]) for s in runs)


def cross(ra: dict, rb: dict, rules: list[str], band: float, recorded: tuple[dict, dict] | None = None) -> list[dict]:
    """Per rule (and "as tuned": the tune's own picks, when recorded for both runs): cells with
    the same winner and every disagreement with its regret."""
    keys = sorted(set(ra) & set(rb))
    names = rules + (["as tuned"] if recorded and recorded[0] and recorded[1] else [])
    rows = []
    for name in names:
        same, moves, cells = 0, [], 0
        for k in keys:
            arms = sorted(set(ra[k]) & set(rb[k]))
            if not arms:
                continue
            sa, sb = {a: ra[k][a] for a in arms}, {a: rb[k][a] for a in arms}
            CELL["key"] = k
            if name == "as tuned":
                if k not in recorded[0] or k not in recorded[1]:
                    continue
                pa, pb = recorded[0][k][PICKS["which"]], recorded[1][k][PICKS["which"]]
            else:
                pa, pb = chosen(RULES[name](sa, k[3])), chosen(RULES[name](sb, k[3]))
            cells += 1
            if pa == pb:
                same += 1
                continue
            # "low" (and a tune since session 17) times an arm by its lower quartile
            stat = low if name.startswith("low") or name == "as tuned" else median
            both = pa in sa and pb in sb and pa in sb and pb in sa
            worst = max(regret(sa, pa, pb, stat), regret(sb, pb, pa, stat)) if both else float("nan")
            # the two picks' gap as each run timed them: a tie flip is inside the band in one run
            gap = min(abs(regret(sa, pa, pb, stat)), abs(regret(sb, pa, pb, stat))) if both else float("nan")
            moves.append({"cell": list(k), "a": pa, "b": pb, "regret": round(worst, 4), "gap": round(gap, 4),
                          "band": round(cell_band(name, (sa, sb), k[3], band, (pa, pb)), 4)})
        beyond = [m for m in moves if not m["regret"] <= m["band"]]
        ties = [m for m in moves if m["gap"] <= m["band"]]
        rows.append({"rule": name, "cells": cells, "same": same, "moves": len(moves),
                     "beyond_band": len(beyond), "edge_ties": len(ties),
                     "max_regret": max((m["regret"] for m in moves), default=0.0), "move_list": moves})
    return rows


def ambiguous(s: Samples) -> bool:
    """The paired intervals leave the cell open: some arm's interval straddles the band edge in
    a way that moves the pick (the "plausible" and "shown" picks differ)."""
    return pick.ambiguous(s)


def draw_picks(full: Samples, name: str, rng: random.Random, rounds: int, max_rounds: int, batch: int = 1) -> str:
    """One simulated re-measurement: `rounds` paired rounds drawn with replacement from the
    recorded ones; while the cell is ambiguous and fewer than `max_rounds` are drawn, `rounds`
    more (what `tunedb linalg tune --max-rounds` does on the GPU); then the rule."""
    n = min(len(v) for v in full.values())
    idx = [rng.randrange(n) for _ in range(rounds)]
    take = lambda: {a: [v[i] for i in idx] for a, v in full.items()}  # noqa: E731
    while len(idx) + rounds <= max_rounds and ambiguous(take()):
        idx += [rng.randrange(n) for _ in range(rounds)]
    return chosen(RULES[name](take(), batch))


def resample(run: dict, rules: list[str], band: float, draws: int, seed: int,
             rounds: int | None = None, max_rounds: int | None = None) -> list[dict]:
    rows = []
    for name in rules:
        rng = random.Random(seed)
        agree = beyond = total = 0
        worst = 0.0
        for k in sorted(run):
            full = run[k]
            n = rounds or min(len(v) for v in full.values())
            for _ in range(draws):
                picks = [draw_picks(full, name, rng, n, max_rounds or n, k[3]) for _ in range(2)]
                total += 1
                if picks[0] == picks[1]:
                    agree += 1
                    continue
                r = max(regret(full, picks[0], picks[1]), regret(full, picks[1], picks[0]))
                worst = max(worst, r)
                beyond += r > band
        rows.append({"rule": name, "cells": len(run), "draws": draws, "rounds": rounds, "max_rounds": max_rounds,
                     "agree": agree / total, "beyond_band": beyond / total, "max_regret": worst})
    return rows


MOVED = re.compile(r"\s+linalg\|op=(\w+)\|dt=(\w+)\|n=(\d+) batch=(\d+): (\S+) -> (\S+) \(the old winner ([+-][\d.]+)%")


def table_ambiguous(path: str, z: float = 1.645) -> tuple[int, set]:
    """(cells, the cells whose pick moves between the low and high ends of each arm's ratio to
    the fastest, from the table's medians and sigmas)."""
    rule = pick.LINALG_RULE
    data = json.loads(Path(path).read_text())
    total, amb = 0, set()
    for sig, entry in data["entries"].items():
        key = dict(part.split("=") for part in sig.split("|")[1:])
        for point, ev in entry.get("evidence", {}).items():
            arms = {a: v for a, v in ev.items() if not a.startswith("_") and isinstance(v, list)
                    and a != configs.EAGER_ONLY and v[0] > 0}
            if not arms:
                continue
            total += 1
            med = {a: v[0] for a, v in arms.items()}
            rel = {a: 1.253 * v[1] / math.sqrt(v[2]) / v[0] for a, v in arms.items()}
            f = min(med, key=med.get)

            def chosen(sign: int) -> str:
                tied = [a for a in med if med[a] / med[f] * (1 + sign * z * math.hypot(rel[a], rel[f]) * (a != f))
                        <= 1 + rule.tie_band]
                return min(tied, key=lambda a: (rule.simplicity(a), a != rule.fallback, a))
            if chosen(-1) != chosen(+1):
                amb.add((key["op"], key["dt"], int(key["n"]), int(point[2:])))
    return total, amb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("cross", "resample", "table", "blocks"))
    ap.add_argument("--moved", help="table: a later tune's log (its 'changed winner' lines)")
    ap.add_argument("runs", nargs="+", help="cross: two runs; resample: one or more (a run: FILE[,FILE...])")
    ap.add_argument("--first", type=int, default=None,
                    help="use only each cell's first N rounds (a run without the extra rounds)")
    ap.add_argument("--ops", default="", help="comma-separated ops (default: all)")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="resample: rounds per draw (default: recorded)")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="resample: draw --rounds more while the cell is ambiguous, up to this many")
    ap.add_argument("--jitter-ns", type=float, default=pick.LAUNCH_JITTER_NS,
                    help="the low rule's launch jitter, ns a call (0: the tie band alone)")
    ap.add_argument("--picks", default="both", choices=("native", "served", "both"),
                    help="cross: compare the native picks, the served ones (the full winner, optional "
                         "tiers included), or both (default)")
    ap.add_argument("--keep", default=None, metavar="TABLE.json",
                    help="the table a re-tune starts from: the *-keep rules let its picks keep their cells "
                         "while they tie (families/linalg/keep.py)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.keep:
        from tunedb.database import schema
        from tunedb.families.linalg import keep

        INCUMBENT.update(keep.incumbents(schema.load(Path(args.keep), "linalg").entries))
    rules = [r for r in args.rules.split(",") if r]
    bad = [r for r in rules if r not in RULES]
    if bad:
        ap.error(f"unknown rule(s) {bad}; rules: {', '.join(RULES)}")
    ops = {o for o in args.ops.split(",") if o}
    JITTER["ns"] = args.jitter_ns
    if args.mode == "table":
        total, amb = table_ambiguous(args.runs[0])
        print(f"{args.runs[0]}: {total} cells, {len(amb)} ambiguous at 90% (normal approximation, unpaired)")
        moved = {}
        if args.moved:
            for line in Path(args.moved).read_text().splitlines():
                m = MOVED.match(line)
                if m:
                    moved[(m[1], m[2], int(m[3]), int(m[4]))] = (m[5], m[6], float(m[7]))
            print(f"{args.moved}: {len(moved)} cells moved; {len(set(moved) & amb)} of them flagged ambiguous")
            for k, (a, b, pct) in sorted(moved.items()):
                print(f"  {' '.join(map(str, k))}: {a} -> {b} (old {pct:+.1f}%){'  ambiguous' if k in amb else ''}")
        if args.out:
            moved_json = {" ".join(map(str, k)): v for k, v in moved.items()}
            Path(args.out).write_text(json.dumps({"cells": total, "ambiguous": sorted(map(list, amb)),
                                                  "moved": moved_json}, indent=1))
        return 0
    if args.mode == "blocks":
        rows = []
        for path in args.runs:
            for one in path.split(","):
                got = block_shifts(one)
                print(f"{one}: {got['arms']} near-edge arm(s) in cells of 2+ blocks; their ratio's move between "
                      f"blocks: p50 {got['p50_ns']} ns, p90 {got['p90_ns']} ns a call")
                rows.append({"run": one, **got})
        if args.out:
            Path(args.out).write_text(json.dumps({"mode": "blocks", "rows": rows}, indent=1))
        return 0
    picks: list[dict] = [{} for _ in args.runs]
    runs = [{k: v for k, v in load(p, args.first, rec).items() if not ops or k[0] in ops}
            for p, rec in zip(args.runs, picks)]
    band = pick.TIE_BAND
    if args.mode == "cross":
        if len(runs) != 2:
            ap.error(f"cross takes two runs, got {len(runs)}")
        rows = []
        for which in (("native", "served") if args.picks == "both" else (args.picks,)):
            PICKS["which"] = which
            rows += [{**r, "picks": which}
                     for r in cross(runs[0], runs[1], rules, band, None if args.first else (picks[0], picks[1]))]
        print(f"{'picks':>7} {'rule':>17} {'cells':>5} {'same':>5} {'same %':>7} {'moves':>5} {'> band':>6} "
              f"{'ties':>5} {'max regret':>10}")
        for r in rows:
            print(f"{r['picks']:>7} {r['rule']:>17} {r['cells']:>5} {r['same']:>5} {100 * r['same'] / max(1, r['cells']):>6.1f}% "
                  f"{r['moves']:>5} {r['beyond_band']:>6} {r['edge_ties']:>5} {100 * r['max_regret']:>9.2f}%")
            for m in r["move_list"]:
                print(f"{'':>27}{' '.join(map(str, m['cell']))}: {m['a']} / {m['b']} ({100 * m['regret']:+.2f}%, "
                      f"gap {100 * m['gap']:.2f}%; band {100 * m['band']:.1f}%)")
    else:
        rows = []
        print(f"{'run':>40} {'rule':>17} {'cells':>5} {'agree':>7} {'> band':>7} {'max regret':>10}")
        for path, run in zip(args.runs, runs):
            for r in resample(run, rules, band, args.draws, args.seed, args.rounds, args.max_rounds):
                r["run"] = path
                rows.append(r)
                print(f"{Path(path).name[:40]:>40} {r['rule']:>17} {r['cells']:>5} {100 * r['agree']:>6.1f}% "
                      f"{100 * r['beyond_band']:>6.2f}% {100 * r['max_regret']:>9.2f}%")
    if args.out:
        Path(args.out).write_text(json.dumps({"mode": args.mode, "runs": args.runs, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
