"""fp8 row-wise GEMM at M <= 16 (issue 20: >= 80% of 4.3 TB/s for weights >= 16 MB, >= 1.2x
torch._scaled_mm): the triton_decode lane's `gv` GEMV configs against the lane as it was (`dk`
decode tiles, split-K and data-parallel tiles), torch._scaled_mm and a pure read of the same
bytes, in ONE run on the H200.

    PYTHONPATH=src python bench/decode_gemv_fp8.py --out decode_gemv_fp8.json           # ~120 s
    PYTHONPATH=src python bench/decode_gemv_fp8.py --quick --out decode_gemv_fp8.json   # ~60 s

Per Llama-3-8B width (N x K fp8: 4096x4096 16.8 MB, 6144x4096 25.2 MB, 14336x4096 and 4096x14336
58.7 MB, the 128256x4096 LM head 525 MB) and M = 1, 4, 16: weight copies rotated past 2x the
60 MiB L2 (every call reads its weight cold), each call timed as the build's protocol times
(graph_timing.protocol_ms: CUDA graphs of >= 16 calls, a separator kernel after each, its
in-context cost subtracted, median of 7 replays). Every GEMM arm is first checked against the
fp32 product of the dequantized operands (4x torch's own error, as the GPU tests); a config
failing it is reported `incorrect`, not timed. Columns: time, share of 4.3 TB/s (weight + its
scales), time of torch._scaled_mm / time (x torch), and the share of the read's best.
With --xm, bench/fp8_gemv_xm.py's tiles (x on the MMA's M side, a probe) are timed beside them.
With --model (default on without --quick), the best gv config and its PDL twin are also timed in
a model's context: each call preceded by the row quantizer that writes its x (launch.quantize_rows),
reported as the pair's time (the PDL twin's first weight tile loads while the quantizer runs).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fp8_gemv_xm  # noqa: E402
from graph_timing import protocol_ms, replay_ms  # noqa: E402

BW = 4.3e12
L2 = 60 * 2 ** 20
SHAPES = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
QUICK_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
MS = (1, 4, 16)
GOAL_SHARE, GOAL_X = 0.80, 1.2
# the gv candidates per M (the FMA path only where its predicate admits M: M <= 4 and its
# [MP, BN, BK] product tile within 128 registers a thread), the tensor-core path at every M
FMA_M1 = ("gv1_n16x512_w4_s5", "gv1_n16x512_w4_s3", "gv2_n16x512_w4_s5", "gv1_n8x1024_w4_s5", "gv1_n16x1024_w8_s3",
          "gv1_n32x512_w8_s5", "gv4_n16x512_w4_s3", "gv1_n8x512_w2_s5", "gv1_n16x512_w4_s5_pdl",
          "gv2_n16x512_w4_s5_pdl")
FMA_M4 = ("gv1_n4x512_w2_s5", "gv1_n8x512_w4_s5", "gv1_n16x256_w4_s5", "gv2_n8x512_w4_s5", "gv1_n16x512_w8_s5",
          "gv1_n8x512_w4_s5_pdl")
# the tensor-core path (weight slab on the MMA's M side since session 16): one warp per 16 rows
# (mma.sync) and 64-128-row warpgroup slabs (wgmma), splits to fill 132 SMs at 4096 columns; the
# ids of the two pre-session-16 winners (gv1_n32x256_w4_s5_mma_pdl, gv2_n64x256_w4_s4_mma) kept
# for the comparison
MMA = ("gv1_n16x512_w1_s5_mma", "gv1_n16x256_w1_s5_mma", "gv2_n32x256_w2_s5_mma", "gv1_n32x512_w2_s3_mma",
       "gv4_n64x256_w4_s3_mma", "gv4_n64x256_w4_s4_mma", "gv2_n64x256_w4_s4_mma", "gv8_n64x256_w4_s4_mma",
       "gv1_n64x256_w4_s3_mma", "gv4_n64x128_w4_s5_mma", "gv8_n128x128_w4_s5_mma", "gv2_n128x128_w4_s5_mma",
       "gv1_n16x512_w1_s5_mma_pdl", "gv4_n64x256_w4_s4_mma_pdl", "gv1_n32x256_w4_s5_mma_pdl", "gv2_n16x512_w1_s5_mma")
# the lane before gv: the shipped table's M <= 16 picks and runners-up (session 13 F's evidence)
CURRENT = ("dk1_n32x256_w4_s6", "dk8_n64x128_w4_s6", "dk1_n128x128_w8_s4", "dk4_n128x128_w8_s4",
           "dk2_n32x256_w4_s4_pdl", "dk1_n64x256_w4_s4_pdl", "sk4_b16x128x128_w4_s4", "b16x128x128_w4_s4_g8")
QUICK_DROP = {"gv1_n16x512_w4_s3", "gv1_n8x512_w2_s5", "gv4_n16x512_w4_s3", "gv2_n8x512_w4_s5",
              "gv1_n16x512_w8_s5", "gv1_n16x256_w4_s5", "dk1_n64x256_w4_s4_pdl", "b16x128x128_w4_s4_g8"}


def share(nbytes: float, us: float) -> float:
    return nbytes / (us * 1e-6) / BW


def gv_ids(m: int, quick: bool) -> tuple[str, ...]:
    ids = (FMA_M1 if m == 1 else FMA_M4 if m <= 4 else ()) + MMA
    return tuple(c for c in ids if not (quick and c in QUICK_DROP))


def read_best(ws, n: int, k: int, quick: bool, sms: int, copies: int, calls: int) -> tuple[str, float]:
    """The fastest pure read of the weight copies' bytes (bench/read_roofline.py), checked."""
    import torch

    import read_roofline as rr

    views = [t.view(torch.uint8).view(torch.bfloat16).view(-1) for t in ws]
    numel = views[0].numel()
    ones = torch.ones(numel, device="cuda", dtype=torch.bfloat16)
    timed = {}
    for cfg in rr.configs(quick=True, pdl=not quick):
        fn = rr.launcher(cfg, numel, sms)
        out = torch.empty(fn.grid, device="cuda", dtype=torch.float32)
        if fn(ones, out).double().sum().item() != numel:
            continue
        for v in views:
            fn(v, out)
        timed[cfg.id] = protocol_ms(lambda i, f=fn, o=out: f(views[i % copies], o), calls) * 1e3
    del ones
    timed["torch.sum"] = protocol_ms(lambda i: views[i % copies].sum(dtype=torch.float32), calls) * 1e3
    best = min(timed, key=timed.get)
    return best, timed[best]


