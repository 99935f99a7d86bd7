"""MoE expert GEMMs (the group_gemm family) on the GPU: the loop of cuBLAS GEMMs over experts,
torch._grouped_mm, the untuned Triton grouped kernel (`default`), a tuned pick and the in-run
sweep of the Triton kernel's space, at Mixtral-8x7B and Qwen-MoE shapes; then two MoE layers
end to end (bench/moe_e2e.py) against transformers' own experts forward.

    PYTHONPATH=src python bench/moe.py --out DIR [--quick]

Keys per model: the gate/up projection (E, 2I, H, top_k, x=token) and the down projection
(E, H, I, top_k, x=slot, weighted by the routing weights). Routing: uniform random top-k
(seeded), the metadata (sort by expert, BM padding) inside every sorted-lane Triton call and
every grouped_mm call; the slot lane (triton_slots) reads topk_ids directly.
Tokens M: the table points -- the census (1, 16, 128, 1024, 4096) plus the fill points a build
adds from the family's ladder (pow2: 1, 2, 4, ..., 4096) -- and sizes between them (3, 24, 96,
384, 1536; full mode adds 6, 12, 48, 192, 768, 3072), where a region serves a size it was not
measured at.

The tuned pick is a table built in this run the way `tunedb build` builds one: at each table
point the family's pick rule (fallback torch, 1.05x gate, 3% tie band) over the measured arms,
served at M by the region of the smallest table point >= M. The sweep (quick: configs.sweep_space
+ default; full: the build space configs.config_space) is measured at every M, every tile the
validity predicate accepts there (the slot lane only while M * top_k <= SLOTS_MAX); regret =
tuned / best swept tile - 1, reported at the table points (the goal's census points) and at the
sizes between them (the regions' loss).

Timing: a CUDA graph of n calls, median of 5 replays / n. Every model's stacked weights exceed
the 60 MiB L2 (Mixtral 1.9 GB, Qwen3 805 MB, Qwen1.5 692 MB per projection), but a small M
touches few experts (Qwen3 at M=1: 8 experts, 25-50 MB), so every timed graph cycles through 8
random routings and consecutive calls read different experts, cold as in a model whose layers
each have their own. The loop arm reads counts back to the host and cannot be captured: CUDA
events around eager calls, median of 5. Every arm is first checked against the fp32 reference
(4x grouped_mm's error or 2e-2, whichever is larger).

Expected run time on an H200: quick about 100-150 s (session 10's quick run, with 9 sizes and
no slot tiles, took 43 s; now 18 sizes and 12 more tiles at small M), full about 8 min. Writes
DIR/moe.json and prints markdown tables.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from tunedb import families
from tunedb.families.contract import hook
from tunedb.families.group_gemm import arms, configs
from tunedb.families.group_gemm.keys import make_signature
from tunedb.records import Config

DEVICE = "cuda"
# name -> (E, H, I, top_k)
MODELS = {"mixtral-8x7b": (8, 4096, 14336, 2), "qwen3-30b-a3b": (128, 2048, 768, 8),
          "qwen1.5-moe-a2.7b": (60, 2048, 1408, 4)}
CENSUS_MS = (1, 16, 128, 1024, 4096)
BETWEEN_MS = (3, 24, 96, 384, 1536)
BETWEEN_MS_FULL = BETWEEN_MS + (6, 12, 48, 192, 768, 3072)


def table_points(census=CENSUS_MS) -> tuple[int, ...]:
    """The sizes a build measures: the census plus the fill points of the family's ladder
    between the smallest and largest census size (tunedb.build.plan.fill_points)."""
    from tunedb.buckets import ladder

    kind = families.get("group_gemm").schema.ladder
    return tuple(sorted(set(census) | set(ladder(min(census), max(census), kind))))


TABLE_MS = table_points()


def time_graph(fn, target_ms: float = 2.0, replays: int = 5) -> float:
    """ms per call: a CUDA graph of n calls (n sized for about target_ms), median of replays."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    n = max(1, min(50, math.ceil(target_ms / max(a.elapsed_time(b), 1e-3))))
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(g, stream=stream):
            for _ in range(n):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / n)
    del g
    return statistics.median(times)


