"""Block-scaled fp8: the seed tiles a build always measures, derived from a recorded build, and
what the recorded numbers say about the candidate rule (CPU only: no GPU, every number the log's).

    PYTHONPATH=src python bench/fp8_block_seeds.py [--log bench/results/s13_F/block_measurements.jsonl.gz]
        [--census bench/census/quant_llama_fp8-block.json] [--out seeds.json]
    PYTHONPATH=src python bench/fp8_block_seeds.py --score EXH_LOG.jsonl.gz [--table FILE]
        (a table's picks against an exhaustive log: `bash bench/device_s14.sh fp8-block-exh`)

1. Derive: per size class (M <= 16, the decode lane's sizes; M > 16), the greedy set cover of
   "within 3% of the point's best measured time" over the log's points: the fewest configs such
   that every point has one of them within 3% of its best (ties: the config nearest the best on
   the points left, then its id). Compared with pruning.BLOCK_SEEDS (which must equal it).
2. Leave one width out: seeds derived on the other widths, the candidate rule (the pruning
   model's rank() at --top-k, with those seeds) at each held-out point: the best measured time
   among its candidates / the point's best measured time, and the configs per point.
3. Replay: the log filtered to what the rule would measure (configs the log lacks are unknown,
   so an estimate can only say the rule loses nothing the log saw), rebuilt with
   `tunedb build --replay` (the build's own partition and pick rule; the family's 3% tie band,
   and 1%), and the table's pick at each census point against the best the log measured there.
What no recorded log can say: how the ~100-170 valid configs per point that no build measured
compare (bench/fp8_block_exhaustive.py measures them on the GPU).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import sys
import tempfile
from typing import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "bench" / "results" / "s13_F" / "block_measurements.jsonl.gz"
SWEEP = ROOT / "bench" / "results" / "s14_C" / "fp8_block_exhaustive.json"  # all 188 valid configs
# every block-valid config through the build's own protocol (`tunedb build --exhaustive`, s14 E)
EXH = ROOT / "bench" / "results" / "s14_E" / "fp8_block_exh_measurements.jsonl.gz"
# the decode points again through the build's protocol after the gv tensor-core path joined the
# space (s16 F: every block-valid config at the six M <= 16 points of 1024/4096/14336 x 4096)
EXH_GV = ROOT / "bench" / "results" / "s16_F" / "exh_measurements.jsonl.gz"
EXH_TOL = 1.02  # the protocol sweep's cover leaves 1% of a 3% goal to run-to-run noise
CENSUS = ROOT / "bench" / "census" / "quant_llama_fp8-block.json"
TOL = 1.03


def read_times(path: Path) -> dict[tuple[int, int, int], dict[str, float]]:
    """(N, K, M) -> {config: median us} of the block-scaled, correct, non-sentinel measurements."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out: dict[tuple[int, int, int], dict[str, float]] = collections.defaultdict(dict)
    with opener(path, "rt") as fh:
        for line in fh:
            r = json.loads(line)
            fields = dict(f.split("=", 1) for f in r["signature"].split("|")[1:])
            if fields.get("scale") != "block" or r.get("status") != "ok" or not r.get("median_ms"):
                continue
            if r["config"] in ("heuristic", "default", "torch"):
                continue
            out[(int(fields["N"]), int(fields["K"]), int(r["M"]))][r["config"]] = r["median_ms"] * 1000.0
    return dict(out)


def size_class(m: int) -> str:
    from tunedb.families.scaled_mm.pruning import seed_class

    return seed_class(m)


def near(times: dict[str, float], tol: float = TOL) -> set[str]:
    best = min(times.values())
    return {c for c, t in times.items() if t <= best * tol}


def cover(points: dict[tuple[int, int, int], dict[str, float]], tol: float = TOL,
          start: Sequence[str] = ()) -> list[str]:
    """The greedy set cover of the points by their near-best configs (see the module docstring),
    extending `start` (points one of its configs already covers need nothing more)."""
    left = {p for p in points if not set(start) & near(points[p], tol)}
    seeds: list[str] = []
    while left:
        count = collections.Counter(c for p in left for c in near(points[p], tol))

        def key(c: str) -> tuple:
            mean = sum(points[p].get(c, math.inf) / min(points[p].values()) for p in left) / len(left)
            return (-count[c], mean, c)

        best = min(count, key=key)
        seeds.append(best)
        left = {p for p in left if best not in near(points[p], tol)}
    return seeds