def one_weight(n: int, k: int, quick: bool, model: bool, sms: int, xm: bool = False) -> dict:
    import torch

    from tunedb import families
    from tunedb.arch import shipped_profile
    from tunedb.families.scaled_mm.arms import quantize_like
    from tunedb.families.scaled_mm.launch import quantize_rows

    fam = families.get("scaled_mm_fp8")
    arch = shipped_profile("sm90")
    sig = fam.make_signature("scaled_mm", n, k, "bf16", "row")
    copies = max(2, math.ceil(2 * L2 / (n * k)) + 1)
    (_, w, _, sw), _ = fam.make_inputs(sig, 1, "cuda", seed=n + k)
    ws = [w] + [w.clone() for _ in range(copies - 1)]
    calls = max(16, copies)
    nbytes = n * k + 4 * n
    row: dict = {"N": n, "K": k, "MB": round(n * k / 1e6, 1), "copies": copies, "M": {}}
    rid, rus = read_best(ws, n, k, quick, sms, copies, calls)
    row.update(read=rid, read_us=rus, read_share=share(n * k, rus))
    for m in MS:
        x, sx = quantize_like(torch.randn((m, k), device="cuda"), "fp8", "row", "act")
        ref = fam.reference(sig, x, w, sx, sw)
        peak = ref.abs().max()
        torch_run = fam.launcher(fam.parse_config("torch"), sig)
        base = max(((ref.to(torch.bfloat16).float() - ref).abs().max() / peak).item(),
                   ((torch_run(x, w, sx, sw, None).float() - ref).abs().max() / peak).item())
        arms: dict = {}
        probes = {fp8_gemv_xm.tile_id(t): fp8_gemv_xm.launcher(t) for t in fp8_gemv_xm.TILES} if xm else {}
        for cid in (("torch",) + gv_ids(m, quick) + tuple(c for c in CURRENT if not (quick and c in QUICK_DROP))
                    + tuple(probes)):
            if cid in probes:  # x on the MMA's M side (bench/fp8_gemv_xm.py): not a family config
                run = probes[cid]
            else:
                cfg = fam.parse_config(cid)
                if fam.invalid_reason(cfg, sig, m, arch):
                    continue
                run = torch_run if cid == "torch" else fam.launcher(cfg, sig)
            try:
                err = ((run(x, w, sx, sw, None).float() - ref).abs().max() / peak).item()
                if not err <= 4 * base + 1e-4:
                    arms[cid] = {"status": "incorrect", "rel_err": err}
                    continue
                for t in ws:
                    run(x, t, sx, sw, None)
                torch.cuda.synchronize()
                us = protocol_ms(lambda i, r=run: r(x, ws[i % copies], sx, sw, None), calls) * 1e3
            except Exception as exc:  # noqa: BLE001 - one arm failing (compile, resources) leaves the rest
                arms[cid] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            arms[cid] = {"us": us, "share": share(nbytes, us), "rel_err": err}
        t_us = arms["torch"]["us"]
        for a in arms.values():
            if "us" in a:
                a["x_torch"] = t_us / a["us"]
                a["of_read"] = rus / a["us"]
        timed = {c: a["us"] for c, a in arms.items() if "us" in a}
        gv = min((c for c in timed if c.startswith("gv")), key=timed.get, default=None)
        cur = min((c for c in timed if c in CURRENT), key=timed.get, default=None)
        # per gv path too: the CUDA-core FMA path (M <= 4) and the tensor-core one (every M)
        fma = min((c for c in timed if c.startswith("gv") and "_mma" not in c), key=timed.get, default=None)
        mma = min((c for c in timed if c.startswith("gv") and "_mma" in c), key=timed.get, default=None)
        pt = {"arms": arms, "best_gv": gv, "best_current": cur, "best_gv_fma": fma, "best_gv_mma": mma,
              "best_xm": min((c for c in timed if c in probes), key=timed.get, default=None)}
        if model and gv:
            pt["model"] = model_context(fam, sig, gv, x, ws, sw, copies, calls, quantize_rows)
        row["M"][str(m)] = pt
        del ref
    ws.clear()  # the copies go before the next width allocates its own
    torch.cuda.empty_cache()
    return row


