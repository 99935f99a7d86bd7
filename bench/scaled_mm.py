"""Quantized W8A8 GEMMs on the GPU: the vendor arm (torch._int_mm + scale epilogue, torch._scaled_mm
per-tensor / row-wise), the `heuristic` sentinel and each Triton lane's best config of a small
sweep, against bf16 F.linear (cuBLAS) on the same shapes, in the same run.

    PYTHONPATH=src python bench/scaled_mm.py --out scaled_mm.json [--budget-s 180] [--quick]
        [--modes int8,fp8_tensor,fp8_row,fp8_block]

Shapes: Llama-3-8B's linear widths (N x K: 4096x4096, 6144x4096, 28672x4096, 4096x14336) at
M in {1, 16, 128, 1024, 4096}. Timing: a CUDA graph of n calls rotating through enough weight
(and weight-scale) copies that every call reads its weight cold (a model's weights exceed L2),
median of 7 replays / n; outputs allocated inside the graph for every arm alike; every call
followed by the build protocol's separator kernel, whose in-context cost is subtracted, so the
bench times arms as the table's build did (--timing back-to-back: the old way, where a `_pdl`
decode config overlaps its own previous copy, which no model lets it do). Every arm is
checked first: int8 bitwise against the heuristic's output, fp8 within 4x the vendor arm's error
(or bf16 rounding) of the fp32 product of the dequantized operands; a failing arm is reported,
not timed. --budget-s caps the Triton sweep's timing (baselines and the heuristic always run);
the sweep's configs are compiled first, outside the budget (about 2 minutes cold).
Prints a markdown table per mode and writes every row as JSON to --out.

--quick times only what issue 20's goals need (QUICK; about 1.5-2.5 minutes on the H200, ~85 Triton
compiles included), each point with the SHIPPED table's pick resolved as the op resolves it
(tunedb.families.scaled_mm.ops.chosen: user tier, system tier = db/sm90/*.json, else the
`heuristic`; the tier is printed): fp8 row-wise at M=2048 over Llama-3-8B's and Whisper-large-v3's
widths, table pick against torch._scaled_mm and bf16 cuBLAS; fp8 row-wise at M in {1, 16} over
Llama's widths and the LM head, table pick against torch._scaled_mm and as a share of 4.3 TB/s
(weights >= 16 MB); block-scaled fp8 at every census point of the shipped block table (Llama's
widths at M in {1, 16, 2048}, the LM head at {1, 16}), the table pick against the best of the
whole sweep at each M and the heuristic against the pick (--exhaustive: the family's whole valid
space instead of the sweep, several minutes more); int8 at M in {1, 16} against bf16 cuBLAS and at
M=2048 against torch._int_mm + epilogue, every arm checked bitwise against the heuristic. It ends
with one line per goal judged on the table pick (the sweep's best in brackets), then the target.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.measure.timers import rotation_copies

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from graph_timing import _SEP, protocol_ms, replay_ms  # noqa: E402

DEVICE = "cuda"  # a module constant so that a CPU smoke test (interpreter) can swap it
HBM_TBS = 4.3  # the H200's HBM3e bandwidth, the M <= 16 goal's yardstick
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
    # M <= 16 only; block scales take the BK=128 slabs
    "triton_decode": ("dk1_n32x256_w4_s6_pdl", "dk1_n32x512_w4_s4_pdl", "dk1_n64x128_w4_s4_pdl",
                      "dk1_n128x128_w8_s4_pdl", "dk2_n64x128_w4_s6_pdl", "dk4_n32x256_w4_s6_pdl",
                      "dk4_n128x128_w8_s4_pdl", "dk8_n64x128_w4_s6_pdl", "dk16_n128x128_w8_s4_pdl",
                      "dk1_n32x256_w4_s6", "dk4_n128x128_w8_s4", "dk8_n64x128_w4_s6"),
}
# --quick: the issue's goals, one group each (shapes N x K; Llama-3-8B: q/o 4096x4096, k/v 1024x4096,
# gate/up 14336x4096, down 4096x14336; Whisper-large-v3: 1280x1280, fc1 5120x1280, fc2 1280x5120)
LLAMA = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336))
WHISPER = ((1280, 1280), (5120, 1280), (1280, 5120))
BIG = ("tma_b128x256x128_w8_s3_g8", "tma_b128x128x128_w8_s4_g8", "tma_b128x256x64_w8_s4_g8",
       "tma_b64x256x128_w8_s3_g8", "b128x256x128_w8_s3_g8", "b128x128x128_w8_s4_g8")
SMALL = ("sk4_b16x64x128_w4_s4", "sk8_b16x64x128_w4_s4", "sk4_b16x128x128_w4_s4",
         "b16x64x128_w4_s4_g8", "b16x128x128_w4_s4_g8") + SWEEP["triton_decode"]
LM_HEAD = ((128256, 4096),)
QUICK = (  # (goal, mode, shapes, Ms, configs: None = the full sweep at that M, the exhaustive side)
    ("fp8 row-wise, large M", "fp8_row", LLAMA + WHISPER, (2048,), BIG),
    ("fp8 row-wise, M <= 16", "fp8_row", LLAMA + LM_HEAD, (1, 16), SMALL),
    # every census point of the shipped block table (bench/census/quant_llama_fp8-block.json)
    ("fp8 block-scaled", "fp8_block", LLAMA, (1, 16, 2048), None),
    ("fp8 block-scaled", "fp8_block", LM_HEAD, (1, 16), None),
    ("int8", "int8", LLAMA, (1, 16), SMALL),
    ("int8", "int8", LLAMA, (2048,), BIG),
)


def sweep_for(lane: str, m: int) -> tuple[str, ...]:
    """The lane's configs worth timing at M: small row tiles for decode, large ones for prefill."""
    ids = SWEEP[lane]
    if lane == "triton_decode":
        return ids if m <= 16 else ()
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


