"""Regret of the group_gemm table against an exhaustive sweep of the Triton grouped kernel's space
(issue 24's goal: <= 2% at the census points), on one GPU.

    PYTHONPATH=src python bench/moe_exhaustive.py --out DIR [--models mixtral-8x7b,qwen3-30b-a3b]
        [--table-ms 1,4,16,64,256,1024,4096] [--grid-ms 1,16,128,1024,4096] [--fill] [--budget-s 330]

Per model, both expert GEMMs (gate/up x=token, down x=slot; bf16, uniform random top-k routings,
8 cycled per timed graph as in bench/moe.py):
1. The tuned table, built the way `tunedb build` builds it: the build's plan (`build.run.plan_build`:
   the build space `configs.config_space`, every valid tile since the family has no cost model to
   take a top-k, plus the sentinels `default` and `torch`) at the table points (the census sizes
   of the shipped build, bench/device_s13_moe.sh; `--fill` adds the pow2 ladder a default build
   fills), all census points weighted alike (as `group_gemm.moe.census` weights them), then
   `build.partition.partition` under the family's pick rule. The same measurements are also
   partitioned under narrower rules (tie band 1% / 0%, and no 1.05x gate) to show what each
   margin costs; the shipped rule is not changed here.
2. The exhaustive grid: `configs.full_grid()` plus the build space (it holds tiles the grid
   lacks), every tile the validity predicate accepts at each grid point.
3. Regret = tuned / best grid tile - 1 at the grid points (the goal's census sizes; sizes that are
   not table points are served by a region, as at run time). Pass 1 times every tile; a tile whose
   single eager call is over 1.3x the fastest eager call seen at that point keeps that eager time
   and is not graph-timed (it cannot be the best). Pass 2 re-times, interleaved in 3 rounds, each
   point's served configs (every rule), the grid's 4 best tiles, torch and the default: regret
   comes from pass 2, so the minimum over ~300 noisy times does not bias it.
`--table FILE` also scores a database file (e.g. the one just built) at the grid points.

Every tile is first checked against the fp32 reference (4x grouped_mm's error or 2e-2). All
tiles are compiled first in parallel processes (bench/prewarm.py: each tile launched once per key). Expected
on an H200 (16 cores): compile 60-90 s (about 420 tiles x 2 forms over 15 processes; faster when
bench/prewarm.py ran before), measuring about 100-150 s for Mixtral + Qwen3, about 40 s more for
Qwen1.5; `--budget-s` stops measuring new points past that many seconds (they are reported as
skipped) so the run ends in time. Writes DIR/moe_exhaustive.json and prints markdown tables.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from moe import MODELS, ROUTINGS, geomean, keys_of, rel_err, rotating, time_graph  # noqa: E402

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.build import partition  # noqa: E402
from tunedb.build.plan import fill_points  # noqa: E402
from tunedb.families.contract import hook  # noqa: E402
from tunedb.families.group_gemm import arms, configs  # noqa: E402
from tunedb.records import Config, Point  # noqa: E402

DEVICE = "cuda"
TABLE_MS = (1, 4, 16, 64, 128, 256, 1024, 4096)  # the census of the shipped build (bench/device_s13_moe.sh MOE_QWEN3_TOKENS)
GRID_MS = (1, 16, 128, 1024, 4096)  # the goal's census sizes
PRUNE = 1.3
TOP_RETIME = 4
RULES = {"shipped": {}, "tie1": {"tie_band": 0.01}, "tie0": {"tie_band": 0.0},
         "tie1_nogate": {"tie_band": 0.01, "min_speedup": 1.0}}


def rules() -> dict:
    base = hook(families.get("group_gemm"), "pick_rule")()
    return {name: dataclasses.replace(base, **over) for name, over in RULES.items()}


def grid_ids() -> list[str]:
    """The exhaustive grid: full_grid() and the build space (which holds tiles the grid lacks),
    less the tiles the predicate refuses on sm90 whatever the key (shared memory, registers)."""
    from tunedb.families.group_gemm.keys import make_signature

    roomy = make_signature(8, 8192, 8192, 1, "bf16", "slot")  # passes every size rule at M=1
    ids = [c.id for c in configs.full_grid()] + [c.id for c in configs.config_space("sm90")]
    return [c for c in dict.fromkeys(ids)
            if configs.invalid_reason(configs.parse(c), roomy, 1, shipped_profile("sm90")) is None]


def table_points(sig, table_ms, fill: bool) -> tuple[Point, ...]:
    census = [Point(sig, m, weight=1.0, calls=1) for m in table_ms]
    return fill_points(census, ladder=fill, kind=families.get("group_gemm").schema.ladder)


def build_arms(sig, m, profile) -> list[str]:
    """What the build measures at (sig, M): every valid build-space tile and the sentinels."""
    from tunedb.build.plan import arms_for_point

    fam = families.get("group_gemm")
    return list(arms_for_point(fam, sig, m, profile, [], exhaustive=True))


def _cfg(cid: str) -> Config:
    return Config.sentinel(cid) if cid in ("default", "torch") else configs.parse(cid)


class Point1:
    """One (signature, M): inputs, reference, routings, and the timing of any arm on them."""

    def __init__(self, sig, m, full):
        self.sig, self.m = sig, m
        self.fam = families.get("group_gemm")
        self.args = (full[0][:m].contiguous(), full[1], full[2][:m].contiguous()) + \
            ((full[3][:m].contiguous(),) if len(full) > 3 else ())
        self.ref = self.fam.reference(sig, *self.args)
        gen = torch.Generator().manual_seed(m)
        self.routes = [self.args[2]] + [arms.random_routing(m, sig.get("E"), sig.get("top_k"), gen, DEVICE)
                                        for _ in range(ROUTINGS - 1)]
        base = rel_err(arms.grouped_mm(sig, *self.args), self.ref) if "torch" in self._torch_ok() else 0.0
        self.bound = max(4 * base, 2e-2)
        self.best_eager = math.inf

    def _torch_ok(self):
        return ("torch",) if arms.grouped_mm_reason("bf16", DEVICE, self.sig.get("N"), self.sig.get("K")) is None else ()

    def run_of(self, cid):
        return self.fam.launcher(_cfg(cid), self.sig)

    def check(self, cid, log):
        """The arm's launcher when it matches the reference, else None (logged)."""
        run = self.run_of(cid)
        try:
            err = rel_err(run(*self.args), self.ref)
        except Exception as exc:  # noqa: BLE001 -- a tile that fails is reported, not timed
            log(f"  {cid} at M={self.m}: {type(exc).__name__}: {str(exc)[:120]}")
            return None
        if not err <= self.bound:
            log(f"  {cid} at M={self.m}: error {err:.2e} > bound {self.bound:.2e}")
            return None
        return run

    def eager(self, run) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(*self.args)
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b)

    def time(self, run, quick: bool = False) -> float:
        fn = rotating(run, self.args, self.routes)
        return time_graph(fn, target_ms=1.0, replays=3) if quick else time_graph(fn)

    def pass1(self, cid, log, prune=True) -> tuple[float | None, bool]:
        """(ms, pruned): graph time, or the eager time of a tile far behind this point's fastest."""
        run = self.check(cid, log)
        if run is None:
            return None, False
        e = self.eager(run)
        self.best_eager = min(self.best_eager, e)
        if prune and e > PRUNE * self.best_eager:
            return e, True
        return self.time(run, quick=True), False