def derive(times: dict[tuple[int, int, int], dict[str, float]], tol: float = TOL,
           sweep: dict[tuple[int, int, int], dict[str, float]] | None = None,
           exh: dict[tuple[int, int, int], dict[str, float]] | None = None,
           exh_tol: float = EXH_TOL,
           exh_gv: dict[tuple[int, int, int], dict[str, float]] | None = None) -> dict[str, tuple[str, ...]]:
    """Per size class, the cover of the build log's points, extended by the cover of the
    exhaustive sweep's points that it leaves uncovered, then by the cover at `exh_tol` of the
    protocol sweep's (`exh`: the build's own timer over every valid config), then by the cover at
    `exh_tol` of the decode sweep after the gv tensor-core path (`exh_gv`). Each source's times
    are compared only among themselves: two device calls' timings are never one run. The tighter
    tolerance of the last: session 14's table, whose candidates came within 2.8% of E's best at
    1024x4096 M=1, measured 3.8% behind in the independent sweep of session 15 A."""
    out = {}
    for cls in ("decode", "prefill"):
        seeds = cover({p: t for p, t in times.items() if size_class(p[2]) == cls}, tol)
        if sweep:
            seeds += cover({p: t for p, t in sweep.items() if size_class(p[2]) == cls}, tol, start=seeds)
        if exh:
            seeds += cover({p: t for p, t in exh.items() if size_class(p[2]) == cls}, exh_tol, start=seeds)
        if exh_gv:
            seeds += cover({p: t for p, t in exh_gv.items() if size_class(p[2]) == cls}, exh_tol, start=seeds)
        out[cls] = tuple(seeds)
    return out


def read_sweep(path: Path) -> dict[tuple[int, int, int], dict[str, float]]:
    """(N, K, M) -> {config: pass-1 us} of bench/fp8_block_exhaustive.py's JSON (the Triton
    configs it swept; the bf16, heuristic and table rows left out)."""
    out: dict[tuple[int, int, int], dict[str, float]] = collections.defaultdict(dict)
    for r in json.loads(Path(path).read_text())["rows"]:
        if r["status"] == "ok" and r["lane"] not in ("bf16", "heuristic", "table"):
            out[(int(r["N"]), int(r["K"]), int(r["M"]))][r["config"]] = float(r["us"])
    return dict(out)


def candidate_set(n: int, k: int, m: int, top_k: int, seeds: dict[str, tuple[str, ...]] | None) -> list[str]:
    """What a build measures at (N, K, M) (sentinels aside): the pruning model's rank() under
    `seeds` (None: no seeds)."""
    from tunedb import families
    from tunedb.arch import shipped_profile
    from tunedb.families.scaled_mm import pruning

    fam = families.get("scaled_mm_fp8")
    arch = shipped_profile("sm90")
    sig = fam.make_signature("scaled_mm", n, k, "bf16", "block")
    cands = [c for c in fam.candidates(sig, m, arch) if not c.is_sentinel]
    saved = pruning.BLOCK_SEEDS
    pruning.BLOCK_SEEDS = seeds or {"decode": (), "prefill": ()}
    try:
        return [c for c in pruning.PruningModel(arch).rank(sig, m, cands, top_k) if c not in ("heuristic", "torch")]
    finally:
        pruning.BLOCK_SEEDS = saved


def leave_one_width_out(times, top_k: int, with_seeds: bool) -> list[dict]:
    rows = []
    widths = sorted({p[:2] for p in times})
    for w in widths:
        train = {p: t for p, t in times.items() if p[:2] != w}
        seeds = derive(train) if with_seeds else None
        for p in sorted(q for q in times if q[:2] == w):
            cset = candidate_set(*p, top_k, seeds)
            known = [times[p][c] for c in cset if c in times[p]]
            rows.append({"N": p[0], "K": p[1], "M": p[2], "configs": len(cset),
                         "best_in_set_vs_best": min(known) / min(times[p].values()) if known else None,
                         "seeds": list((seeds or {}).get(size_class(p[2]), ()))})
    return rows


