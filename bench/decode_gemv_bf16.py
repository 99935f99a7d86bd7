"""bf16 GEMM at M <= 16 (issue 18's decode goals: >= 85% of 4.3 TB/s at M=1 for weights >= 16 MB,
>= 1.15x cuBLAS geomean over the Llama-3-8B decode GEMMs): the GEMV kernel (`gv` configs,
families/gemm/kernels_gemv.py) against the decode lane as it is (`dk` configs), cuBLAS
(F.linear) and a pure read of the same bytes, in ONE run on the H200.

    PYTHONPATH=src python bench/decode_gemv_bf16.py --quick --out decode_gemv_bf16.json   # ~90-120 s (--no-chain ~15 s less)
    PYTHONPATH=src python bench/decode_gemv_bf16.py --out decode_gemv_bf16.json           # ~150-200 s

Per weight (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336; without --quick
also 14336x4096 and the LM head 128256x4096) and M = 1, 4, 8, 16: weight copies rotated past 2x
the 60 MiB L2 (every call reads its weight cold), each arm timed as bench/decode_gemv_fp8.py times
(graph_timing.protocol_ms: CUDA graphs of >= 16 calls, a separator kernel after each, its cost
subtracted, median of 7 replays). Every GEMM arm is first checked against the fp64 product
(decode_limit.lane_arms's bound: 4x the output's rounding + 2e-3 of the peak); a failing config
is reported, not timed. The read is decode_gemv_fp8.read_best (bench/read_roofline.py's quick
sweep and torch.sum). The lane as it is: session 9's winners (decode_limit.PRIOR) and two tiles
of the shipped space, compiled in parallel first; the GEMV: a small sweep per M (the FMA path at
M <= 4, summed every tile and `_lr` summed once after the loop; the tensor-core path at every M;
a PDL twin of each kind). Columns: us, share of 4.3 TB/s, x cuBLAS. Then the Llama layer chain
(decode_lane_s14.layer_chain_timer: qkv, o, gate_up, down over 4 cold layers in one graph, no
separator, M = 1 and 16): cuBLAS, the best dk per GEMM, the best gv per GEMM without PDL and the
same with each one's PDL twin (there a `_pdl` kernel's first tile overlaps a different GEMM's tail).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import decode_bounds as db  # noqa: E402
from graph_timing import protocol_ms  # noqa: E402

LLAMA = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
EXTRA = ((14336, 4096), (128256, 4096))
MS = (1, 4, 8, 16)
GOAL_SHARE, GOAL_X = 0.85, 1.15
# the sweep per M: the FMA path where its rules admit M (M <= 4, its [MP, BN, BK] product tile
# within 128 registers a thread), the tensor-core path at every M (its shared memory, x's 16 rows
# and the W tiles times the stages, leaves 2-4 CTAs an SM), one PDL twin of each
FMA_M1 = ("gv1_n16x512_w4_s5", "gv1_n8x512_w4_s5", "gv2_n16x512_w4_s5", "gv1_n16x256_w4_s5", "gv1_n32x512_w8_s4",
          "gv1_n4x512_w2_s5", "gv1_n16x1024_w8_s3", "gv1_n16x512_w4_s5_pdl",
          # late reduction: the [BN, BK] products summed once after the loop, not every tile
          "gv1_n16x512_w4_s5_lr", "gv1_n8x512_w4_s5_lr", "gv2_n16x512_w4_s5_lr", "gv1_n16x256_w4_s5_lr",
          "gv1_n32x512_w8_s4_lr", "gv1_n16x512_w4_s5_lr_pdl")
FMA_M4 = ("gv1_n4x512_w2_s5", "gv1_n8x512_w4_s5", "gv1_n16x256_w4_s5", "gv2_n8x512_w4_s5", "gv1_n8x512_w4_s5_pdl",
          "gv1_n8x512_w4_s5_lr", "gv1_n4x512_w2_s5_lr", "gv1_n8x512_w4_s5_lr_pdl")
MMA = ("gv1_n16x256_w4_s5_mma", "gv2_n16x256_w4_s4_mma", "gv1_n32x256_w4_s4_mma", "gv1_n32x512_w4_s3_mma",
       "gv2_n32x256_w4_s4_mma", "gv1_n64x256_w4_s3_mma", "gv4_n16x512_w4_s3_mma", "gv1_n16x256_w4_s5_mma_pdl",
       # warpgroup slabs (the weight on the MMA's M side since session 33: wgmma from 64 rows), the
       # fp8 GEMV's winners' shapes in two-byte elements, and one warp a 16-row slab
       "gv1_n64x128_w4_s5_mma", "gv2_n64x128_w4_s4_mma", "gv4_n64x128_w4_s4_mma", "gv2_n64x256_w4_s3_mma",
       "gv1_n128x128_w4_s4_mma", "gv1_n16x256_w1_s5_mma")
QUICK_DROP = {"gv1_n16x1024_w8_s3", "gv1_n4x512_w2_s5", "gv2_n8x512_w4_s5", "gv4_n16x512_w4_s3_mma",
              "gv2_n32x256_w4_s4_mma", "gv1_n32x512_w8_s4", "gv1_n32x512_w8_s4_lr"}
DEVICE = "cuda"  # the CPU smoke test runs one_weight on cpu under the interpreter


def gv_ids(m: int, quick: bool) -> tuple[str, ...]:
    ids = (FMA_M1 if m == 1 else FMA_M4 if m <= 4 else ()) + MMA
    return tuple(c for c in ids if not (quick and c in QUICK_DROP))


def dk_ids(quick: bool) -> tuple[str, ...]:
    """The lane as it is: session 9's winners (decode_limit.PRIOR) and two of the shipped space's
    split-K tiles (configs_decode.grid)."""
    import decode_limit as dl

    return tuple(dl.PRIOR[:6] if quick else dl.PRIOR) + ("dk4_n64x256_w4_s4", "dk8_n32x256_w4_s4")


def gv_launch(cid: str, n: int, k: int):
    """fn(x, w, bias, out) of a `gv` id at (n, k) in bf16 (None for any other id)."""
    if not cid.startswith("gv"):
        return None
    from tunedb.families.gemm import FAMILY, launch_gemv

    return launch_gemv.launcher(cid, FAMILY.make_signature("gemm", "bf16", n, k))


def precompile_gv(quick: bool, arch: str) -> set[str]:
    """Compile every gv binary the run launches (the sweep at each weight and M, and the PDL twins
    the layer chain uses) in 16 worker processes first; the ids that failed, left out."""
    from tunedb.families.gemm import configs_gemv, prebuild_gemv

    ids = {c for m in MS for c in gv_ids(m, quick)}
    ids |= {configs_gemv.pdl_twin(configs_gemv.parse_gemv(c)).id for c in ids}
    from decode_lane_s14 import compile_failures

    t0 = time.time()
    res = prebuild_gemv.compile_all(prebuild_gemv.jobs(sorted(ids), LLAMA + (() if quick else EXTRA), MS), arch, 16)
    return compile_failures(res, t0, "gv binaries")


def one_weight(n: int, k: int, quick: bool, sms: int, skip: set) -> dict:
    import torch
    import torch.nn.functional as F

    import decode_gemv_fp8 as fp8
    import decode_limit as dl
    from tunedb.arch import shipped_profile
    from tunedb.families.gemm import FAMILY, configs_gemv

    arch = shipped_profile("sm90")
    sig = FAMILY.make_signature("gemm", "bf16", n, k)
    nbytes = db.weight_bytes(n, k)
    copies = dl.copies_for(nbytes)
    gen = torch.Generator(device=DEVICE).manual_seed(n + k)
    ws = [torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) * k ** -0.5 for _ in range(copies)]
    calls = max(16, copies)
    row: dict = {"N": n, "K": k, "MB": round(nbytes / 1e6, 1), "copies": copies, "M": {}}
    rid, rus = fp8.read_best(ws, n, k, True, sms, copies, calls)
    row.update(read=rid, read_us=rus, read_share=db.share(nbytes, rus))
    for m in MS:
        x = (torch.rand(m, k, device=DEVICE, generator=gen) * 2 - 1).to(torch.bfloat16)
        ref = x.double() @ ws[0].double().t()
        peak = ref.abs().max().item()
        bound = 4 * (ref.to(torch.bfloat16).double() - ref).abs().max().item() + 2e-3 * peak
        outs = [torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16) for _ in range(2)]
        arms: dict = {}
        for cid in ("torch",) + dk_ids(quick) + gv_ids(m, quick):
            if cid in skip:
                continue
            if cid == "torch":
                run = lambda a, w, b, o: F.linear(a, w)  # noqa: E731 - cuBLAS as the model calls it
            elif cid.startswith("gv"):
                if configs_gemv.gemv_reason(configs_gemv.parse_gemv(cid), n, k, m):
                    continue
                run = gv_launch(cid, n, k)
            else:
                if FAMILY.invalid_reason(FAMILY.parse_config(cid), sig, m, arch):
                    continue
                run = FAMILY.launcher(FAMILY.parse_config(cid), sig)
            try:
                outs[0].fill_(float("nan"))  # an arm that writes nothing fails the check
                y = run(x, ws[0], None, outs[0])
                err = (y.double() - ref).abs().max().item()
                if not err <= bound:
                    arms[cid] = {"status": "incorrect", "err": err, "bound": bound}
                    continue
                for i in range(copies):
                    run(x, ws[i], None, outs[i % 2])
                if DEVICE == "cuda":
                    torch.cuda.synchronize()
                us = protocol_ms(lambda i, r=run: r(x, ws[i % copies], None, outs[i % 2]), calls) * 1e3
            except Exception as exc:  # noqa: BLE001 - one arm failing (compile, resources) leaves the rest
                arms[cid] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            arms[cid] = {"us": us, "share": db.share(nbytes, us), "err": err}
        t_us = arms["torch"]["us"]
        for a in arms.values():
            if "us" in a:
                a["x_cublas"] = t_us / a["us"]
        timed = {c: a["us"] for c, a in arms.items() if "us" in a}
        pick = lambda pre, pdl=None: min((c for c in timed if c.startswith(pre)  # noqa: E731
                                          and (pdl is None or c.endswith("_pdl") == pdl)), key=timed.get, default=None)
        row["M"][str(m)] = {"arms": arms, "best_gv": pick("gv"), "best_gv_nopdl": pick("gv", False),
                            "best_dk": pick("dk"), "best_dk_nopdl": pick("dk", False)}
        del ref
    ws.clear()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def layer_chains(rows: list, ms=(1, 16)) -> list:
    """us per Llama layer (qkv, o, gate_up, down; 4 cold layers, one graph, back to back) for
    cuBLAS, the best dk, the best gv without PDL and its PDL twins, picked per GEMM above."""
    from decode_lane_s14 import LAYER, layer_chain_timer

    from tunedb.families.gemm import configs_gemv

    out = []
    for m in ms:
        picks = {}
        for r in rows:
            pt = r.get("M", {}).get(str(m))
            if pt:
                picks[(r["N"], r["K"])] = pt
        if any((n, k) not in picks for _, n, k, _ in LAYER):
            out.append({"M": m, "error": "a layer GEMM has no measured point at this M"})
            continue
        chain = layer_chain_timer(m, 4, 0, LAYER, launch=gv_launch)
        res: dict = {"M": m, "cublas_us": chain(lambda n, k: "torch"), "picks": {}}
        twin = lambda c: configs_gemv.pdl_twin(configs_gemv.parse_gemv(c)).id  # noqa: E731
        for name, key, f in (("dk", "best_dk", None), ("gv", "best_gv_nopdl", None), ("gv_pdl", "best_gv_nopdl", twin)):
            ids = {(n, k): picks[(n, k)][key] for _, n, k, _ in LAYER}
            if not all(ids.values()):
                continue
            ids = {nk: (f(c) if f else c) for nk, c in ids.items()}
            res["picks"][name] = {f"{n}x{k}": c for (n, k), c in ids.items()}
            try:
                res[f"{name}_us"] = chain(lambda n, k, ids=ids: ids[(n, k)])
                res[f"{name}_x_cublas"] = res["cublas_us"] / res[f"{name}_us"]
            except Exception as exc:  # noqa: BLE001 - the other chains stand
                res[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out.append(res)
        print(f"layer chain M={m} (us per layer, x cuBLAS): " + ", ".join(
            f"{key[:-3]} {v:.1f} ({res['cublas_us'] / v:.3f}x)" for key, v in res.items() if key.endswith("_us")),
            flush=True)
    return out


def best_triton(pt: dict) -> str | None:
    """The faster of the point's best gv and best dk arm (None when neither was timed)."""
    return min((c for c in (pt.get("best_gv"), pt.get("best_dk")) if c), key=lambda c: pt["arms"][c]["us"], default=None)