def measure_key(sig, table_ms, grid_ms, fill, profile, log, deadline) -> dict:
    """Pass 1 at every point: the build's arms at table points, the grid at grid points."""
    grid = grid_ids()
    pts = table_points(sig, table_ms, fill)
    ms = sorted({p.m for p in pts} | set(grid_ms))
    fam = families.get("group_gemm")
    full, _ = fam.make_inputs(sig, max(ms), DEVICE, seed=0)
    rows, pruned, skipped = {}, {}, []
    for m in ms:
        if time.time() > deadline:
            skipped.append(m)
            continue
        p = Point1(sig, m, full)
        want = []
        if m in {pt.m for pt in pts}:
            want += build_arms(sig, m, profile)
        if m in grid_ms:
            want += ["default", "torch"] + [c for c in grid if fam.invalid_reason(_cfg(c), sig, m, profile) is None]
        # the sentinels first: the default's eager time anchors the prune from the start
        want = sorted(dict.fromkeys(want), key=lambda c: (c not in ("torch", "default"), c))
        row, cut = {}, []
        for cid in want:
            if cid == "torch" and not p._torch_ok():
                continue
            t, was_pruned = p.pass1(cid, log, prune=cid not in ("torch", "default"))
            row[cid] = t
            if was_pruned:
                cut.append(cid)
        rows[m], pruned[m] = row, cut
        log(f"  M={m}: {len(row)} arms ({len(cut)} pruned)")
    return {"points": [(pt.m, pt.weight) for pt in pts], "rows": rows, "pruned": pruned, "skipped": skipped,
            "full": full}