def lane_of(cid: str) -> str:
    return ("triton_tma" if cid.startswith("tma_") else "triton_splitk" if cid.startswith("sk")
            else "triton_decode" if cid.startswith("dk") else "triton_mma")


def table_pick(fam, sig, m):
    """(config id, tier) that a CUDA call of `sig` at M runs, resolved as the op does
    (ops.chosen: user tier, system tier (the shipped db/sm90 table), else the `heuristic`
    sentinel; the heuristic where the chosen arm cannot run at M)."""
    from tunedb.families.scaled_mm import ops
    from tunedb.runtime import selector

    tier = selector.peek(fam.name, sig, m).tier
    cid = ops.chosen(fam.name, sig, m).id
    if cid == "heuristic":  # name what the rule runs here (torch for fp8 tensor/row scales)
        cid = f"heuristic={ops.served(fam.name, sig, m).id}"
    return cid, tier


TIMING = ["protocol"]  # --timing: "protocol" (a separator after every call) or "back-to-back"


def graph_us(fn, x, weights, n_min=8) -> float:
    """Median over 7 replays of a graph of n calls (weights rotating) / n, in microseconds.

    Timed as the build's protocol times (TIMING "protocol", the default): a tiny unrelated kernel
    (the separator) after every call, its in-context cost subtracted. Back to back, a `_pdl`
    decode config overlaps its own previous copy: that kernel triggers its dependents right after
    its gdc_wait, so call i+1 streams its first weight tiles during call i -- which no model
    gives it (there the previous kernel is the activation quantizer, which triggers nothing:
    bench/pdl_context.py measures the three contexts). Timed back to back, the sweep's `best`
    credited PDL arms 20-30% the table's build could not see (session 13 A2)."""
    n = max(n_min, len(weights))
    for i in range(len(weights)):
        fn(x, *weights[i])
    if TIMING[0] == "back-to-back":
        return replay_ms(lambda i: fn(x, *weights[i % len(weights)]), n) * 1000.0
    return protocol_ms(lambda i: fn(x, *weights[i % len(weights)]), n) * 1000.0


