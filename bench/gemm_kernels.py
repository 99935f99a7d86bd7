"""GEMM lanes against cuBLAS on the H200: per shape, torch (cuBLAS), the Triton default, and the
best config of each lane; shares of the measured bf16 ceiling and copy bandwidth.

    PYTHONPATH=src python bench/gemm_kernels.py [--quick] [--timer graph|protocol] --out gemm.json

Timers: `protocol` is tunedb.measure.measure_point with the CUDA-graph timer (weights rotated cold
when they exceed L2, the gate first); `graph` (default, faster) captures a CUDA graph of calls
that rotate through enough weight copies to exceed 2x L2, and takes the median replay over
calls. Every arm is numerically checked against the fp32 reference before it is timed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
import time

import torch

from tunedb.arch import shipped_profile
from tunedb.families.gemm import FAMILY

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from graph_timing import replay_ms  # noqa: E402

LANE_PICKS = {
    "triton_mma": ["b128x128x64_w8_s3_g8", "b128x256x64_w8_s3_g8", "b64x128x64_w4_s3_g8",
                   "b128x64x64_w4_s4_g8", "b64x64x64_w4_s3_g8", "b32x64x128_w4_s3_g8", "b16x64x256_w4_s3_g8",
                   "b16x128x256_w4_s3_g8", "b32x128x64_w4_s4_g8", "b16x32x128_w4_s3_g8", "b16x64x128_w4_s3_g8",
                   "b16x128x128_w4_s3_g8"],
    "triton_tma": ["tma_b128x256x64_w8_s3_g8", "tma_b128x256x64_w8_s4_g8", "tma_b128x128x64_w8_s4_g8",
                   "tma_b128x128x64_w4_s4_g8", "tma_b64x128x64_w4_s4_g8", "tma_b256x128x64_w8_s3_g8",
                   "tma_b128x256x64_w8_s3_g8_ws", "tma_b128x128x64_w8_s4_g8_ws", "tma_b64x64x128_w4_s4_g8",
                   "tma_b128x256x64_w8_s4_g8_ws", "tma_b256x128x64_w8_s4_g8"],
    "triton_splitk": ["sk2_b16x64x256_w4_s3", "sk4_b16x64x256_w4_s3", "sk8_b16x64x256_w4_s3",
                      "sk16_b16x32x256_w4_s3", "sk4_b16x128x128_w4_s4", "sk2_b32x128x128_w4_s4",
                      "sk4_b32x64x256_w4_s3", "sk8_b32x64x256_w4_s3", "sk4_b64x128x64_w4_s4", "sk8_b16x64x128_w4_s4",
                      "sk4_b16x64x128_w4_s4", "sk8_b16x128x128_w4_s4", "sk2_b16x128x256_w4_s3"],
}


def shapes(quick: bool) -> list[tuple[str, str, int, int, int, str, bool]]:
    """(group, op, M, N, K, act, bias)."""
    out = []
    large = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (8192, 8192, 8192)]
    for m, n, k in large[:2] if quick else large:
        out.append(("large", "gemm", m, n, k, "none", False))
    batches = (1,) if quick else (1, 8)
    for b in batches:  # Whisper encoder, d=1280, ffn 5120
        m = 1500 * b
        out += [("whisper", "gemm_act", m, 5120, 1280, "gelu", True),
                ("whisper", "gemm_act", m, 1280, 5120, "none", True)]
        if not quick:
            out.append(("whisper", "gemm_act", m, 3840, 1280, "none", True))
    for m, d, f in ([(4000, 512, 2048)] if quick else [(4000, 512, 2048), (4000, 144, 576), (16000, 256, 1024)]):
        out += [("conformer", "gemm_act", m, f, d, "silu", True), ("conformer", "gemm_act", m, d, f, "none", True)]
        if not quick:
            out.append(("conformer", "gemm_act", m, f, d, "relu", True))
    decode_m = (1, 16) if quick else (1, 4, 16, 64, 256)
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for m in decode_m:
            out.append(("decode", "gemm", m, n, k, "none", False))
    return out


def check(sig, cid, args, ref, torch_err) -> str | None:
    x, w, b = args
    out = torch.full((x.shape[0], sig.get("N")), float("nan"), dtype=x.dtype, device=x.device)
    y = FAMILY.launch(FAMILY.parse_config(cid), sig, x, w, b, out=out)
    torch.cuda.synchronize()
    if torch.isnan(y).any():
        return "NaN/unwritten output"
    err = ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    return None if err <= 4 * torch_err + 2e-3 else f"error {err:.2e} > 4x torch {torch_err:.2e}"


def graph_time_ms(sig, cid, x, weights, bias, l2_bytes) -> float:
    """Median over replays of (graph of n calls rotating through weight copies) / n."""
    fn = FAMILY.launcher(FAMILY.parse_config(cid), sig)
    outs = torch.empty((x.shape[0], sig.get("N")), dtype=x.dtype, device=x.device)
    n = max(8, len(weights))
    for i in range(len(weights)):
        fn(x, weights[i], bias, outs)
    return replay_ms(lambda i: fn(x, weights[i % len(weights)], bias, outs), n)


def protocol_time_ms(sig, m, ids) -> dict[str, float]:
    from tunedb.measure import CudaGraphTimer, measure_point

    res = measure_point(FAMILY, sig, m, ids, timer=CudaGraphTimer(), allow_busy=True, max_rounds=6)
    return {r.config_id: r.median_ms for r in res if r.status.ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timer", choices=("graph", "protocol"), default="graph")
    ap.add_argument("--out", default="gemm_kernels.json")
    ap.add_argument("--groups", default="large,whisper,conformer,decode",
                    help="comma-separated shape groups to run")
    ap.add_argument("--budget-s", type=float, default=230.0, help="stop starting new shapes after this")
    a = ap.parse_args()
    prof = shipped_profile("sm90")
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    peak_tf, bw = prof.bf16_tflops, prof.dram_bw_gbs
    arch = prof
    rows, start = [], time.time()
    print(f"# {props.name}, torch {torch.__version__}, triton {__import__('triton').__version__}, "
          f"timer {a.timer}, peak {peak_tf} TFLOP/s, copy bw {bw} GB/s")
    hdr = f"{'group':9} {'op':22} {'M':>6} {'N':>6} {'K':>6} | {'arm':32} {'us':>9} {'TF/s':>7} {'%pk':>5} {'GB/s':>7} {'%bw':>5} {'vs torch':>8}"
    print(hdr)
    for group, op, m, n, k, act, bias in [s for s in shapes(a.quick) if s[0] in a.groups.split(",")]:
        if time.time() - start > a.budget_s:
            print("# budget reached; skipping the remaining shapes")
            break
        sig = FAMILY.make_signature(op, "bf16", n, k, act, bias)
        (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", seed=0)
        ref = FAMILY.reference(sig, x, w, b)
        t_out = FAMILY.launch(FAMILY.parse_config("torch"), sig, x, w, b)
        torch_err = ((t_out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        copies = max(1, math.ceil(2 * l2 / (n * k * 2)))
        weights = [w] + [w.clone() for _ in range(copies - 1)]
        arms = {"torch": "torch", "default": FAMILY.default_config(sig, arch).id}
        if "fused" in FAMILY.sentinels(sig, approximate=False):
            arms["fused"] = "fused"
        lane_ids = {lane: [c for c in ids if FAMILY.invalid_reason(FAMILY.parse_config(c), sig, m, arch) is None]
                    for lane, ids in LANE_PICKS.items()}
        times: dict[str, float] = {}
        errors: dict[str, str] = {}
        all_ids = list(dict.fromkeys([*arms.values(), *[c for ids in lane_ids.values() for c in ids]]))
        for cid in all_ids:
            try:
                bad = check(sig, cid, (x, w, b), ref, torch_err) if cid not in ("torch", "fused") else None
                if bad:
                    errors[cid] = bad
                    continue
                if a.timer == "graph":
                    times[cid] = graph_time_ms(sig, cid, x, weights, b, l2)
            except Exception as exc:  # a config that fails is reported, not fatal
                errors[cid] = f"{type(exc).__name__}: {str(exc)[-200:]}"
        if a.timer == "protocol":
            try:
                times = protocol_time_ms(sig, m, [c for c in all_ids if c not in errors])
            except Exception as exc:
                print(f"# protocol timer failed ({exc}); using the graph timer for this shape")
                times = {c: graph_time_ms(sig, c, x, weights, b, l2) for c in all_ids if c not in errors}
        flops, moved = FAMILY.work(sig, m)
        t_torch = times.get("torch")
        show = dict(arms)
        for lane, ids in lane_ids.items():
            ok = [c for c in ids if c in times]
            if ok:
                show[f"best {lane}"] = min(ok, key=times.__getitem__)
        row = {"group": group, "signature": sig.format(), "M": m, "N": n, "K": k, "arms": {}, "errors": errors}
        for label, cid in show.items():
            if cid not in times:
                continue
            ms = times[cid]
            tf = flops / ms / 1e9
            gbs = moved / ms / 1e6
            row["arms"][label] = {"config": cid, "ms": ms, "tflops": tf, "pct_peak": 100 * tf / peak_tf,
                                  "gbs": gbs, "pct_bw": 100 * gbs / bw,
                                  "vs_torch": (t_torch / ms) if t_torch else None}
            print(f"{group:9} {op + ('/' + act if op == 'gemm_act' else ''):22} {m:>6} {n:>6} {k:>6} | "
                  f"{label + ' ' + (cid if cid != label else ''):32.32} {ms * 1e3:>9.1f} {tf:>7.1f} "
                  f"{100 * tf / peak_tf:>5.1f} {gbs:>7.0f} {100 * gbs / bw:>5.1f} "
                  f"{(t_torch / ms) if t_torch else float('nan'):>8.3f}")
        for cid, why in errors.items():
            print(f"#   {cid}: {why}")
        rows.append(row)
        sys.stdout.flush()
        del weights
    summary = summarize(rows)
    print(json.dumps(summary, indent=1))
    with open(a.out, "w") as fh:
        json.dump({"device": props.name, "torch": torch.__version__, "timer": a.timer,
                   "triton": __import__("triton").__version__, "rows": rows, "summary": summary}, fh, indent=1)
    return 0


def summarize(rows) -> dict:
    def best_triton(r):
        ts = [v["ms"] for k, v in r["arms"].items() if k.startswith("best ") or k == "default"]
        return min(ts) if ts else None

    def best_any(r):
        return min(v["ms"] for v in r["arms"].values())

    def geo(xs):
        return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else None

    large = [r["arms"]["torch"]["ms"] / best_triton(r) for r in rows
             if r["group"] == "large" and best_triton(r) and "torch" in r["arms"]]
    dec = [r for r in rows if r["group"] == "decode" and r["M"] <= 16 and best_triton(r) and "torch" in r["arms"]]
    dec_bw = [max(v["pct_bw"] for k, v in r["arms"].items() if k != "torch" and k != "fused") for r in dec]
    enc = [r for r in rows if r["group"] in ("whisper", "conformer") and "torch" in r["arms"]]
    return {
        "large_best_triton_vs_cublas": large,
        "decode_geomean_best_triton_vs_cublas": geo([r["arms"]["torch"]["ms"] / best_triton(r) for r in dec]),
        "decode_best_triton_pct_bw": dec_bw,
        "encoder_geomean_best_arm_vs_eager": geo([r["arms"]["torch"]["ms"] / best_any(r) for r in enc]),
    }


if __name__ == "__main__":
    sys.exit(main())