def tables(sig, measured, rule_set) -> dict:
    """{rule: Partition} over the build's arms at the table points (what tunedb build emits)."""
    pts = [Point(sig, m, weight=w, calls=1) if w else Point(sig, m, weight=0.0, calls=0)
           for m, w in measured["points"] if m in measured["rows"]]
    build = {}
    for m, _ in measured["points"]:
        if m not in measured["rows"]:
            continue
        allowed = set(build_arms(sig, m, PROFILE))
        for cid, t in measured["rows"][m].items():
            if t and cid in allowed:
                build[(m, cid)] = t
    return {name: partition.partition(pts, build, rule, catch_all=True) for name, rule in rule_set.items()}


def served(part, m) -> str:
    for r in part.regions:
        if r.m_hi is None or r.m_hi >= m:
            return r.config_id
    return "torch"


def retime(sig, m, full, cids, log, rounds=3) -> dict:
    """Pass 2: the candidates re-timed in interleaved rounds; median per arm."""
    p = Point1(sig, m, full)
    runs = {c: p.check(c, log) for c in cids}
    times = {c: [] for c in cids if runs[c] is not None}
    for _ in range(rounds):
        for c in times:
            times[c].append(p.time(runs[c]))
    return {c: statistics.median(v) for c, v in times.items()}


def score_key(sig, measured, grid_ms, parts, extra_table, log) -> list[dict]:
    grid = set(grid_ids())
    out = []
    for m in grid_ms:
        row = measured["rows"].get(m)
        if row is None:
            out.append({"M": m, "skipped": True})
            continue
        graph_timed = {c: t for c, t in row.items() if t and c in grid and c not in measured["pruned"][m]}
        top = sorted(graph_timed, key=graph_timed.get)[:TOP_RETIME]
        picks = {name: served(part, m) for name, part in parts.items()}
        if extra_table is not None:
            picks["file"] = extra_table(sig, m)
        cands = list(dict.fromkeys(top + [c for c in picks.values() if c] + ["default"]
                                   + (["torch"] if "torch" in row else [])))
        t2 = retime(sig, m, measured["full"], cands, log)
        grid_t = {c: t for c, t in t2.items() if c in grid}
        best_c = min(grid_t, key=grid_t.get)
        oracle = min(t2.values())
        entry = {"M": m, "best_tile": best_c, "best_ms": grid_t[best_c], "best_in_build_space":
                 best_c in {c.id for c in configs.config_space("sm90")}, "torch_ms": t2.get("torch"),
                 "pass1_best": top[0] if top else None, "arms_pass1": len(row), "pruned": len(measured["pruned"][m]),
                 "rules": {}}
        for name, cid in picks.items():
            if cid is None or cid not in t2:
                entry["rules"][name] = {"pick": cid, "ms": None, "regret": None}
                continue
            entry["rules"][name] = {"pick": cid, "ms": t2[cid], "regret": t2[cid] / grid_t[best_c] - 1.0,
                                    "regret_vs_oracle": t2[cid] / oracle - 1.0}
        out.append(entry)
    return out