def run_point(mode, n, k, m, l2, deadline, rows, configs=None, group=""):
    """Time every arm at one point into `rows`. configs: the Triton configs to time (None: every
    lane's sweep at M; "space": the family's whole valid space); the config the op would run (the
    shipped table's pick, else the heuristic; lane "table", with its tier) is timed too."""
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
    if configs == "space":  # --exhaustive: every valid config of the family's space at this point
        ids = [c.id for c in fam.candidates(sig, m, sm90)]
    else:
        ids = configs if configs is not None else [c for lane in SWEEP for c in sweep_for(lane, m)]
    for cid in ids:
        if fam.invalid_reason(fam.parse_config(cid), sig, m, sm90) is None:
            arms.append((lane_of(cid), cid))
    rule = fam.heuristic(sig, m, sm90)  # what the sentinel runs here: a tile, or the vendor op
    heur_label = f"heuristic={rule.id}" if rule.is_sentinel else "heuristic"
    picked, tier = table_pick(fam, sig, m)
    arms.append(("table", picked.split("=")[0]))

    def record(arm_kind, cid, us=None, status="ok"):
        if arm_kind == "table":
            cid = picked  # "heuristic=torch": the sentinel and what its rule ran
        elif arm_kind == "heuristic":
            cid = heur_label
        rows.append({"group": group, "mode": mode, "N": n, "K": k, "M": m, "lane": arm_kind, "config": cid,
                     "status": status, "us": us, "tflops": (flops / (us * 1e-6) / 1e12) if us else None,
                     "weight_mb": weight_bytes / 1e6, **({"tier": tier} if arm_kind == "table" else {})})

    # bf16 cuBLAS on the same shape (weights rotate the same way, twice the bytes)
    xb = torch.randn((m, k), device=DEVICE, dtype=torch.bfloat16)
    wb = torch.randn((n, k), device=DEVICE, dtype=torch.bfloat16)
    bcopies = rotation_copies(1 << 40, l2, wb.numel() * 2, xb.numel() * 2 + m * n * 2)
    record("bf16", "F.linear", graph_us(lambda x_, w_: F.linear(x_, w_), xb, [(wb.clone(),) for _ in range(bcopies)]))
    del xb, wb
    for kind, cid in arms:
        if kind.startswith("triton") and time.monotonic() > deadline and kind != "table":
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


def warm(mode, ids=None):
    """Compile every swept config of a mode once, outside the budget: Triton specialises N and K
    only on divisibility by 16 (M not at all), so one small shape of the same kind loads the
    binaries every model shape uses."""
    fam_name, scale, out = MODES[mode]
    fam = families.get(fam_name)
    sig = fam.make_signature("scaled_mm", 256, 4096, out, scale)
    args = {m: fam.make_inputs(sig, m, DEVICE, seed=0)[0] for m in (16, 32)}  # decode: M <= 16
    ids = ids if ids is not None else tuple(c for lane in SWEEP for c in SWEEP[lane])
    sm90 = shipped_profile("sm90")
    for cid in ("heuristic",) + tuple(ids):
        if fam.invalid_reason(fam.parse_config(cid), sig, 16 if cid.startswith("dk") else 32, sm90):
            continue  # e.g. BK=256 slabs under block scales: never timed, so never compiled
        try:
            fam.launch(fam.parse_config(cid), sig, *args[16 if cid.startswith("dk") else 32])
        except Exception:  # reported at its timed rows
            pass
    torch.cuda.synchronize()