def replay(log: Path, census: Path, times, top_k: int, seeds, tie_band: float | None = None) -> list[dict] | None:
    """The log filtered to the rule's candidates (+ the sentinels, + every config the rule
    measures at another point of the signature: the build's cross-evaluation draws from those),
    rebuilt with `tunedb build --replay`; the table's pick per point against the log's best."""
    from tunedb import cli

    opener = gzip.open if str(log).endswith(".gz") else open
    keep: dict[tuple[int, int], set[str]] = collections.defaultdict(lambda: {"heuristic", "torch", "default"})
    for n, k, m in times:
        keep[(n, k)].update(candidate_set(n, k, m, top_k, seeds))
    with tempfile.TemporaryDirectory() as tmp:
        filtered = Path(tmp) / "filtered.jsonl"
        with opener(log, "rt") as fh, open(filtered, "w") as out:
            for line in fh:
                r = json.loads(line)
                f = dict(x.split("=", 1) for x in r["signature"].split("|")[1:])
                if f.get("scale") == "block" and r["config"] in keep[(int(f["N"]), int(f["K"]))]:
                    out.write(line if line.endswith("\n") else line + "\n")
        rc = cli.main(["build", "--family", "scaled_mm_fp8", "--out", str(Path(tmp) / "db"), "--no-fill",
                       "--top-k", str(top_k), "--census", str(census), "--replay", str(filtered)]
                      + (["--tie-band", str(tie_band)] if tie_band is not None else []))
        if rc:  # the rule's cross-evaluation asks for a (config, M) the device never measured
            return None
        table = json.loads((Path(tmp) / "db" / "sm90" / "scaled_mm_fp8.json").read_text())["entries"]
    return pick_rows(table, times, heuristic_times(log))


def pick_rows(entries: dict, times, heur) -> list[dict]:
    """Per census point of `times`: a table's block-scaled pick, its time there (None when the
    measurements lack it), the best measured config, and the ratios."""
    rows = []
    for (n, k, m), t in sorted(times.items()):
        regions = entries[f"scaled_mm_fp8|op=scaled_mm|dt=fp8|N={n}|K={k}|scale=block|out=bf16"]["regions"]
        pick = next(c for hi, c in regions if hi is None or m <= hi)
        pick_us = heur.get((n, k, m)) if pick == "heuristic" else t.get(pick)
        best = min(t, key=t.get)
        rows.append({"N": n, "K": k, "M": m, "pick": pick, "pick_us": pick_us, "best": best, "best_us": t[best],
                     "table_vs_best": pick_us / t[best] if pick_us else None,
                     "heuristic_vs_table": heur[(n, k, m)] / pick_us if pick_us and (n, k, m) in heur else None})
    return rows


def heuristic_times(log: Path) -> dict[tuple[int, int, int], float]:
    opener = gzip.open if str(log).endswith(".gz") else open
    out = {}
    with opener(log, "rt") as fh:
        for line in fh:
            r = json.loads(line)
            f = dict(x.split("=", 1) for x in r["signature"].split("|")[1:])
            if r["config"] == "heuristic" and r.get("median_ms") and f.get("scale") == "block":
                out[(int(f["N"]), int(f["K"]), int(r["M"]))] = r["median_ms"] * 1000.0
    return out


