"""Quantized W8A8 GEMMs on the GPU: the vendor arm (torch._int_mm + scale epilogue, torch._scaled_mm
per-tensor / row-wise), the `heuristic` sentinel and each Triton lane's best config of a small
sweep, against bf16 F.linear (cuBLAS) on the same shapes, in the same run.

    PYTHONPATH=src python bench/scaled_mm.py --out scaled_mm.json [--budget-s 180] [--quick]
        [--modes int8,fp8_tensor,fp8_row,fp8_block]

Shapes: Llama-3-8B's linear widths (N x K: 4096x4096, 6144x4096, 28672x4096, 4096x14336) at
M in {1, 16, 128, 1024, 4096}. Timing: a CUDA graph of n calls rotating through enough weight
(and weight-scale) copies that every call reads its weight cold (a model's weights exceed L2),
median of 7 replays / n; outputs allocated inside the graph for every arm alike. Every arm is
checked first: int8 bitwise against the heuristic's output, fp8 within 4x the vendor arm's error
(or bf16 rounding) of the fp32 product of the dequantized operands; a failing arm is reported,
not timed. --budget-s caps the Triton sweep's timing (baselines and the heuristic always run);
the sweep's configs are compiled first, outside the budget (about 2 minutes cold).
Prints a markdown table per mode and writes every row as JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.measure.timers import rotation_copies

DEVICE = "cuda"  # a module constant so that a CPU smoke test (interpreter) can swap it
SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336))
MS = (1, 16, 128, 1024, 4096)
MODES = {"int8": ("scaled_mm", "row", "bf16"), "fp8_tensor": ("scaled_mm_fp8", "tensor", "bf16"),
         "fp8_row": ("scaled_mm_fp8", "row", "bf16"), "fp8_block": ("scaled_mm_fp8", "block", "bf16")}
SWEEP = {
    "triton_mma": ("b16x64x128_w4_s4_g8", "b16x128x128_w4_s4_g8", "b32x64x128_w4_s4_g8", "b32x128x128_w4_s4_g8",
                   "b64x64x128_w4_s4_g8", "b64x128x128_w4_s3_g8", "b64x128x128_w4_s4_g8", "b64x256x128_w8_s3_g8",
                   "b128x128x128_w8_s3_g8", "b128x128x128_w8_s4_g8", "b128x128x64_w8_s4_g8",
                   "b128x256x128_w8_s3_g8", "b128x256x64_w8_s4_g8"),
    "triton_tma": ("tma_b64x128x128_w4_s4_g8", "tma_b64x256x128_w8_s3_g8", "tma_b128x128x128_w8_s3_g8",
                   "tma_b128x128x128_w8_s4_g8", "tma_b128x256x128_w8_s3_g8", "tma_b128x256x64_w8_s4_g8",
                   "tma_b128x128x64_w4_s4_g8"),
    "triton_splitk": ("sk2_b16x64x128_w4_s4", "sk4_b16x64x128_w4_s4", "sk8_b16x64x128_w4_s4",
                      "sk4_b16x128x128_w4_s4", "sk2_b32x128x128_w4_s4", "sk4_b32x64x128_w4_s3"),
}


def sweep_for(lane: str, m: int) -> tuple[str, ...]:
    """The lane's configs worth timing at M: small row tiles for decode, large ones for prefill."""
    ids = SWEEP[lane]
    if lane == "triton_splitk":
        return ids if m <= 128 else ()
    bm = lambda cid: int(cid[1:].split("x")[0])  # noqa: E731
    if lane == "triton_tma":
        return ids if m > 16 else ()
    if m <= 16:
        return tuple(c for c in ids if bm(c) <= 32)
    if m <= 128:
        return tuple(c for c in ids if bm(c) <= 128)
    return tuple(c for c in ids if bm(c) >= 64)


def graph_us(fn, x, weights, n_min=8) -> float:
    """Median over 7 replays of a graph of n calls (weights rotating) / n, in microseconds."""
    n = max(n_min, len(weights))
    for i in range(len(weights)):
        fn(x, *weights[i])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(x, *weights[i % len(weights)])
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0 / n)
    del g
    return statistics.median(times)