def summarize(rows):
    """Per (group, mode, N, K, M): bf16, vendor, heuristic, table pick, each lane's best, speedups.
    `ours` is the fastest correct non-vendor arm (heuristic, Triton configs, the table's pick)."""
    points = {}
    for r in rows:
        points.setdefault((r.get("group", ""), r["mode"], r["N"], r["K"], r["M"]), []).append(r)
    table = []
    for (group, mode, n, k, m), rs in points.items():
        ok = [r for r in rs if r["status"] == "ok"]
        get = lambda lane: min((r for r in ok if r["lane"] == lane), key=lambda r: r["us"], default=None)  # noqa: E731
        bf16, vendor, heur, tab = get("bf16"), get("torch"), get("heuristic"), get("table")
        mma, tma, sk, dk = get("triton_mma"), get("triton_tma"), get("triton_splitk"), get("triton_decode")
        ours = lambda r: r if r and not r["config"].endswith("torch") else None  # noqa: E731 -- no vendor arm
        ours_tab, ours_heur = ours(tab), ours(heur)
        tuned = min((r for r in (ours_heur, mma, tma, sk, dk, ours_tab) if r), key=lambda r: r["us"], default=None)
        sweep = min((r for r in (ours_heur, mma, tma, sk, dk) if r), key=lambda r: r["us"], default=None)
        ratio = lambda a, b: (a["us"] / b["us"]) if a and b else None  # noqa: E731
        wmb = rs[0].get("weight_mb")
        hbm = lambda r: (100.0 * wmb * 1e6 / (r["us"] * 1e-6) / (HBM_TBS * 1e12)) if r and wmb else None  # noqa: E731
        table.append({
            "group": group, "mode": mode, "N": n, "K": k, "M": m, "weight_mb": wmb,
            "bf16_us": bf16 and bf16["us"], "vendor_us": vendor and vendor["us"], "heuristic_us": heur and heur["us"],
            "table_pick": tab and tab["config"], "table_us": tab and tab["us"],
            "mma_best": mma and mma["config"], "mma_us": mma and mma["us"],
            "tma_best": tma and tma["config"], "tma_us": tma and tma["us"],
            "splitk_best": sk and sk["config"], "splitk_us": sk and sk["us"],
            "decode_best": dk and dk["config"], "decode_us": dk and dk["us"],
            "table_tier": tab and tab.get("tier"), "table_hbm_pct": hbm(tab),
            "table_vs_vendor": ratio(vendor, tab), "table_vs_bf16": ratio(bf16, tab),
            "sweep_best": sweep and sweep["config"], "sweep_us": sweep and sweep["us"],
            "triton_best": tuned and tuned["config"], "triton_us": tuned and tuned["us"],
            "triton_tflops": tuned and tuned["tflops"],
            "hbm_pct": hbm(tuned),
            "vs_vendor": ratio(vendor, tuned), "vs_bf16": ratio(bf16, tuned), "vs_heuristic": ratio(heur, tuned),
            "table_vs_sweep": ratio(tab, sweep), "heuristic_vs_table": ratio(heur, tab),
            "failed": [f"{r['config']}: {r['status']}" for r in rs if r["status"] not in ("ok",) and not r["status"].startswith("skipped")],
        })
    return table


def geomean(values):
    vals = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _stats(values, spec=".2f"):
    vals = [v for v in values if v]
    if not vals:
        return "-"
    return f"geomean {format(geomean(vals), spec)} min {format(min(vals), spec)}"