def print_key(model, k, sig, scored, parts) -> None:
    print(f"\n### {model} {k}: `{sig.format()}`\n")
    print("table (shipped rule): " + ", ".join(f"<= {r.m_hi}: {r.config_id}" if r.m_hi else f"above: {r.config_id}"
                                              for r in parts["shipped"].regions))
    print("\n| M | served (shipped rule) | ms | best grid tile | ms | in build space | torch ms | regret | "
          + " | ".join(f"regret {n}" for n in parts if n != "shipped") + " |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * (len(parts) - 1))
    f = lambda t: f"{t:.4f}" if t else "-"  # noqa: E731
    r = lambda x: f"{100 * x:+.1f}%" if x is not None else "-"  # noqa: E731
    for e in scored:
        if e.get("skipped"):
            print(f"| {e['M']} | skipped (budget) |" + " |" * (7 + len(parts) - 1))
            continue
        s = e["rules"]["shipped"]
        print(f"| {e['M']} | {s['pick']} | {f(s['ms'])} | {e['best_tile']} | {f(e['best_ms'])} | "
              f"{'yes' if e['best_in_build_space'] else 'no'} | {f(e['torch_ms'])} | {r(s['regret'])} | "
              + " | ".join(r(e["rules"][n]["regret"]) for n in parts if n != "shipped") + " |")


def summary(all_scored) -> dict:
    names = {n for e in all_scored if not e.get("skipped") for n in e["rules"]}
    out = {}
    for n in sorted(names):
        regs = [(e["rules"][n]["regret"], e) for e in all_scored if not e.get("skipped")
                and e["rules"].get(n, {}).get("regret") is not None]
        if not regs:
            continue
        worst = max(regs, key=lambda x: x[0])
        out[n] = {"geomean_regret": geomean([1 + x for x, _ in regs]) - 1.0, "worst_regret": worst[0],
                  "worst_at": f"{worst[1]['key']} M={worst[1]['M']}", "points": len(regs),
                  "over_2pct": [f"{e['key']} M={e['M']}: {100 * x:.1f}% (served {e['rules'][n]['pick']}, "
                                f"best {e['best_tile']}{'' if e['best_in_build_space'] else ' [not in build space]'})"
                                for x, e in regs if x > 0.02]}
    return out


PROFILE = None


def planned_arms(sig, table_ms, grid_ms, fill, profile) -> dict[int, int]:
    """M -> arms pass 1 measures there (what measure_key measures, before pruning)."""
    fam = families.get("group_gemm")
    grid = grid_ids()
    table = {p.m for p in table_points(sig, table_ms, fill)}
    out = {}
    for m in sorted(table | set(grid_ms)):
        want = set(build_arms(sig, m, profile)) if m in table else set()
        if m in grid_ms:
            want |= {"default", "torch"} | {c for c in grid if fam.invalid_reason(_cfg(c), sig, m, profile) is None}
        out[m] = len(want)
    return out


def dry_run(models, table_ms, grid_ms, fill) -> int:
    profile = shipped_profile("sm90")
    total = 0
    for model in models:
        for k, sig in keys_of(model).items():
            arms_at = planned_arms(sig, table_ms, grid_ms, fill, profile)
            total += sum(arms_at.values())
            print(f"{model} {k}: " + ", ".join(f"M={m}: {n}" for m, n in arms_at.items()))
    print(f"{total} pass-1 arm measurements (tiles far behind a point's fastest are pruned after one eager call)")
    return 0


def main(argv: list[str] | None = None) -> int:
    global PROFILE
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="mixtral-8x7b,qwen3-30b-a3b")
    p.add_argument("--table-ms", default=",".join(map(str, TABLE_MS)))
    p.add_argument("--grid-ms", default=",".join(map(str, GRID_MS)))
    p.add_argument("--fill", action="store_true", help="add the pow2 ladder's fill points to the table (a default build)")
    p.add_argument("--table", default=None, help="also score this group_gemm database file")
    p.add_argument("--budget-s", type=float, default=330.0, help="no new point is measured past this")
    p.add_argument("--compile-workers", type=int, default=15)
    p.add_argument("--dry-run", action="store_true", help="print the arms per point and the expected time; no GPU")
    args = p.parse_args(argv)
    models = args.models.split(",")
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
    table_ms = tuple(int(x) for x in args.table_ms.split(","))
    grid_ms = tuple(int(x) for x in args.grid_ms.split(","))
    extra_table = None
    if args.table:
        from tunedb import database

        db = database.load(Path(args.table), "group_gemm", "sm90")
        extra_table = lambda sig, m: db.entries[sig].lookup(m) if sig in db.entries else None  # noqa: E731
    grid = grid_ids()
    n_grid_pts = len(models) * 2 * len(grid_ms)
    n_other = len(models) * 2 * len(set(table_ms) - set(grid_ms))
    print(f"exhaustive grid: {len(grid)} valid tiles (full_grid() + build-space extras); {len(models)} models x 2 "
          f"keys x {len(grid_ms)} grid points ({n_grid_pts}); table points {table_ms}"
          f"{' + pow2 fill' if args.fill else ''}. Expected on an H200: compile 60-90 s, measuring about "
          f"{6 * n_grid_pts + 2 * n_other} s (5-6 s per grid point, 1-2 s per other table point); "
          f"no new point after {args.budget_s:.0f} s", flush=True)
    if args.dry_run:
        return dry_run(models, table_ms, grid_ms, args.fill)
    if not torch.cuda.is_available():
        print("bench/moe_exhaustive.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    major, minor = torch.cuda.get_device_capability()
    PROFILE = shipped_profile(f"sm{major}{minor}")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.compile_workers > 0:
        from prewarm import prewarm  # every tile once per key at M=2: the keys' own specialisation

        work = [(sig.format(), 2, cid) for mdl in models for sig in keys_of(mdl).values() for cid in grid + ["default"]]
        try:
            prewarm("group_gemm", work, args.compile_workers, log)
        except Exception as exc:  # noqa: BLE001 -- only costs time: the passes compile on first use
            log(f"prewarm failed ({type(exc).__name__}: {str(exc)[:200]}); compiling on first use")
    t_compile = time.time() - t0
    deadline = t0 + args.budget_s
    rule_set = rules()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "grid_tiles": len(grid),
              "table_ms": list(table_ms), "grid_ms": list(grid_ms), "fill": args.fill, "compile_s": t_compile,
              "rules": {n: {"tie_band": r.tie_band, "min_speedup": r.min_speedup} for n, r in rule_set.items()},
              "keys": []}
    all_scored = []
    for model in models:
        for k, sig in keys_of(model).items():
            t1 = time.time()
            log(f"{model} {k}: {sig.format()}")
            measured = measure_key(sig, table_ms, grid_ms, args.fill, PROFILE, log, deadline)
            parts = tables(sig, measured, rule_set)
            scored = score_key(sig, measured, grid_ms, parts, extra_table, log)
            for e in scored:
                e["key"] = f"{model} {k}"
            all_scored += scored
            print_key(model, k, sig, scored, parts)
            result["keys"].append({"model": model, "key": k, "signature": sig.format(), "scored": scored,
                                   "tables": {n: [r.to_json() for r in part.regions] for n, part in parts.items()},
                                   "pass1": {str(m): row for m, row in measured["rows"].items()},
                                   "pruned": {str(m): v for m, v in measured["pruned"].items()},
                                   "skipped": measured["skipped"], "seconds": time.time() - t1})
            del measured
            torch.cuda.empty_cache()
            (out_dir / "moe_exhaustive.json").write_text(json.dumps(result, indent=1, default=str))
    result["summary"] = summary(all_scored)
    result["seconds"] = time.time() - t0
    print("\n### regret against the exhaustive grid at the grid points (pass 2 times)\n")
    for n, s in result["summary"].items():
        print(f"- {n} {RULES.get(n, {'from': args.table})}: geomean {100 * s['geomean_regret']:+.2f}%, "
              f"worst {100 * s['worst_regret']:+.2f}% ({s['worst_at']}), {s['points']} points, "
              f"{len(s['over_2pct'])} over 2%")
        for line in s["over_2pct"]:
            print(f"    - {line}")
    (out_dir / "moe_exhaustive.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwall {result['seconds']:.0f} s (compile {t_compile:.0f} s) -> {out_dir / 'moe_exhaustive.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