def score(table_path: Path, log: Path) -> dict:
    """A database file's block-scaled picks against an exhaustive log measured through the build's
    protocol (`tunedb build --exhaustive`, e.g. `bench/device_s14.sh fp8-block-exh`): per census
    point the pick's time / the log's best, and heuristic / pick."""
    entries = json.loads(Path(table_path).read_text())["entries"]
    rows = pick_rows(entries, read_times(log), heuristic_times(log))
    ratios = [r["table_vs_best"] for r in rows if r["table_vs_best"]]
    return {"rows": rows, "worst": max(ratios), "geomean": geomean(ratios),
            "over_3pct": sum(r > TOL for r in ratios), "unmeasured_picks": sum(1 for r in rows if not r["pick_us"]),
            "heuristic_vs_table": geomean([r["heuristic_vs_table"] for r in rows])}


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=LOG)
    ap.add_argument("--sweep", type=Path, default=SWEEP, help="an exhaustive sweep's JSON whose uncovered points extend the cover")
    ap.add_argument("--exh", type=Path, default=EXH,
                    help="a protocol sweep's log (`tunedb build --exhaustive`) whose points the cover reaches at 2%%")
    ap.add_argument("--exh-gv", type=Path, default=EXH_GV,
                    help="the decode points' protocol sweep after the gv tensor-core path, covered at 2%%")
    ap.add_argument("--census", type=Path, default=CENSUS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--score", type=Path, default=None, metavar="EXH_LOG",
                    help="only score --table against this exhaustive log (protocol timing) and exit")
    ap.add_argument("--table", type=Path, default=ROOT / "src" / "tunedb" / "db" / "sm90" / "scaled_mm_fp8.json")
    args = ap.parse_args()
    from tunedb.families.scaled_mm import pruning

    if args.score:
        res = score(args.table, args.score)
        for r in res["rows"]:
            ratio = f"{r['table_vs_best']:.3f}" if r["table_vs_best"] else "unmeasured"
            print(f"{r['N']}x{r['K']} M={r['M']}: {r['pick']} / {r['best']} = {ratio}")
        print(f"{args.table.name} vs {args.score.name}: worst {res['worst']:.3f}, geomean {res['geomean']:.4f}, "
              f"{res['over_3pct']} point(s) over {TOL}, {res['unmeasured_picks']} pick(s) the log lacks; "
              f"heuristic / table {res['heuristic_vs_table']:.2f}")
        if args.out:
            args.out.write_text(json.dumps(res, indent=1))
        return 0

    times = read_times(args.log)
    seeds = derive(times, sweep=read_sweep(args.sweep) if args.sweep else None,
                   exh=read_times(args.exh) if args.exh else None,
                   exh_gv=read_times(args.exh_gv) if args.exh_gv else None)
    same = {k: tuple(v) for k, v in pruning.BLOCK_SEEDS.items()} == seeds
    print(f"derived seeds from {args.log.name} ({len(times)} points): {seeds}")
    print(f"pruning.BLOCK_SEEDS {'matches' if same else 'DIFFERS: ' + str(pruning.BLOCK_SEEDS)}")
    result: dict = {"seeds": seeds, "matches_pruning": same, "lowo": {}, "replay": {}}
    print("\nleave one width out (seeds derived on the other widths): best measured in the candidate set / best measured")
    for top_k in (8, 16):
        for with_seeds in (False, True):
            rows = leave_one_width_out(times, top_k, with_seeds)
            worst = max(rows, key=lambda r: r["best_in_set_vs_best"] or 0)
            name = f"top-{top_k}{' + seeds' if with_seeds else ''}"
            result["lowo"][name] = rows
            print(f"  {name:<16} worst {worst['best_in_set_vs_best']:.3f} ({worst['N']}x{worst['K']} M={worst['M']}), "
                  f"configs per point {sum(r['configs'] for r in rows) / len(rows):.1f}")
    print("\nreplay of the log filtered to each rule's candidates (the table's pick / the log's best at each census point)")
    for name, top_k, s, band in (("top-16 (shipped)", 16, None, None), ("top-8 + seeds", 8, seeds, None),
                                 ("top-16 + seeds", 16, seeds, None), ("top-16 + seeds, tie 0.01", 16, seeds, 0.01)):
        rows = replay(args.log, args.census, times, top_k, s, band)
        result["replay"][name] = rows
        if rows is None:
            print(f"  {name:<26} not replayable: its build would cross-evaluate a config at an M where the log has none")
            continue
        worst = max(rows, key=lambda r: r["table_vs_best"] or 0)
        print(f"  {name:<26} worst {worst['table_vs_best']:.3f} ({worst['N']}x{worst['K']} M={worst['M']}: "
              f"{worst['pick']} vs {worst['best']}), geomean {geomean([r['table_vs_best'] for r in rows]):.3f}; "
              f"heuristic / table geomean {geomean([r['heuristic_vs_table'] for r in rows]):.2f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