def model_context(fam, sig, gv: str, x, ws, sw, copies: int, calls: int, quantize_rows) -> dict:
    """Pair times (row quantizer of a bf16 activation, then the GEMM on what it wrote) for the
    best gv config and its PDL twin, and for torch._scaled_mm."""
    import torch

    xb = (x.float() * 0.5).to(torch.bfloat16)
    twin = gv[:-4] if gv.endswith("_pdl") else gv + "_pdl"
    out = {}
    for cid in (gv, twin, "torch"):
        run = fam.launcher(fam.parse_config(cid), sig)

        def pair(i, r=run):
            q, s = quantize_rows(xb, "fp8")
            r(q, ws[i % copies], s, sw, None)

        for i in range(copies):
            pair(i)
        torch.cuda.synchronize()
        out[cid] = replay_ms(pair, calls) * 1e3
    out["quantizer_alone_us"] = replay_ms(lambda i: quantize_rows(xb, "fp8"), calls) * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_gemv_fp8.json")
    ap.add_argument("--quick", action="store_true", help="4 widths, fewer configs, no PDL reads, no model context")
    ap.add_argument("--xm", action="store_true", help="also time bench/fp8_gemv_xm.py's tiles (x on the MMA's M side)")
    ap.add_argument("--model", action=argparse.BooleanOptionalAction, default=None,
                    help="time the best gv config in a model's context (default: on without --quick)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    model = (not args.quick) if args.model is None else args.model
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.monotonic()
    rows = []
    print("| N x K | MB | M | read (% of 4.3 TB/s) | best gv: us, % HBM, x torch, % of read "
          "| lane before gv: us, %, x torch | torch._scaled_mm us, % |\n|" + "---|" * 7, flush=True)
    for n, k in (QUICK_SHAPES if args.quick else SHAPES):
        try:
            r = one_weight(n, k, args.quick, model, sms, args.xm)
        except Exception as exc:  # noqa: BLE001 - one width failing leaves the others measured
            rows.append({"N": n, "K": k, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
            print(f"| {n}x{k} | error {rows[-1]['error']} |", flush=True)
            continue
        rows.append(r)
        for m, pt in r["M"].items():
            a = pt["arms"]

            def cell(c):
                if not c or "us" not in a.get(c, {}):
                    return "-"
                return f"{c} {a[c]['us']:.2f} us {a[c]['share']:.0%} {a[c]['x_torch']:.2f}x ({a[c]['of_read']:.0%})"

            t = a["torch"]
            print(f"| {n}x{k} | {r['MB']} | {m} | {r['read_us']:.2f} us {r['read_share']:.0%} | {cell(pt['best_gv'])} "
                  f"| {cell(pt['best_current'])} | {t['us']:.2f} us {t['share']:.0%} |", flush=True)
            print(f"|   gv paths | FMA: {cell(pt['best_gv_fma'])} | tensor-core: {cell(pt['best_gv_mma'])} |"
                  + (f" x on M (probe): {cell(pt['best_xm'])} |" if args.xm else ""), flush=True)
            if "model" in pt:
                print(f"|   model context (quantizer + GEMM, us) | {json.dumps({c: round(v, 2) for c, v in pt['model'].items()})} |",
                      flush=True)
    summary = summarize(rows)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "timing": "protocol (separator after every call), cold weights, CUDA graphs", "quick": args.quick}
    Path(args.out).write_text(json.dumps({"env": env, "summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    print(env)
    return 0


def summarize(rows: list) -> dict:
    """Per arm family (best gv, best before gv): geomean x torch over every point, and the lowest
    share of 4.3 TB/s at weights >= 16 MB; the goals beside them."""
    out: dict = {"goal": {"share_at_16MB_plus": GOAL_SHARE, "x_torch_geomean": GOAL_X}}
    xm = any(pt.get("best_xm") for r in rows for pt in r.get("M", {}).values())  # --xm's probe, where it ran
    for key in ("best_gv", "best_current") + (("best_xm",) if xm else ()):
        xs, shares = [], []
        for r in rows:
            for pt in r.get("M", {}).values():
                c = pt.get(key)
                if c and "us" in pt["arms"].get(c, {}):
                    xs.append(pt["arms"][c]["x_torch"])
                    if r["MB"] >= 16:
                        shares.append(pt["arms"][c]["share"])
        out[key] = {"points": len(xs), "x_torch_geomean": statistics.geometric_mean(xs) if xs else None,
                    "x_torch_min": min(xs, default=None), "share_min_16MB_plus": min(shares, default=None)}
    reads = [r["read_share"] for r in rows if "read_share" in r and r["MB"] >= 16]
    out["read_share_min_16MB_plus"] = min(reads, default=None)
    return out


if __name__ == "__main__":
    sys.exit(main())