def goals(table):
    """One line per goal of issue 20, judged on what a user runs: the table pick (resolved as the
    op resolves it, `tier` says where from); the best of the in-run sweep in parentheses."""
    f = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    by = lambda g: [t for t in table if t["group"] == g]  # noqa: E731
    tiers = lambda ts: ",".join(sorted({str(t.get("table_tier")) for t in ts}))  # noqa: E731
    out = []
    big = by(QUICK[0][0])
    if big:
        out.append(f"fp8 row-wise M=2048, {len(big)} widths (table tiers {tiers(big)}): table pick vs "
                   f"torch._scaled_mm {_stats([t['table_vs_vendor'] for t in big])} (goal >= 0.97); vs bf16 "
                   f"cuBLAS {_stats([t['table_vs_bf16'] for t in big])} (goal >= 1.7) [best of the sweep: vs "
                   f"torch {_stats([t['vs_vendor'] for t in big])}, vs bf16 {_stats([t['vs_bf16'] for t in big])}]")
    small = by(QUICK[1][0])
    if small:
        big_w = lambda key: [t[key] for t in small if (t["weight_mb"] or 0) >= 16.0]  # noqa: E731
        worst = lambda key: f(min((x for x in big_w(key) if x), default=None), ".0f")  # noqa: E731
        out.append(f"fp8 row-wise M<=16, {len(small)} points (table tiers {tiers(small)}): table pick vs "
                   f"torch._scaled_mm {_stats([t['table_vs_vendor'] for t in small])} (goal >= 1.2); % of "
                   f"{HBM_TBS} TB/s at weights >= 16 MB: table pick min {worst('table_hbm_pct')} (goal >= 80) "
                   f"[best of the sweep: vs torch {_stats([t['vs_vendor'] for t in small])}, % HBM min "
                   f"{worst('hbm_pct')}]")
    blk = by(QUICK[2][0])
    if blk:
        tv = [t["table_vs_sweep"] for t in blk if t.get("table_tier") in ("user", "system")]
        has = [x for x in tv if x]
        out.append(f"fp8 block, {len(blk)} points: table pick / best of the sweep: worst "
                   f"{f(max(has, default=None), '.3f')} over {len(has)} points with a table entry, "
                   f"{len(blk) - len(has)} without (goal <= 1.03 at every census point); "
                   f"heuristic / table pick geomean {f(geomean([t['heuristic_vs_table'] for t in blk]))} "
                   f"(goal >= 1.3) [heuristic / best of the sweep geomean "
                   f"{f(geomean([t['vs_heuristic'] for t in blk]))}]")
    i8 = by("int8")
    if i8:
        large = [t for t in i8 if t["M"] > 16]
        small8 = [t for t in i8 if t["M"] <= 16]
        wrong = sum(1 for t in i8 for x in t["failed"] if "bitwise" in x)
        out.append(f"int8 (table tiers {tiers(i8)}): table pick vs _int_mm+epilogue (M=2048) "
                   f"{_stats([t['table_vs_vendor'] for t in large])} (goal >= 0.97); M<=16 table pick vs bf16 "
                   f"cuBLAS {_stats([t['table_vs_bf16'] for t in small8])} (goal >= 1.5) [best of the sweep "
                   f"{_stats([t['vs_bf16'] for t in small8])}]; arms not bitwise equal to the heuristic: {wrong} "
                   f"(goal 0)")
    return out


def markdown(table):
    f = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = []
    groups = list(dict.fromkeys((t["group"], t["mode"]) for t in table))
    for group, mode in groups:
        rows = [t for t in table if t["mode"] == mode and t["group"] == group]
        lines += [f"\n### {group or mode} ({mode})\n",
                  "| N x K | M | bf16 us | vendor us | heuristic us | table pick [tier] (us) | best mma (us) "
                  "| best split-K (us) | best decode (us) | best TMA (us) | TFLOP/s | % HBM (table) | vs vendor (table) "
                  "| vs bf16 (table) | vs heuristic | table / sweep |",
                  "|" + "---|" * 16]
        for t in rows:
            lines.append(f"| {t['N']}x{t['K']} | {t['M']} | {f(t['bf16_us'])} | {f(t['vendor_us'])} | {f(t['heuristic_us'])} "
                         f"| {t['table_pick'] or '-'} [{t.get('table_tier') or '-'}] ({f(t['table_us'])}) "
                         f"| {t['mma_best'] or '-'} ({f(t['mma_us'])}) | {t['splitk_best'] or '-'} ({f(t['splitk_us'])}) "
                         f"| {t.get('decode_best') or '-'} ({f(t.get('decode_us'))}) "
                         f"| {t['tma_best'] or '-'} ({f(t['tma_us'])}) "
                         f"| {f(t['triton_tflops'])} | {f(t['hbm_pct'], '.0f')} ({f(t.get('table_hbm_pct'), '.0f')}) "
                         f"| {f(t['vs_vendor'], '.2f')} ({f(t.get('table_vs_vendor'), '.2f')}) "
                         f"| {f(t['vs_bf16'], '.2f')} ({f(t.get('table_vs_bf16'), '.2f')}) "
                         f"| {f(t['vs_heuristic'], '.2f')} | {f(t['table_vs_sweep'], '.3f')} |")
        for t in rows:
            if t["failed"]:
                lines.append(f"\n{mode} {t['N']}x{t['K']} M={t['M']} failed: " + "; ".join(t["failed"]))
    return "\n".join(lines)


