"""The triton_decode lane against cuBLAS (F.linear) for decode weights at M = 1, 4, 8, 16, and what
each of its ideas buys (split-K, atomic vs deterministic reduction, PDL, stages).

    PYTHONPATH=src python bench/decode_lane.py --out decode_lane.json [--budget-s 180] [--quick]

Timer: weights rotated cold (enough copies to exceed 2x the 60 MiB L2), a CUDA graph of
back-to-back calls (one per copy, at least 16), median over 7 timed replays, per call. % of
4.3 TB/s counts the weight's bytes (N*K*2), as ANCHORS.md "Decode" does. Every arm is checked
against the fp32 reference before it is timed. The sweep per (shape, M) is a pruned grid
(slabs x splits that give 132..2048 CTAs, each with and without PDL, atomic twins for split > 1);
the ablation re-times single ideas at two weights; the layer chain runs q, k, v, o, gate+up, down
of Llama-3-8B (cold, rotated over layer copies) with each GEMM's best config, PDL off and on.
Expected run time on the H200: about 3 minutes (--budget-s caps the sweep; compiles included).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from tunedb.families.gemm import FAMILY, configs_decode

BW = 4.3e12
L2 = 60 * 2 ** 20
LLAMA = [(1024, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 4096), (128256, 4096)]
ANCHOR = [(3584, 3584)]  # the other anchor weights are Llama's
CENSUS = [(1024, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]  # bench/census llama decode
MS = (1, 4, 8, 16)
SMS = 132


def sweep_configs(n: int, k: int, quick: bool) -> list[str]:
    tiles = [(32, 256), (64, 256), (32, 512)] if quick else [(32, 256), (64, 256), (32, 512), (64, 128), (128, 128)]
    out = []
    for bn, bk in tiles:
        blocks, k_tiles = -(-n // bn), -(-k // bk)
        splits = [s for s in (1, 2, 4, 8, 16, 32) if s <= k_tiles and SMS <= blocks * s <= 2048]
        if not splits:  # a wide weight: no split; a narrow one: the deepest split that fits
            splits = [1] if blocks >= SMS else [max(s for s in (1, 2, 4, 8, 16, 32) if s <= k_tiles)]
        warps = 8 if bn == 128 else 4
        for s in splits:
            for pdl in (False, True):
                out.append(configs_decode.make(bn, bk, warps, 4, s, False, pdl).id)
                if s > 1:
                    out.append(configs_decode.make(bn, bk, warps, 4, s, True, pdl).id)
    return out


class Cold:
    """Weight copies for one (N, K): enough to read cold on every call."""

    def __init__(self, n: int, k: int, dt=torch.bfloat16, copies: int | None = None):
        nbytes = n * k * 2
        self.copies = copies or max(2, math.ceil(2 * L2 / nbytes) + 1)
        self.ws = [torch.randn(n, k, device="cuda", dtype=dt) * k ** -0.5 for _ in range(self.copies)]
        self.nbytes = nbytes


def time_graph(calls, reps: int = 7) -> float:
    """Median per-call microseconds of a graph that runs `calls` (a list of thunks) back to back."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / len(calls))
    del g
    return statistics.median(ts)


def arm_calls(cid: str, sig, cold: Cold, x, out) -> list:
    fn = FAMILY.launcher(FAMILY.parse_config(cid), sig)
    per = max(16, cold.copies)
    return [(lambda w=cold.ws[i % cold.copies]: fn(x, w, None, out)) for i in range(per)]


def checked(cid: str, sig, cold: Cold, x, ref=None) -> bool:
    ref = FAMILY.reference(sig, x, cold.ws[0]) if ref is None else ref
    y = FAMILY.launch(FAMILY.parse_config(cid), sig, x, cold.ws[0])
    torch.cuda.synchronize()
    err = (y.float() - ref).abs().max().item()
    rounding = (ref.to(x.dtype).float() - ref).abs().max().item()
    return bool(err <= 4 * rounding + 2e-3 * ref.abs().max().item())


def measure_point(n: int, k: int, m: int, cold: Cold, cids: list[str], deadline: float) -> dict:
    sig = FAMILY.make_signature("gemm", "bf16", n, k)
    x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row = {"N": n, "K": k, "M": m, "MB": round(cold.nbytes / 1e6, 1),
           "torch_us": time_graph(arm_calls("torch", sig, cold, x, out)), "configs": {}, "failed": []}
    ref = FAMILY.reference(sig, x, cold.ws[0])
    for cid in cids:
        if time.time() > deadline and row["configs"]:
            row["truncated"] = True
            break
        if not checked(cid, sig, cold, x, ref):
            row["failed"].append(cid)
            continue
        row["configs"][cid] = time_graph(arm_calls(cid, sig, cold, x, out))
    if not row["configs"]:
        raise RuntimeError(f"N={n} K={k} M={m}: every decode config failed the reference check: {row['failed']}")
    best = min(row["configs"], key=row["configs"].get)
    row.update(best=best, best_us=row["configs"][best], speedup=row["torch_us"] / row["configs"][best],
               torch_bw=cold.nbytes / row["torch_us"] / 1e-6 / BW, best_bw=cold.nbytes / row["configs"][best] / 1e-6 / BW)
    return row