def run_point(mode, n, k, m, l2, deadline, rows):
    fam_name, scale, out = MODES[mode]
    fam = families.get(fam_name)
    sig = fam.make_signature("scaled_mm", n, k, out, scale)
    (x, w, sx, sw), _ = fam.make_inputs(sig, m, DEVICE, seed=m + n)
    flops, _ = fam.work(sig, m)
    weight_bytes = w.numel() + sw.numel() * 4
    other = x.numel() + m * n * 2
    copies = rotation_copies(1 << 40, l2, weight_bytes, other)
    weights = [(w.clone(), sx, sw.clone()) for _ in range(copies)]

    def q_call(cfg):
        launch = fam.launcher(fam.parse_config(cfg), sig)
        return lambda x_, w_, sx_, sw_: launch(x_, w_, sx_, sw_, None)

    ref = fam.reference(sig, x, w, sx, sw)
    heur = fam.launch(fam.parse_config("heuristic"), sig, x, w, sx, sw)
    base_err = ((ref.to(torch.bfloat16).float() - ref).abs().max() / ref.abs().max()).item()
    arms: list[tuple[str, str]] = [("heuristic", "heuristic")]
    from tunedb.arch import shipped_profile as _sp

    sm90 = _sp("sm90")
    if fam.invalid_reason(fam.parse_config("torch"), sig, m, sm90) is None:
        arms.insert(0, ("torch", "torch"))
        if fam.dt == "fp8":
            y = fam.launch(fam.parse_config("torch"), sig, x, w, sx, sw)
            base_err = max(base_err, ((y.float() - ref).abs().max() / ref.abs().max()).item())
    for lane in ("triton_mma", "triton_tma", "triton_splitk"):
        for cid in sweep_for(lane, m):
            if fam.invalid_reason(fam.parse_config(cid), sig, m, sm90) is None:
                arms.append((lane, cid))

    def record(arm_kind, cid, us=None, status="ok"):
        rows.append({"mode": mode, "N": n, "K": k, "M": m, "lane": arm_kind, "config": cid, "status": status,
                     "us": us, "tflops": (flops / (us * 1e-6) / 1e12) if us else None})

    # bf16 cuBLAS on the same shape (weights rotate the same way, twice the bytes)
    xb = torch.randn((m, k), device=DEVICE, dtype=torch.bfloat16)
    wb = torch.randn((n, k), device=DEVICE, dtype=torch.bfloat16)
    bcopies = rotation_copies(1 << 40, l2, wb.numel() * 2, xb.numel() * 2 + m * n * 2)
    record("bf16", "F.linear", graph_us(lambda x_, w_: F.linear(x_, w_), xb, [(wb.clone(),) for _ in range(bcopies)]))
    del xb, wb
    for kind, cid in arms:
        if kind.startswith("triton") and time.monotonic() > deadline:
            record(kind, cid, status="skipped (budget)")
            continue
        try:
            y = fam.launch(fam.parse_config(cid), sig, x, w, sx, sw)
            torch.cuda.synchronize()
            if fam.dt == "int8":
                bad = None if torch.equal(y, heur) else "not bitwise equal to the heuristic"
            else:
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                bad = None if err <= 4 * base_err + 1e-4 else f"error {err:.2e} > 4x {base_err:.2e}"
            if bad:
                record(kind, cid, status=f"incorrect: {bad}")
                continue
            record(kind, cid, graph_us(q_call(cid), x, weights))
        except Exception as exc:  # a config that fails to compile or launch costs its row
            record(kind, cid, status=f"error: {type(exc).__name__}: {str(exc)[:120]}")
    del weights
    torch.cuda.empty_cache()


def warm(mode):
    """Compile every swept config of a mode once, outside the budget: Triton specialises N and K
    only on divisibility by 16 (M not at all), so one small shape of the same kind loads the
    binaries every model shape uses."""
    fam_name, scale, out = MODES[mode]
    fam = families.get(fam_name)
    sig = fam.make_signature("scaled_mm", 256, 1024, out, scale)
    args, _ = fam.make_inputs(sig, 32, DEVICE, seed=0)
    for cid in ("heuristic",) + SWEEP["triton_mma"] + SWEEP["triton_tma"] + SWEEP["triton_splitk"]:
        try:
            fam.launch(fam.parse_config(cid), sig, *args)
        except Exception:  # reported at its timed rows
            pass
    torch.cuda.synchronize()


