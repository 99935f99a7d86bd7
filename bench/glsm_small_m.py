"""GEMM + log-softmax at small M (the census CTC heads, M 64..1024) on the GPU: torch's F.linear +
log_softmax, the linear_rows lane's small-M winners (cuBLAS + a Triton row pass), the old
three-launch fixup, and every config of the triton_rowfix lane (tiles write logits + row
statistics, then ONE combined fix-up: two launches, the fix-up under PDL, or one persistent launch
with a grid barrier), side by side in one run.

    PYTHONPATH=src python bench/glsm_small_m.py --out DIR [--quick] [--budget-s 100]

Points: (N, K) in {(5000, 256), (16000, 512), (32000, 512)} (bench/census/ctc_heads.json) x
M in {64, 128, 256, 512, 1024}, bf16 with bias, M-major (the smallest M first: if the budget
runs out the small-M rows are there). --quick: M in {64, 256, 1024}.
Timing as bench/gemm_log_softmax.py: each arm is checked against the fp32 reference first (NaN-
poisoned output; within 4x torch's error, else reported and not timed), then a CUDA graph of n
calls into one preallocated output, the head's weight rotated through enough copies to be read
cold, median of 7 replays / n. Prints per point us and x torch for the best of each lane, a
table of every rowfix config's x torch, and the pick (the family's pick rule over the point's
times); writes DIR/glsm_small_m.json after every point. Expected run time on an H200: 80-110 s
(about 55 first-launch compiles, fewer after the GPU tests filled Triton's cache; --quick about
60 s); --budget-s (default 100) stops starting new points.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.families.gemm_log_softmax import configs_rowfix

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from gemm_log_softmax import best, failed_arms, geomean, time_arms  # noqa: E402  (bench/gemm_log_softmax.py)

FAM = families.get("gemm_log_softmax")
LR = ("lr_r1_c8192_w16", "lr_r1_c16384_w16", "lr_r1_c32768_w16", "lr_r1_c2048_w8")  # the shipped table's small-M picks
FX = ("fx_b16x128x64_w4_s3", "fx_b64x128x64_w4_s3")  # the old fixup's small-M tiles
RF = tuple(c.id for c in configs_rowfix.grid() + configs_rowfix.one_launch_grid())  # the build space + the one-launch variants
HEADS = ((5000, 256), (16000, 512), (32000, 512))
MS, QUICK_MS = (64, 128, 256, 512, 1024), (64, 256, 1024)


def run_point(n, k, m, l2, sm90, device="cuda", timer=None, dt="bf16"):
    row = time_arms(dt, n, k, m, l2, sm90, LR + FX + RF, device=device, timer=timer)
    sig = FAM.make_signature(n, k, dt, 1)
    times = row["times_us"]
    tt = times["torch"]
    for lane, prefix in (("lr", "lr_"), ("fx", "fx_"), ("rf", "rf_")):
        us, cid = best(times, prefix)
        row[f"{lane}_us"], row[f"{lane}_best"] = us, cid
        row[f"{lane}_x"] = tt / us if us else None
    row["pick"] = FAM.pick_rule().pick({c: t / 1000.0 for c, t in times.items()}).winner
    row["pick_x"] = tt / times[row["pick"]]
    old = {c: t for c, t in times.items() if not c.startswith("rf_")}
    row["pick_without_rf"] = FAM.pick_rule().pick({c: t / 1000.0 for c, t in old.items()}).winner
    row["pick_without_rf_x"] = tt / times[row["pick_without_rf"]]
    row["floor_us"] = (FAM.weight_bytes(sig) + 2 * m * n) / 4.3e6  # W read + y written once at 4.3 TB/s
    return row


def markdown(rows):
    f = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| N | K | M | torch us | W+y floor us | best linear_rows us (x) | best old fixup us (x) | best rowfix us (x) | rowfix config | pick | pick x torch | pick without rowfix x |",
             "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {f(r['times_us'].get('torch'))} | {f(r['floor_us'])} "
                     f"| {f(r['lr_us'])} ({f(r['lr_x'], '.2f')}) | {f(r['fx_us'])} ({f(r['fx_x'], '.2f')}) "
                     f"| {f(r['rf_us'])} ({f(r['rf_x'], '.2f')}) | {r['rf_best'] or '-'} | {r['pick']} "
                     f"| {f(r['pick_x'], '.2f')} | {f(r['pick_without_rf_x'], '.2f')} |")
    lines += ["", "Every rowfix config, x torch (- = invalid at that M, or failed: listed below):", "",
              "| config | " + " | ".join(f"{r['N']}/{r['M']}" for r in rows) + " |", "|" + "---|" * (len(rows) + 1)]
    for cid in RF:
        cells = [f(r["times_us"]["torch"] / r["times_us"][cid], ".2f") if cid in r["times_us"] else "-" for r in rows]
        lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    lines += failed_arms(rows, lambda r: f"{r['N']}x{r['K']} M={r['M']}")
    lines += ["", f"pick x torch: geomean {geomean([r['pick_x'] for r in rows]):.2f} (without rowfix "
                  f"{geomean([r['pick_without_rf_x'] for r in rows]):.2f}); best rowfix x torch: geomean "
                  f"{geomean([r['rf_x'] for r in rows]):.2f}, at M <= 256: "
                  f"{geomean([r['rf_x'] for r in rows if r['M'] <= 256]):.2f}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for glsm_small_m.json")
    ap.add_argument("--quick", action="store_true", help="M in {64, 256, 1024}")
    ap.add_argument("--budget-s", type=float, default=100.0, help="start no new point after this many seconds")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    points = [(n, k, m) for m in (QUICK_MS if args.quick else MS) for n, k in HEADS]
    sm90 = shipped_profile("sm90")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or sm90.l2_bytes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "command": " ".join(sys.argv)}
    t0 = time.monotonic()
    rows, skipped = [], []
    for n, k, m in points:
        if time.monotonic() - t0 > args.budget_s:
            skipped.append(f"N={n} K={k} M={m}")
            continue
        rows.append(run_point(n, k, m, l2, sm90))
        r = rows[-1]
        print(f"[{time.monotonic() - t0:6.1f}s] N={n} K={k} M={m}: torch {r['times_us']['torch']:.1f} us, "
              f"rowfix {r['rf_x'] or 0:.2f}x ({r['rf_best']}), linear_rows {r['lr_x'] or 0:.2f}x, pick {r['pick']}",
              file=sys.stderr, flush=True)
        env["wall_s"] = round(time.monotonic() - t0, 1)
        env["skipped"] = skipped
        tmp = out / "glsm_small_m.json.tmp"
        tmp.write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
        tmp.replace(out / "glsm_small_m.json")
    print(markdown(rows))
    if skipped:
        print(f"\nbudget reached: skipped {', '.join(skipped)}")
    env["wall_s"], env["skipped"] = round(time.monotonic() - t0, 1), skipped
    (out / "glsm_small_m.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