def best_of(row: dict, pred) -> tuple[str, float] | None:
    got = {c: t for c, t in row["configs"].items() if pred(configs_decode.parse(c))}
    if not got:
        return None
    c = min(got, key=got.get)
    return c, got[c]


def ablation(rows: list[dict]) -> list[dict]:
    """Per measured point: the best config restricted to one side of each idea."""
    out = []
    for r in rows:
        entry = {"N": r["N"], "K": r["K"], "M": r["M"]}
        for name, a, b in (("split_k (1 vs >1, PDL off)", lambda c: c.param("split_k") == 1 and not c.param("pdl"),
                            lambda c: c.param("split_k") > 1 and not c.param("pdl")),
                           ("reduction (det vs atomic, split>1, PDL off)",
                            lambda c: c.param("split_k") > 1 and not c.param("atomic") and not c.param("pdl"),
                            lambda c: c.param("atomic") and not c.param("pdl")),
                           ("PDL (off vs on, back-to-back)", lambda c: not c.param("pdl"), lambda c: c.param("pdl"))):
            ba, bb = best_of(r, a), best_of(r, b)
            if ba and bb:
                entry[name] = {"off": ba, "on": bb, "gain": ba[1] / bb[1]}
        out.append(entry)
    return out


def stages_ablation(row: dict, cold: Cold) -> dict:
    cfg = configs_decode.parse(row["best"])
    sig = FAMILY.make_signature("gemm", "bf16", row["N"], row["K"])
    x = (torch.rand(row["M"], row["K"], device="cuda") * 2 - 1).to(torch.bfloat16)
    out = torch.empty(row["M"], row["N"], device="cuda", dtype=torch.bfloat16)
    res = {}
    _, bn, bk = cfg.param("block")
    for st in (2, 3, 4, 5):
        cid = configs_decode.make(bn, bk, cfg.param("warps"), st, cfg.param("split_k"), cfg.param("atomic"),
                                  cfg.param("pdl")).id
        if checked(cid, sig, cold, x):
            res[cid] = time_graph(arm_calls(cid, sig, cold, x, out))
    return res