def time_eager(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _compile_share(cids: list[str]) -> int:
    """In a worker process: run each tile once on a small problem of the bench's specialisation
    (bf16, N and K multiples of 16, both input forms), which fills Triton's on-disk cache."""
    fam = families.get("group_gemm")
    for form in ("token", "slot"):
        sig = make_signature(4, 256, 256, 2, "bf16", form)
        args, _ = fam.make_inputs(sig, 8, DEVICE, seed=0)
        for cid in cids:
            cfg = Config.sentinel("default") if cid == "default" else configs.parse(cid)
            fam.launcher(cfg, sig)(*args)
    torch.cuda.synchronize()
    return len(cids)


def precompile(cids: list[str], workers: int, log) -> None:
    """Compile the swept tiles in parallel processes (Triton compiles hold the interpreter
    lock; one process compiles about one tile a second): the bench's own first calls then hit
    the on-disk cache. A failure here only costs the time: the first calls compile instead."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    shares = [cids[i::workers] for i in range(workers) if cids[i::workers]]
    try:
        with cf.ProcessPoolExecutor(len(shares), mp_context=mp.get_context("spawn")) as pool:
            done = sum(pool.map(_compile_share, shares))
        log(f"precompiled {done} tiles x 2 forms in {len(shares)} processes: {time.time() - t0:.1f} s")
    except Exception as exc:  # noqa: BLE001 -- the bench compiles on first use instead
        log(f"precompile failed ({type(exc).__name__}: {str(exc)[:200]}); compiling on first use")


def rel_err(y, ref) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def keys_of(model: str):
    e, h, i, k = MODELS[model]
    return {"up": make_signature(e, 2 * i, h, k, "bf16", "token"),
            "down": make_signature(e, h, i, k, "bf16", "slot")}


ROUTINGS = 8  # distinct routings a timed graph cycles through


def rotating(call, args, routes):
    """`call` on args with the next of `routes` as topk_ids at every call: consecutive calls
    touch different experts, as consecutive MoE layers do, so a small M's few experts are not
    L2-resident across the repeats (Qwen3's 8 experts of one projection hold 25-50 MB, under
    the 60 MiB L2; session 10 timed one routing repeated)."""
    it = itertools.cycle(routes)
    return lambda: call(args[0], args[1], next(it), *args[3:])


def measure_key(sig, ms, sweep, log) -> dict:
    """{M: {arm: ms or None}} for the baselines, default and every swept tile; bad arms and
    tiles the validity predicate refuses at M are None."""
    from tunedb.arch import shipped_profile

    fam = families.get("group_gemm")
    major, minor = torch.cuda.get_device_capability()
    profile = shipped_profile(f"sm{major}{minor}")
    out = {}
    max_m = max(ms)
    full, _ = fam.make_inputs(sig, max_m, DEVICE, seed=0)
    for m in ms:
        args = (full[0][:m].contiguous(), full[1], full[2][:m].contiguous()) + \
            ((full[3][:m].contiguous(),) if len(full) > 3 else ())
        ref = fam.reference(sig, *args)
        gen = torch.Generator().manual_seed(m)
        routes = [args[2]] + [arms.random_routing(m, sig.get("E"), sig.get("top_k"), gen, DEVICE)
                              for _ in range(ROUTINGS - 1)]
        row: dict[str, float | None] = {}
        gm_ok = arms.grouped_mm_reason("bf16", DEVICE, sig.get("N"), sig.get("K")) is None
        base_err = None
        if gm_ok:
            y = arms.grouped_mm(sig, *args)
            base_err = rel_err(y, ref)
            row["grouped_mm"] = time_graph(rotating(lambda *a: arms.grouped_mm(sig, *a), args, routes))
        bound = max(4 * (base_err or 0.0), 2e-2)
        y = arms.loop(sig, *args)
        row["loop"] = (time_eager(rotating(lambda *a: arms.loop(sig, *a), args, routes))
                       if rel_err(y, ref) <= bound else None)
        for cid in ["default"] + [c.id for c in sweep]:
            cfg = Config.sentinel("default") if cid == "default" else configs.parse(cid)
            if fam.invalid_reason(cfg, sig, m, profile):
                row[cid] = None
                continue
            run = fam.launcher(cfg, sig)
            try:
                err = rel_err(run(*args), ref)
            except Exception as exc:  # a tile that fails to compile or launch is reported, not timed
                log(f"  {cid} at M={m}: {type(exc).__name__}: {str(exc)[:120]}")
                row[cid] = None
                continue
            if err > bound:
                log(f"  {cid} at M={m}: error {err:.2e} > bound {bound:.2e}")
                row[cid] = None
                continue
            row[cid] = time_graph(rotating(run, args, routes))
        out[m] = row
    return out


def table_pick(rows: dict, table_ms, fallback: str) -> dict:
    """The tuned table: the family's pick rule at each table point ({arm: ms}, None dropped)."""
    rule = hook(families.get("group_gemm"), "pick_rule")()
    picks = {}
    for m in table_ms:
        # the loop is timed eagerly: it competes only where it is the fallback (no grouped_mm)
        times = {a: t for a, t in rows[m].items() if t is not None and (a != "loop" or fallback == "loop")}
        if fallback in times:
            times["torch"] = times.pop(fallback)
        picks[m] = rule.pick(times).winner
    return picks


def served(picks: dict, m: int) -> str:
    above = [p for p in sorted(picks) if p >= m]
    return picks[above[0] if above else max(picks)]


def arm_time(row: dict, arm: str, fallback: str) -> float | None:
    return row.get(fallback if arm == "torch" else arm)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarise(model: str, per_key: dict, table_ms, sweep_ids) -> dict:
    fallback = "grouped_mm" if any("grouped_mm" in r for r in per_key["up"].values()) else "loop"
    picks = {k: table_pick(rows, table_ms, fallback) for k, rows in per_key.items()}
    lines = []
    for m in sorted(per_key["up"]):
        layer: dict[str, float | None] = {}
        entry = {"model": model, "M": m}
        for k, rows in per_key.items():
            row = rows[m]
            pick = served(picks[k], m)
            swept = [row[c] for c in sweep_ids if row.get(c)]
            best = min(swept) if swept else None
            tuned = arm_time(row, pick, fallback)
            entry[k] = {"pick": pick, "tuned": tuned, "best_swept": best, "default": row.get("default"),
                        "grouped_mm": row.get("grouped_mm"), "loop": row.get("loop"),
                        "regret": (tuned / best - 1) if tuned and best else None}
            for arm, t in (("tuned", tuned), ("best", best), ("default", row.get("default")),
                           ("grouped_mm", row.get("grouped_mm")), ("loop", row.get("loop"))):
                layer[arm] = None if t is None or (arm in layer and layer[arm] is None) else layer.get(arm, 0.0) + t
        entry["layer"] = layer
        lines.append(entry)
    return {"model": model, "table_ms": list(table_ms), "picks": {k: {str(m): c for m, c in p.items()} for k, p in picks.items()},
            "rows": lines, "raw": {k: {str(m): r for m, r in rows.items()} for k, rows in per_key.items()}}


def print_model(s: dict) -> None:
    print(f"\n### {s['model']}: one MoE layer (up + down GEMMs), ms; ratios are speedups of the tuned pick\n")
    print("| M | loop | grouped_mm | default | tuned | best swept | tuned/default | tuned/grouped_mm | regret up/down | picks up, down |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    f = lambda t: f"{t:.4f}" if t else "-"  # noqa: E731
    r = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
    for e in s["rows"]:
        L = e["layer"]
        m = f"{e['M']}" if e["M"] in s["table_ms"] else f"{e['M']} (between)"
        reg = "/".join(f"{100 * e[k]['regret']:.1f}%" if e[k]["regret"] is not None else "-" for k in ("up", "down"))
        print(f"| {m} | {f(L['loop'])} | {f(L['grouped_mm'])} | {f(L['default'])} | {f(L['tuned'])} | "
              f"{f(L['best'])} | {r(L['default'], L['tuned'])} | {r(L['grouped_mm'], L['tuned'])} | {reg} | "
              f"{e['up']['pick']}, {e['down']['pick']} |")


def goals(summaries: list, table_ms=TABLE_MS) -> dict:
    rows = [e for s in summaries for e in s["rows"]]
    lay = [e["layer"] for e in rows]
    out = {
        "geomean_tuned_vs_default": geomean([L["default"] / L["tuned"] for L in lay if L["default"] and L["tuned"]]),
        "geomean_tuned_vs_grouped_mm": geomean([L["grouped_mm"] / L["tuned"] for L in lay if L["grouped_mm"] and L["tuned"]]),
        "geomean_tuned_vs_loop": geomean([L["loop"] / L["tuned"] for L in lay if L["loop"] and L["tuned"]]),
        "worst_tuned_vs_best_torch": min((min(t for t in (L["grouped_mm"], L["loop"]) if t) / L["tuned"]
                                          for L in lay if L["tuned"] and (L["grouped_mm"] or L["loop"])), default=None),
    }
    for where, keep in (("", lambda m: True), ("_table_points", lambda m: m in table_ms),
                        ("_between", lambda m: m not in table_ms)):
        regrets = [e[k]["regret"] for e in rows for k in ("up", "down") if e[k]["regret"] is not None and keep(e["M"])]
        out["max_regret" + where] = max(regrets, default=None)
        out["geomean_regret" + where] = geomean([1 + r for r in regrets]) - 1.0 if regrets else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for moe.json")
    p.add_argument("--quick", action="store_true", help="Mixtral + Qwen3 shapes, the sweep_space tiles (about 150 s)")
    p.add_argument("--no-e2e", action="store_true", help="skip the two-layer end-to-end part")
    p.add_argument("--compile-workers", type=int, default=8, help="processes that compile the tiles first (0: none)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/moe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = ("mixtral-8x7b", "qwen3-30b-a3b") if args.quick else tuple(MODELS)
    default = configs.default_config()
    sweep = tuple(c for c in (configs.sweep_space() if args.quick else configs.config_space("sm90")) if c.id != default.id)
    sweep_ids = [c.id for c in sweep] + ["default"]
    table_ms = TABLE_MS
    ms = sorted(set(TABLE_MS + (BETWEEN_MS if args.quick else BETWEEN_MS_FULL)))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, grouped_mm: "
        f"{arms.grouped_mm_reason('bf16', DEVICE) or 'available'}; {len(sweep)} swept tiles + default; M {ms}")
    if args.compile_workers > 0:
        precompile(sweep_ids, args.compile_workers, log)
    summaries = []
    for model in models:
        per_key = {}
        for k, sig in keys_of(model).items():
            t1 = time.time()
            per_key[k] = measure_key(sig, ms, sweep, log)
            log(f"{model} {k} {sig.format()}: {time.time() - t1:.1f} s")
        s = summarise(model, per_key, table_ms, sweep_ids)
        summaries.append(s)
        print_model(s)
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "quick": args.quick,
              "sweep": sweep_ids, "table_ms": list(table_ms), "models": summaries, "goals": goals(summaries)}
    print("\n### goals (geomeans over models x M, per MoE layer)\n")
    for k, v in result["goals"].items():
        print(f"- {k}: {v:.3f}" if v is not None else f"- {k}: -")
    result["kernel_seconds"] = time.time() - t0
    if not args.no_e2e:
        sys.path.insert(0, str(Path(__file__).parent))
        from moe_e2e import run_e2e

        result["e2e"] = run_e2e(models, {s["model"]: s["picks"] for s in summaries}, log)
    result["seconds"] = time.time() - t0
    (out_dir / "moe.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwall {result['seconds']:.0f} s (kernels {result['kernel_seconds']:.0f} s) -> {out_dir / 'moe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