def summarize(rows: list) -> dict:
    """Per arm kind (best gv, best gv without PDL, best dk, best of both): geomean x cuBLAS over the
    Llama points, its minimum, and the lowest share of 4.3 TB/s at M=1 for weights >= 16 MB; the
    best of both through the gate (cuBLAS where it is faster: what a table would serve); the goals."""
    out: dict = {"goal": {"share_m1_16MB_plus": GOAL_SHARE, "x_cublas_geomean": GOAL_X}}
    for key in ("best_gv", "best_gv_nopdl", "best_dk", "best_of_both"):
        xs, shares = [], []
        for r in rows:
            for m, pt in r.get("M", {}).items():
                c = best_triton(pt) if key == "best_of_both" else pt.get(key)
                if not c:
                    continue
                if (r["N"], r["K"]) in LLAMA:
                    xs.append(pt["arms"][c]["x_cublas"])
                if m == "1" and r["MB"] >= 16:
                    shares.append(pt["arms"][c]["share"])
        out[key] = {"points": len(xs), "x_cublas_geomean": statistics.geometric_mean(xs) if xs else None,
                    "x_cublas_min": min(xs, default=None), "share_min_m1_16MB_plus": min(shares, default=None)}
        if key == "best_of_both":
            out[key]["through_gate_geomean"] = statistics.geometric_mean([max(1.0, x) for x in xs]) if xs else None
    cub = [r["M"][m]["arms"]["torch"]["share"] for r in rows for m in r.get("M", {}) if m == "1" and r["MB"] >= 16]
    out["cublas_share_min_m1_16MB_plus"] = min(cub, default=None)
    out["read_share_min_16MB_plus"] = min((r["read_share"] for r in rows if "read_share" in r and r["MB"] >= 16),
                                          default=None)
    return out