LAYER = [("q", 4096, 4096), ("k", 1024, 4096), ("v", 1024, 4096), ("o", 4096, 4096),
         ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def layer_chain(m: int, best: dict, layers: int = 4) -> dict:
    """A Llama-3-8B layer's GEMMs in sequence over `layers` cold copies: torch, the best
    configs without PDL and their PDL twins. Per-layer microseconds."""
    ws = {name: [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(layers)]
          for name, n, k in LAYER}
    x = (torch.rand(m, 4096, device="cuda") * 2 - 1).to(torch.bfloat16)
    h = (torch.rand(m, 14336, device="cuda") * 2 - 1).to(torch.bfloat16)
    outs = {name: torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for name, n, _ in LAYER}

    def chain(pick):
        calls = []
        for layer in range(layers):
            for name, n, k in LAYER:
                sig = FAMILY.make_signature("gemm", "bf16", n, k)
                fn = FAMILY.launcher(FAMILY.parse_config(pick(name, n, k)), sig)
                src = h if name == "down" else outs["q"] if name == "o" else x
                calls.append(lambda fn=fn, src=src, w=ws[name][layer], o=outs[name]: fn(src, w, None, o))
        return time_graph(calls) * len(LAYER)  # per layer

    def twin(cid: str, pdl: bool) -> str:
        c = configs_decode.parse(cid)
        _, bn, bk = c.param("block")
        return configs_decode.make(bn, bk, c.param("warps"), c.param("stages"), c.param("split_k"),
                                   c.param("atomic"), pdl).id

    res = {"M": m, "torch_us": chain(lambda name, n, k: "torch")}
    res["decode_nopdl_us"] = chain(lambda name, n, k: twin(best[(n, k, m)], False))
    res["decode_pdl_us"] = chain(lambda name, n, k: twin(best[(n, k, m)], True))
    res["pdl_gain"] = res["decode_nopdl_us"] / res["decode_pdl_us"]
    res["speedup_vs_torch"] = res["torch_us"] / res["decode_pdl_us"]
    return res


def precompile(cids: list[str]) -> None:
    """Compile the sweep's binaries in parallel (tunedb prebuild's workers, the same cache key a
    launch computes) so that the sweep's budget is spent timing, not compiling."""
    from tunedb.families.gemm import prebuild

    t0 = time.time()
    summary = prebuild.run_jobs(prebuild.jobs_for([configs_decode.parse(c) for c in cids], ("bf16",)), "sm90", 16)
    print(f"precompiled {summary['ok']}/{summary['jobs']} decode binaries in {time.time() - t0:.1f} s"
          + (f"; failed: {[f['job']['config_id'] for f in summary['failed']]}" if summary["failed"] else ""), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_lane.json")
    ap.add_argument("--budget-s", type=float, default=180.0, help="stop sweeping new configs after this")
    ap.add_argument("--quick", action="store_true", help="fewer slabs per shape")
    args = ap.parse_args(argv)
    start = time.time()
    shapes = LLAMA + ANCHOR
    precompile(sorted({c for n, k in shapes for c in sweep_configs(n, k, args.quick)}))
    # each point's share of the budget, the rest (ablation, chain) after
    per_point = 0.8 * args.budget_s / (len(shapes) * len(MS))
    rows, best = [], {}
    for n, k in shapes:
        cold = Cold(n, k)
        cids = sweep_configs(n, k, args.quick)
        for m in MS:
            row = measure_point(n, k, m, cold, cids, time.time() + per_point)
            rows.append(row)
            best[(n, k, m)] = row["best"]
            print(f"N={n:6d} K={k:5d} M={m:2d}  torch {row['torch_us']:7.2f} us ({row['torch_bw']:5.1%})  "
                  f"decode {row['best_us']:7.2f} us ({row['best_bw']:5.1%})  x{row['speedup']:.3f}  {row['best']}"
                  f"{'  (truncated)' if row.get('truncated') else ''}", flush=True)
        del cold
        torch.cuda.empty_cache()
    stages = {}
    for n, k in ((4096, 4096), (14336, 4096)):
        cold = Cold(n, k)
        for m in (1, 16):
            r = next(r for r in rows if (r["N"], r["K"], r["M"]) == (n, k, m))
            stages[f"{n}x{k} M={m}"] = stages_ablation(r, cold)
        del cold
    chains = [layer_chain(m, best) for m in (1, 16)]
    llama_sp = [r["speedup"] for r in rows if (r["N"], r["K"]) in CENSUS]
    geo = math.exp(sum(map(math.log, llama_sp)) / len(llama_sp))
    big = [r for r in rows if r["M"] == 1 and r["MB"] >= 16]
    summary = {"geomean_speedup_llama_census": geo, "goal_geomean": 1.15,
               "min_bw_m1_16MB_plus": min(r["best_bw"] for r in big), "goal_bw": 0.85,
               "seconds": round(time.time() - start, 1)}
    print("\n| N x K | MB | M | torch us | % 4.3 TB/s | decode us | % 4.3 TB/s | speedup | best config |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['N']} x {r['K']} | {r['MB']} | {r['M']} | {r['torch_us']:.2f} | {r['torch_bw']:.0%} | "
              f"{r['best_us']:.2f} | {r['best_bw']:.0%} | {r['speedup']:.3f}x | `{r['best']}` |")
    abl = ablation(rows)
    print("\n| N x K | M | idea | off (config, us) | on (config, us) | gain |\n|---|---|---|---|---|---|")
    for e in abl:
        if (e["N"], e["K"]) not in ((4096, 4096), (14336, 4096), (1024, 4096), (4096, 14336)):
            continue
        for name, v in e.items():
            if isinstance(v, dict):
                print(f"| {e['N']} x {e['K']} | {e['M']} | {name} | `{v['off'][0]}` {v['off'][1]:.2f} | "
                      f"`{v['on'][0]}` {v['on'][1]:.2f} | {v['gain']:.3f}x |")
    print("\nstages:", json.dumps({k: {c: round(t, 2) for c, t in v.items()} for k, v in stages.items()}, indent=1))
    print("\n| layer chain (q,k,v,o,gate_up,down; cold) | M | torch us | decode no PDL us | decode PDL us | PDL gain | vs torch |")
    print("|---|---|---|---|---|---|---|")
    for c in chains:
        print(f"| Llama-3-8B layer | {c['M']} | {c['torch_us']:.1f} | {c['decode_nopdl_us']:.1f} | "
              f"{c['decode_pdl_us']:.1f} | {c['pdl_gain']:.3f}x | {c['speedup_vs_torch']:.3f}x |")
    print(f"\ngeomean speedup over the Llama-3-8B census GEMMs (M=1,4,8,16): {geo:.3f}x (goal 1.15x); "
          f"min % of 4.3 TB/s at M=1 for weights >= 16 MB: {summary['min_bw_m1_16MB_plus']:.1%} (goal 85%)")
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "ablation": abl, "stages": stages, "layer_chain": chains, "summary": summary,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
