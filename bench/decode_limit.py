"""What physically limits the decode goals of issue 18, measured in one run on the H200.

    PYTHONPATH=src python bench/decode_limit.py --out decode_limit.json [--quick] [--budget-s 50]
        [--census bench/census/llama-3-8b_decode.json] [--shapes 28672x4096] [--batches 1,16] [--no-e2e]

(a) Read roofline: per decode weight of the census (distinct N x K of its gemm/gemm_act points),
    the fastest pure read of it: a Triton read (bench/read_roofline.py: block, warps, grid and
    PDL swept) or torch.sum (whole, per row), the second reference. Timed like the GEMMs, it is
    the ceiling of any M <= 16 GEMV at that size, its fixed per-kernel cost included (a GEMM arm
    that beats it by > 2% is named in the verdicts: there the ceiling is too low).
(b) At M = 1, 4, 8, 16 per weight: cuBLAS (F.linear) and the triton_decode lane's best config
    (bench/decode_lane.sweep_configs: slabs x splits, atomic and PDL twins; each checked against
    the fp32 reference first), each as % of 4.3 TB/s and of the read roofline, and lane / cuBLAS.
(c) End to end: Llama-3-8B, 2 decoder layers (bench/e2e_models.build, random bf16 weights), one
    decode step per batch: the step's CUDA graph; a graph of only its Linear GEMMs (the model's
    own weights, same order, cuBLAS); the same with each GEMM replaced by the read roofline's best
    read of its weight, and by the lane's best config. Bound on the speedup from GEMM selection
    alone = T_step / (T_step - T_gemm_cublas + T_gemm_at_roofline).
Timing (bench/graph_timing.replay_ms): (a) and (b) rotate enough weight copies to exceed 2x the
60 MiB L2, >= 16 calls per graph, median of 7 replays per call; (c) graphs of 3 steps (the
weights, 0.9 GB for 2 layers, exceed L2 anyway). Back-to-back calls: a _pdl arm overlaps its own
previous call there, so PDL arms (read and lane) are also reported apart from the non-PDL best.
Expected run time on the H200: about 90 s (compiles included; --budget-s caps the lane sweep,
--quick halves it).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import decode_bounds as db  # noqa: E402
from graph_timing import replay_ms  # noqa: E402  (imports torch lazily)

MS = (1, 4, 8, 16)
L2 = 60 * 2 ** 20
DEVICE, DT = "cuda", "bf16"  # the CPU smoke test runs the same path on cpu in fp16 under the interpreter


def _dtype():
    import torch

    return torch.float16 if DT == "fp16" else torch.bfloat16


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def graph_us(call, copies: int, min_calls: int = 16) -> float:
    """Per-call microseconds of call(i) for i over >= min_calls calls rotating `copies` weights."""
    for i in range(copies):  # warm: compiles, allocations, workspaces
        call(i)
    _sync()
    return replay_ms(lambda i: call(i % copies), max(min_calls, copies)) * 1e3


def copies_for(nbytes: int) -> int:
    return max(2, math.ceil(2 * L2 / nbytes) + 1)


def read_arms(ws: list, sms: int, quick: bool) -> dict:
    """(a) at one size: every read config (checked: partials sum to the weight's sum) and torch.sum."""
    import torch

    import read_roofline as rr

    numel = ws[0].numel()
    flats = [w.view(-1) for w in ws]
    ones = torch.ones(numel, device=DEVICE, dtype=ws[0].dtype)  # every element read once: the sum is exact
    res, bad = {}, {}
    for cfg in rr.configs(quick):
        fn = rr.launcher(cfg, numel, sms, interpret=DEVICE != "cuda")
        out = torch.empty(fn.grid, device=DEVICE, dtype=torch.float32)
        got = fn(ones, out).double().sum().item()
        if got != numel:
            bad[cfg.id] = f"read {got} elements of {numel}"
            continue
        res[cfg.id] = graph_us(lambda i: fn(flats[i], out), len(ws))
    del ones
    ref_t = {name: graph_us(lambda i, f=f: f(ws[i]), len(ws)) for name, f in TORCH_READS.items()}
    both = {**res, **ref_t}  # the roofline is the fastest read, whoever does it
    best = min(both, key=both.get)
    nopdl = min((c for c in both if not c.endswith("_pdl")), key=both.get)
    return {"configs": res, "failed": bad, "torch": ref_t, "best": best, "best_us": both[best],
            "best_nopdl": nopdl, "best_nopdl_us": both[nopdl]}


TORCH_READS = {"torch.sum": lambda w: w.sum(dtype=__import__("torch").float32),
               "torch.sum(dim=1)": lambda w: w.sum(dim=1, dtype=__import__("torch").float32)}


def read_call(read_id: str, w, sms: int):
    """A thunk reading weight w with the read arm `read_id` (a read_roofline config or torch.sum)."""
    import torch

    import read_roofline as rr

    if read_id in TORCH_READS:
        return lambda: TORCH_READS[read_id](w)
    fn = rr.launcher(rr.by_id(read_id), w.numel(), sms, interpret=DEVICE != "cuda")
    flat, out = w.view(-1), torch.empty(fn.grid, device=DEVICE, dtype=torch.float32)
    return lambda: fn(flat, out)


def lane_arms(n: int, k: int, m: int, ws: list, cids: list[str], deadline: float) -> dict:
    """(b) at one (weight, M): cuBLAS and every lane config that passes the reference check."""
    import torch
    import torch.nn.functional as F

    from tunedb.arch import shipped_profile
    from tunedb.families.gemm import FAMILY

    sig = FAMILY.make_signature("gemm", DT, n, k)
    x = (torch.rand(m, k, device=DEVICE) * 2 - 1).to(_dtype())
    out = torch.empty(m, n, device=DEVICE, dtype=_dtype())
    row = {"cublas_us": graph_us(lambda i: F.linear(x, ws[i]), len(ws)), "configs": {}, "failed": []}
    ref = FAMILY.reference(sig, x, ws[0])
    rounding = (ref.to(x.dtype).float() - ref).abs().max().item()
    arch = shipped_profile("sm90")
    for cid in cids:
        if time.time() > deadline and row["configs"]:
            row["truncated"] = True
            break
        why = FAMILY.invalid_reason(FAMILY.parse_config(cid), sig, m, arch)
        if why:
            row.setdefault("invalid", {})[cid] = why
            continue
        fn = FAMILY.launcher(FAMILY.parse_config(cid), sig)
        out.fill_(float("nan"))  # a config that writes nothing fails the check
        fn(x, ws[0], None, out)
        err = (out.float() - ref).abs().max().item()  # decode_lane.checked's bound
        if not err <= 4 * rounding + 2e-3 * ref.abs().max().item():
            row["failed"].append(cid)
            continue
        row["configs"][cid] = graph_us(lambda i: fn(x, ws[i], None, out), len(ws))
    if row["configs"]:
        row["lane"] = min(row["configs"], key=row["configs"].get)
        row["lane_us"] = row["configs"][row["lane"]]
        nopdl = [c for c in row["configs"] if not c.endswith("_pdl")]
        if nopdl:
            row["lane_nopdl"] = min(nopdl, key=row["configs"].get)
            row["lane_nopdl_us"] = row["configs"][row["lane_nopdl"]]
    return row


# session 9's winners (bench/results/2026-12-01_s9_W1_decode_lane.log): timed first, so that a
# sweep cut short by --budget-s has them
PRIOR = ("dk8_n128x128_w8_s4_at_pdl", "dk8_n128x128_w8_s4_pdl", "dk1_n64x128_w4_s4", "dk1_n64x128_w4_s4_pdl",
         "dk16_n64x128_w4_s4_at_pdl", "dk8_n32x256_w4_s4_at_pdl", "dk1_n128x128_w8_s4", "dk4_n64x128_w4_s4",
         "dk1_n32x256_w4_s4_pdl", "dk1_n128x128_w8_s4_pdl")


def lane_configs(n: int, k: int, quick: bool) -> list[str]:
    """The lane's sweep at one weight: session 9's winners, the shipped grid, then
    decode_lane.sweep_configs (slabs x splits, atomic and PDL twins); lane_arms drops the invalid."""
    from decode_lane import sweep_configs

    from tunedb.families.gemm import configs_decode

    return list(dict.fromkeys([*PRIOR, *(c.id for c in configs_decode.grid()), *sweep_configs(n, k, quick)]))


def weights_and_gemms(shapes, quick: bool, budget_s: float, sms: int) -> tuple[dict, list[dict]]:
    """(a) and (b), one weight at a time (its cold copies shared by both)."""
    import torch

    reads, rows = {}, []
    start = time.time()
    for idx, (n, k) in enumerate(shapes):
        try:
            _one_weight(n, k, idx, shapes, reads, rows, quick, budget_s, start, sms)
        except Exception as exc:  # noqa: BLE001 - one weight failing leaves the others measured
            import traceback

            traceback.print_exc()
            reads.setdefault(f"{n}x{k}", {"N": n, "K": k})["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        torch.cuda.empty_cache()
    return reads, rows


def _one_weight(n, k, idx, shapes, reads, rows, quick, budget_s, start, sms) -> None:
    """(a) then (b) at one weight, into reads and rows; the lane sweep's share of the budget is
    what is left over the points left."""
    import torch

    nbytes = db.weight_bytes(n, k)
    ws = [torch.randn(n, k, device=DEVICE, dtype=_dtype()) * k ** -0.5 for _ in range(copies_for(nbytes))]
    rd = reads[f"{n}x{k}"] = {"N": n, "K": k, "MB": round(nbytes / 1e6, 1), **read_arms(ws, sms, quick)}
    rd["read_bw"] = db.share(nbytes, rd["best_us"])
    print(f"read {n:6d}x{k:<6d} {rd['MB']:7.1f} MB  best {rd['best_us']:7.2f} us ({rd['read_bw']:5.1%}) "
          f"{rd['best']}  no-PDL {rd['best_nopdl_us']:7.2f} us  torch.sum {rd['torch']['torch.sum']:7.2f} us "
          f"(dim=1 {rd['torch']['torch.sum(dim=1)']:.2f})", flush=True)
    cids = lane_configs(n, k, quick)
    for j, m in enumerate(MS):
        left = budget_s - (time.time() - start)
        points_left = (len(shapes) - idx) * len(MS) - j
        g = lane_arms(n, k, m, ws, cids, time.time() + max(1.0, left / points_left))
        row = {"N": n, "K": k, "M": m, "MB": rd["MB"], "read_bw": rd["read_bw"], "read": rd["best"],
               **{key: g[key] for key in g if key != "configs"},
               **db.gemm_row(nbytes, rd["best_us"], g["cublas_us"], g.get("lane_us")),
               "configs_timed": len(g["configs"]), "all_us": g["configs"]}
        if "lane_nopdl_us" in g:
            row["lane_nopdl_of_roof"] = rd["best_nopdl_us"] / g["lane_nopdl_us"]
        rows.append(row)
        print(f"  M={m:2d} cuBLAS {row['cublas_us']:7.2f} us ({row['cublas_bw']:5.1%}, {row['cublas_of_roof']:5.1%} of roof)"
              + (f"  lane {row['lane_us']:7.2f} us ({row['lane_bw']:5.1%}, {row['lane_of_roof']:5.1%} of roof) "
                 f"x{row['speedup']:.3f} {row['lane']}" if "lane_us" in row else "  lane: no config passed")
              + ("  (truncated)" if row.get("truncated") else ""), flush=True)


def step_gemms(bm, batch: int) -> list:
    """The nn.Linear calls of one forward at `batch`, in order: (module, M)."""
    import torch
    from torch import nn

    calls, hooks = [], []
    for mod in bm.module.modules():
        if isinstance(mod, nn.Linear):
            hooks.append(mod.register_forward_pre_hook(
                lambda mod, args: calls.append((mod, args[0].numel() // mod.in_features))))
    try:
        with torch.no_grad():
            bm.call(bm.module, batch)()
    finally:
        for h in hooks:
            h.remove()
    return calls


def end_to_end(batches, reads: dict, rows: list[dict], sms: int) -> list[dict]:
    """(c) per batch: the step, its GEMMs alone (cuBLAS), at the read roofline, and the lane's."""
    import e2e_models

    bm = e2e_models.build("llama-3-8b", DEVICE, batches=tuple(batches))
    lane_best = {(r["N"], r["K"], r["M"]): r["lane"] for r in rows if "lane" in r}
    out = []
    for b in batches:
        res = {"batch": b}
        try:
            _e2e_batch(bm, b, res, reads, lane_best, sms)
        except Exception as exc:  # noqa: BLE001 - report what was measured, keep the rest of the run
            import traceback

            traceback.print_exc()
            res["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out.append(res)
        nan = float("nan")
        print(f"e2e b{b}: step {res.get('step_us', nan):.1f} us, {res.get('gemms', 0)} GEMMs cuBLAS "
              f"{res.get('gemm_cublas_us', nan):.1f} us ({res.get('gemm_share', nan):.1%}), at roofline "
              f"{res.get('gemm_roof_us', nan):.1f} us -> bound {res.get('bound_roof', nan):.3f}x; lane "
              f"{res.get('gemm_lane_us', nan):.1f} us -> {res.get('lane_e2e', nan):.3f}x"
              + (f"; {res['error']}" if "error" in res else ""), flush=True)
    return out


def _e2e_batch(bm, b: int, res: dict, reads: dict, lane_best: dict, sms: int) -> None:
    """(c) at one batch, filling `res` as it goes (a failure keeps what was measured)."""
    import torch
    import torch.nn.functional as F

    from tunedb.families.gemm import FAMILY

    calls = step_gemms(bm, b)
    xs = {(m, mod.in_features): (torch.rand(m, mod.in_features, device=DEVICE) * 2 - 1).to(_dtype())
          for mod, m in calls}
    step = bm.call(bm.module, b)

    def timed(body) -> float:
        body()
        _sync()
        return replay_ms(lambda i: body(), 3) * 1e3

    with torch.no_grad():
        res["step_us"] = t_step = timed(step)
        res["gemms"] = len(calls)
        res["gemm_mb"] = sum(mod.weight.numel() * 2 for mod, _ in calls) / 1e6
        res["gemm_cublas_us"] = t_cublas = timed(
            lambda: [F.linear(xs[(m, mod.in_features)], mod.weight, mod.bias) for mod, m in calls])
        res["gemm_share"] = t_cublas / t_step
        for key, pick in (("roof", "best"), ("roof_nopdl", "best_nopdl")):
            fns = []
            for mod, _ in calls:
                w = mod.weight
                rd = reads.get(f"{w.shape[0]}x{w.shape[1]}")
                if rd is None or "best_us" not in rd:
                    break  # a weight (a) did not measure: no roofline chain
                fns.append(read_call(rd[pick], w, sms))
            else:
                res[f"gemm_{key}_us"] = timed(lambda fns=fns: [fn() for fn in fns])
                res[f"bound_{key}"] = db.e2e_bound(t_step, t_cublas, res[f"gemm_{key}_us"])
        peak = max(db.weight_bytes(r["N"], r["K"]) / (r["best_us"] * 1e-6) for r in reads.values() if "best_us" in r)
        res["peak_read_bw"] = peak
        res["bound_bytes_at_peak"] = db.e2e_bound(t_step, t_cublas, res["gemm_mb"] * 1e6 / peak * 1e6)
        lane = []
        for mod, m in calls:
            cid = lane_best.get((mod.out_features, mod.in_features, m))
            if cid is None or mod.bias is not None:
                break
            sig = FAMILY.make_signature("gemm", DT, mod.out_features, mod.in_features)
            lane.append((FAMILY.launcher(FAMILY.parse_config(cid), sig), xs[(m, mod.in_features)], mod.weight,
                         torch.empty(m, mod.out_features, device=DEVICE, dtype=_dtype())))
        else:
            res["gemm_lane_us"] = timed(lambda: [fn(x, w, None, o) for fn, x, w, o in lane])
            res["lane_e2e"] = db.e2e_bound(t_step, t_cublas, res["gemm_lane_us"])


def show(reads: dict, rows: list[dict], census_rows: list[dict], e2e: list[dict], fit) -> list[str]:
    print("\n(a) read roofline (cold, CUDA graph, back to back)")
    print("| N x K | MB | best read us | % 4.3 TB/s | config | best no-PDL us | % | torch.sum us | % | torch.sum(dim=1) us | % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in reads.values():
        if "best_us" not in r:
            print(f"| {r['N']} x {r['K']} | failed: {r.get('error')} |")
            continue
        nb = db.weight_bytes(r["N"], r["K"])
        t, td = r["torch"]["torch.sum"], r["torch"]["torch.sum(dim=1)"]
        print(f"| {r['N']} x {r['K']} | {r['MB']} | {r['best_us']:.2f} | {r['read_bw']:.1%} | `{r['best']}` | "
              f"{r['best_nopdl_us']:.2f} | {db.share(nb, r['best_nopdl_us']):.1%} | {t:.2f} | {db.share(nb, t):.1%} | "
              f"{td:.2f} | {db.share(nb, td):.1%} |")
    if fit:
        print(f"fit t = fixed + bytes / bw over the best reads: fixed {fit[0]:.2f} us per kernel, bw {fit[1] / 1e12:.2f} TB/s")
    print("\n(b) GEMMs: % of 4.3 TB/s | % of the read roofline at that size")
    print("| N x K | M | cuBLAS us | % 4.3 | % roof | lane us | % 4.3 | % roof | lane/cuBLAS | lane no-PDL % roof | ceiling (roof/cuBLAS) | lane config |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lane = (f"{r['lane_us']:.2f} | {r['lane_bw']:.1%} | {r['lane_of_roof']:.1%} | {r['speedup']:.3f}x"
                if "lane_us" in r else "- | - | - | -")
        print(f"| {r['N']} x {r['K']} | {r['M']} | {r['cublas_us']:.2f} | {r['cublas_bw']:.1%} | {r['cublas_of_roof']:.1%} | "
              f"{lane} | {r.get('lane_nopdl_of_roof', float('nan')):.1%} | {r['ceiling']:.3f}x | `{r.get('lane', '-')}` |")
    if e2e:
        print("\n(c) Llama-3-8B, 2 layers, one decode step (CUDA graph, us)")
        print("| batch | step | GEMMs (cuBLAS) | share | GEMMs at roofline | bound | roofline no PDL | bound | bytes at peak read bw | bound | lane GEMMs | lane e2e |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        nan = float("nan")
        for e in (e for e in e2e if "gemm_share" in e):
            print(f"| {e['batch']} | {e['step_us']:.1f} | {e['gemm_cublas_us']:.1f} | {e['gemm_share']:.1%} | "
                  f"{e.get('gemm_roof_us', nan):.1f} | {e.get('bound_roof', nan):.3f}x | {e.get('gemm_roof_nopdl_us', nan):.1f} | "
                  f"{e.get('bound_roof_nopdl', nan):.3f}x | {e['gemm_mb'] * 1e6 / e['peak_read_bw'] * 1e6:.1f} | "
                  f"{e['bound_bytes_at_peak']:.3f}x | {e.get('gemm_lane_us', nan):.1f} | {e.get('lane_e2e', nan):.3f}x |")
    lines = db.verdicts(census_rows, [e for e in e2e if "bound_roof" in e])
    print()
    for line in lines:
        print(line)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_limit.json")
    ap.add_argument("--census", default=str(HERE / "census" / "llama-3-8b_decode.json"),
                    help="the decode census whose gemm/gemm_act weights are measured")
    ap.add_argument("--shapes", default=None, help="NxK[,NxK] measured besides the census's (e.g. 28672x4096)")
    ap.add_argument("--batches", default="1,16", help="decode batches of the end-to-end step")
    ap.add_argument("--budget-s", type=float, default=50.0, help="stop sweeping lane configs after this (s)")
    ap.add_argument("--quick", action="store_true", help="fewer read configs and lane slabs")
    ap.add_argument("--no-e2e", action="store_true", help="skip (c)")
    args = ap.parse_args(argv)
    try:
        shapes = db.census_weights(args.census)
        if args.shapes:
            shapes += [s for s in db.parse_shapes(args.shapes) if s not in shapes]
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
        if not batches or min(batches) < 1:
            raise ValueError(f"--batches {args.batches!r}: expected positive integers, e.g. 1,16")
    except ValueError as exc:
        ap.error(str(exc))

    import torch

    if not torch.cuda.is_available():
        print("bench/decode_limit.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from decode_lane import precompile

    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    precompile(sorted({c for n, k in shapes for c in lane_configs(n, k, args.quick)}))
    reads, rows = weights_and_gemms(shapes, args.quick, args.budget_s, sms)
    pts = [(db.weight_bytes(r["N"], r["K"]), r["best_nopdl_us"]) for r in reads.values() if "best_us" in r]
    fit = db.fit_fixed_cost(pts) if len({b for b, _ in pts}) > 1 else None
    e2e = []
    if not args.no_e2e:
        try:
            e2e = end_to_end(batches, reads, rows, sms)
        except Exception as exc:  # noqa: BLE001 - the model failed to build: (a) and (b) still reported
            import traceback

            traceback.print_exc()
            e2e = [{"batch": b, "error": f"{type(exc).__name__}: {str(exc)[:300]}"} for b in batches]
    census = set(db.census_weights(args.census))
    census_rows = [r for r in rows if (r["N"], r["K"]) in census]  # the goals' points; --shapes rows are shown only
    lines = show(reads, rows, census_rows, e2e, fit)
    summary = {"verdicts": lines, "seconds": round(time.time() - t0, 1),
               "fit_fixed_us": fit[0] if fit else None, "fit_bw": fit[1] if fit else None}
    big = [r for r in census_rows if r["M"] == 1 and r["MB"] >= db.GOAL_MIN_MB]
    if big:
        summary["min_read_bw_m1_16MB"] = min(r["read_bw"] for r in big)
        summary["min_lane_bw_m1_16MB"] = min(r.get("lane_bw", 0.0) for r in big)
        summary["min_cublas_bw_m1_16MB"] = min(r["cublas_bw"] for r in big)
    summary["e2e_bounds"] = {str(e["batch"]): e.get("bound_roof") for e in e2e}
    if any("speedup" in r for r in census_rows):
        summary["geomean_lane_census"] = db.geomean(r["speedup"] for r in census_rows if "speedup" in r)
        summary["geomean_ceiling_census"] = db.geomean(max(1.0, r["ceiling"]) for r in census_rows)
    print(f"\nwall {summary['seconds']} s")
    from tunedb.database import write_atomic

    write_atomic(Path(args.out), json.dumps({"reads": reads, "rows": rows, "e2e": e2e, "summary": summary,
                                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "triton": __import__("triton").__version__, "args": vars(args)},
                                            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