def plan(quick, exhaustive=False):
    """[(group, mode, N, K, M, configs)] and the configs to compile per mode. exhaustive: the
    block-scaled group times the family's whole valid space at each point (configs "space")."""
    if quick:
        points = [(g, mode, n, k, m, "space" if exhaustive and mode == "fp8_block" else cfgs)
                  for g, mode, shapes, ms, cfgs in QUICK for n, k in shapes for m in ms]
    else:
        points = [("", mode, n, k, m, None) for mode in MODES for n, k in SHAPES for m in MS]
    warm_ids: dict[str, list[str]] = {}
    for _g, mode, _n, _k, m, cfgs in points:
        if cfgs == "space":
            fam = families.get(MODES[mode][0])
            ids = [c.id for c in fam.config_space("sm90")]
        else:
            ids = cfgs if cfgs is not None else [c for lane in SWEEP for c in sweep_for(lane, m)]
        warm_ids.setdefault(mode, [])
        warm_ids[mode] += [c for c in ids if c not in warm_ids[mode]]
    return points, warm_ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for every row and the summary")
    ap.add_argument("--budget-s", type=float, default=180.0, help="cap on the Triton sweep's wall time")
    ap.add_argument("--quick", action="store_true",
                    help="the issue's goals only (see QUICK): about 3-4 minutes on the H200, compile included")
    ap.add_argument("--exhaustive", action="store_true",
                    help="with --quick: the block-scaled points time the family's whole valid space (the "
                         "block goal's exhaustive side; ~190 configs compiled, several more minutes)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--timing", choices=("protocol", "back-to-back"), default="protocol",
                    help="protocol (default): a separator after every call, as the build times its arms; "
                         "back-to-back: calls of one arm in a row (PDL arms then overlap their own copies)")
    args = ap.parse_args()
    TIMING[0] = args.timing
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; modes: {', '.join(MODES)}")
    points, warm_ids = plan(args.quick, args.exhaustive)
    points = [p for p in points if p[1] in modes]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or shipped_profile("sm90").l2_bytes
    t0 = time.monotonic()
    for mode in modes:
        if mode in warm_ids:
            warm(mode, warm_ids[mode])
    print(f"[{time.monotonic() - t0:6.1f}s] compiled the sweep", file=sys.stderr, flush=True)
    start = time.monotonic()
    # the budget is shared fairly: each point's sweep may start until its share of the budget ends
    rows: list[dict] = []
    for i, (group, mode, n, k, m, cfgs) in enumerate(points):
        deadline = start + args.budget_s * (i + 1) / len(points)
        run_point(mode, n, k, m, l2, deadline, rows, cfgs, group)
        print(f"[{time.monotonic() - start:6.1f}s] {mode} {n}x{k} M={m}", file=sys.stderr, flush=True)
    table = summarize(rows)
    text = markdown(table)
    print(text)
    goal_lines = goals(table) if args.quick else []
    if goal_lines:
        print("\n### Goals (issue 20)\n\n" + "\n".join(f"- {g}" for g in goal_lines))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "command": " ".join(sys.argv), "timing": args.timing,
           "separator_us": round(_SEP["us"], 3) if "us" in _SEP else None}
    with open(args.out, "w") as fh:
        json.dump({"env": env, "rows": rows, "summary": table, "goals": goal_lines}, fh, indent=1)
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