def print_point(r: dict, m: str, pt: dict) -> None:
    a = pt["arms"]

    def cell(c):
        if not c or "us" not in a.get(c, {}):
            return "-"
        return f"{a[c]['us']:.2f} us {a[c]['share']:.0%} {a[c]['x_cublas']:.2f}x `{c}`"

    t = a["torch"]
    bad = [c for c, v in a.items() if "status" in v]
    print(f"| {r['N']}x{r['K']} | {r['MB']} | {m} | {r['read_us']:.2f} us {r['read_share']:.0%} "
          f"| {t['us']:.2f} us {t['share']:.0%} | {cell(pt['best_dk'])} | {cell(pt['best_gv'])} "
          f"| {cell(pt['best_gv_nopdl']) if pt['best_gv_nopdl'] != pt['best_gv'] else '='} |"
          + (f" failed: {bad}" if bad else ""), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_gemv_bf16.json")
    ap.add_argument("--quick", action="store_true", help="the 4 Llama weights, fewer configs")
    ap.add_argument("--no-chain", action="store_true", help="skip the Llama layer chain")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/decode_gemv_bf16.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from decode_lane_s14 import precompile

    t0 = time.monotonic()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failed = precompile(list(dk_ids(args.quick)))
    failed |= precompile_gv(args.quick, "sm%d%d" % torch.cuda.get_device_capability())
    rows = []
    print("| N x K | MB | M | read | cuBLAS | best dk (x cuBLAS) | best gv (x cuBLAS) | best gv without PDL |\n|"
          + "---|" * 8, flush=True)
    for n, k in LLAMA + (() if args.quick else EXTRA):
        try:
            r = one_weight(n, k, args.quick, sms, failed)
        except Exception as exc:  # noqa: BLE001 - one width failing leaves the others measured
            rows.append({"N": n, "K": k, "error": f"{type(exc).__name__}: {str(exc)[:400]}"})
            print(f"| {n}x{k} | error {rows[-1]['error']} |", flush=True)
            continue
        rows.append(r)
        for m, pt in r["M"].items():
            print_point(r, m, pt)
    chains = []
    if not args.no_chain:
        try:
            chains = layer_chains(rows)
        except Exception as exc:  # noqa: BLE001 - the point table stands without the chain
            chains = [{"error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
            print(f"layer chain: {chains[0]['error']}", flush=True)
    summary = summarize(rows)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "timing": "protocol (separator after every call), cold weights, CUDA graphs; chains back to back",
           "quick": args.quick, "compile_failed": sorted(failed)}
    from tunedb.database import write_atomic

    write_atomic(Path(args.out), json.dumps({"env": env, "summary": summary, "rows": rows, "chains": chains},
                                            indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