def summarize(rows):
    """Per (mode, N, K, M): bf16, vendor, heuristic, each lane's best, and the speedups."""
    points = {}
    for r in rows:
        points.setdefault((r["mode"], r["N"], r["K"], r["M"]), []).append(r)
    table = []
    for (mode, n, k, m), rs in points.items():
        ok = [r for r in rs if r["status"] == "ok"]
        get = lambda lane: min((r for r in ok if r["lane"] == lane), key=lambda r: r["us"], default=None)  # noqa: E731
        bf16, vendor, heur = get("bf16"), get("torch"), get("heuristic")
        mma, tma, sk = get("triton_mma"), get("triton_tma"), get("triton_splitk")
        tuned = min((r for r in (heur, mma, tma, sk) if r), key=lambda r: r["us"], default=None)
        table.append({
            "mode": mode, "N": n, "K": k, "M": m,
            "bf16_us": bf16 and bf16["us"], "vendor_us": vendor and vendor["us"], "heuristic_us": heur and heur["us"],
            "mma_best": mma and mma["config"], "mma_us": mma and mma["us"],
            "tma_best": tma and tma["config"], "tma_us": tma and tma["us"],
            "splitk_best": sk and sk["config"], "splitk_us": sk and sk["us"],
            "triton_best": tuned and tuned["config"], "triton_us": tuned and tuned["us"],
            "triton_tflops": tuned and tuned["tflops"],
            "vs_vendor": (vendor["us"] / tuned["us"]) if vendor and tuned else None,
            "vs_bf16": (bf16["us"] / tuned["us"]) if bf16 and tuned else None,
            "vs_heuristic": (heur["us"] / tuned["us"]) if heur and tuned else None,
            "failed": [f"{r['config']}: {r['status']}" for r in rs if r["status"] not in ("ok",) and not r["status"].startswith("skipped")],
        })
    return table


def markdown(table):
    f = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = []
    for mode in MODES:
        rows = [t for t in table if t["mode"] == mode]
        if not rows:
            continue
        lines += [f"\n### {mode}\n", "| N x K | M | bf16 us | vendor us | heuristic us | best mma (us) | best split-K (us) "
                  "| best TMA (us) | best TFLOP/s | vs vendor | vs bf16 | vs heuristic |", "|" + "---|" * 12]
        for t in rows:
            lines.append(f"| {t['N']}x{t['K']} | {t['M']} | {f(t['bf16_us'])} | {f(t['vendor_us'])} | {f(t['heuristic_us'])} "
                         f"| {t['mma_best'] or '-'} ({f(t['mma_us'])}) | {t['splitk_best'] or '-'} ({f(t['splitk_us'])}) "
                         f"| {t['tma_best'] or '-'} ({f(t['tma_us'])}) "
                         f"| {f(t['triton_tflops'])} | {f(t['vs_vendor'], '.2f')} | {f(t['vs_bf16'], '.2f')} "
                         f"| {f(t['vs_heuristic'], '.2f')} |")
        for t in rows:
            if t["failed"]:
                lines.append(f"\n{mode} {t['N']}x{t['K']} M={t['M']} failed: " + "; ".join(t["failed"]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for every row and the summary")
    ap.add_argument("--budget-s", type=float, default=180.0, help="cap on the Triton sweep's wall time")
    ap.add_argument("--quick", action="store_true", help="two shapes, M in {1, 128, 4096}")
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; modes: {', '.join(MODES)}")
    shapes, ms = (SHAPES[:2], (1, 128, 4096)) if args.quick else (SHAPES, MS)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or shipped_profile("sm90").l2_bytes
    t0 = time.monotonic()
    for mode in modes:
        warm(mode)
    print(f"[{time.monotonic() - t0:6.1f}s] compiled the sweep", file=sys.stderr, flush=True)
    start = time.monotonic()
    # the budget is shared fairly: each point's sweep may start until its share of the budget ends
    points = [(mode, n, k, m) for mode in modes for n, k in shapes for m in ms]
    rows: list[dict] = []
    for i, (mode, n, k, m) in enumerate(points):
        deadline = start + args.budget_s * (i + 1) / len(points)
        run_point(mode, n, k, m, l2, deadline, rows)
        print(f"[{time.monotonic() - start:6.1f}s] {mode} {n}x{k} M={m}", file=sys.stderr, flush=True)
    table = summarize(rows)
    text = markdown(table)
    print(text)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "command": " ".join(sys.argv)}
    with open(args.out, "w") as fh:
        json.dump({"env": env, "rows": rows, "summary": table}, fh, indent=1)
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
