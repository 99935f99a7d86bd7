"""Recurrent layers on the GPU: nn.LSTM through cuDNN (torch's default, the fallback) against
torch's native kernels with cuDNN off, and the tuned pick (the rnn family's pick rule over this
run's gated times: what a `tunedb build --family rnn` table would serve), in the same run.

    PYTHONPATH=src python bench/rnn.py --out DIR [--quick]

Grid: LSTM, input = hidden in {320, 512, 1024}, 1 and 2 layers, batch in {1, 8, 64}, 100 steps,
batch-first, bf16 and fp32, plus bf16 hidden 128 and 256 (--quick: 1 layer, bf16, 320-1024).
Arms: cuDNN, no-cuDNN, and 4 tiles of the Triton sequence-persistent LSTM kernel (bf16 only). Timing: each arm inside a CUDA graph
of 3 calls (after a warm-up on a side stream), median of 7 replays / 3; an arm that cannot be
captured is timed eagerly (events, 7 x 3 calls) and the row says so. Arms are checked against the
fp32/fp64 reference first (within 4x cuDNN's error). Expected run time on an H200: about 90 s
(--quick: about 40), the persistent kernel's compiles included. Writes DIR/rnn.json.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from tunedb import families
from tunedb.arch import shipped_profile

FAM = families.get("rnn")
SM90 = shipped_profile("sm90")
ARMS = ("torch", "nocudnn", "pl_bb16_bh32_bk64_w4", "pl_bb16_bh64_bk64_w4", "pl_bb16_bh128_bk64_w8",
        "pl_bb64_bh64_bk64_w8")


def timed(call, captured: bool) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    n = 3
    if captured:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                call()
        run = g.replay
        run()
    else:
        def run():
            for _ in range(n):
                call()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / n)
    return statistics.median(times)


def run_point(dt, h, layers, b, t):
    sig = FAM.make_signature("lstm", dt, h, h, layers, 1, 0, 1, b)
    args, _ = FAM.make_inputs(sig, t, "cuda", seed=h + b)
    ref = FAM.reference(sig, *args)
    out = torch.empty(ref.shape, dtype=args[0].dtype, device="cuda")
    row = {"dt": dt, "H": h, "L": layers, "B": b, "T": t, "times_us": {}, "errors": {}, "eager": [], "failed": {}}
    for cid in ARMS:
        cfg = FAM.parse_config(cid)
        if FAM.invalid_reason(cfg, sig, t, SM90):
            continue
        call = lambda c=cfg: FAM.launch(c, sig, *args, out=out)  # noqa: E731
        out.fill_(float("nan"))
        call()
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        row["errors"][cid] = err
        if cid != "torch" and not err <= 4 * row["errors"]["torch"] + 1e-7:
            row["failed"][cid] = f"gate: error {err:.3g} > 4 x cuDNN's"
            continue
        try:
            row["times_us"][cid] = timed(call, True)
        except Exception as exc:  # not capturable: time it as it runs eagerly
            torch.cuda.synchronize()
            row["eager"].append(f"{cid}: {type(exc).__name__}")
            row["times_us"][cid] = timed(call, False)
    times = row["times_us"]
    row["tuned"] = FAM.pick_rule().pick({c: v / 1000.0 for c, v in times.items()}).winner
    row["vs_cudnn"] = times["torch"] / times[row["tuned"]]
    row["nocudnn_vs_cudnn"] = times["torch"] / times["nocudnn"] if "nocudnn" in times else None
    pl = {c: v for c, v in times.items() if c.startswith("pl_")}
    row["pl_best"] = min(pl, key=pl.get) if pl else None
    row["pl_vs_cudnn"] = times["torch"] / pl[row["pl_best"]] if pl else None
    return row


def markdown(rows):
    f = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| dt | H | layers | batch | T | cuDNN us | no-cuDNN us | no-cuDNN vs cuDNN | best persistent (vs cuDNN) "
             "| tuned pick | tuned vs cuDNN | eager |", "|" + "---|" * 12]
    for r in rows:
        ts = r["times_us"]
        lines.append(f"| {r['dt']} | {r['H']} | {r['L']} | {r['B']} | {r['T']} | {f(ts.get('torch'))} | {f(ts.get('nocudnn'))} "
                     f"| {f(r['nocudnn_vs_cudnn'], '.2f')} | {r['pl_best'] or '-'} ({f(r['pl_vs_cudnn'], '.2f')}) | {r['tuned']} | {f(r['vs_cudnn'], '.2f')} | {', '.join(r['eager']) or '-'} |")
    sp = [r["vs_cudnn"] for r in rows]
    lines += ["", f"tuned vs cuDNN: min {min(sp):.2f}x (never below 1.0 by construction of the fallback), "
                  f"geomean {math.exp(sum(map(math.log, sp)) / len(sp)):.2f}x; no-cuDNN picked at "
                  f"{sum(r['tuned'] == 'nocudnn' for r in rows)}/{len(rows)} points, the persistent kernel at "
                  f"{sum(r['tuned'].startswith('pl_') for r in rows)}/{len(rows)}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for rnn.json")
    ap.add_argument("--quick", action="store_true", help="1 layer, bf16 only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    points = [(dt, h, layers, b, 100) for dt in (("bf16",) if args.quick else ("bf16", "fp32"))
              for h in (320, 512, 1024) for layers in ((1,) if args.quick else (1, 2)) for b in (1, 8, 64)]
    if not args.quick:  # below the goal's range: where a sequence-persistent kernel should win
        points += [("bf16", h, 1, b, 100) for h in (128, 256) for b in (1, 8, 64)]
    t0 = time.monotonic()
    rows = []
    for p in points:
        rows.append(run_point(*p))
        print(f"[{time.monotonic() - t0:6.1f}s] {p}: {rows[-1]['tuned']} {rows[-1]['vs_cudnn']:.2f}x", file=sys.stderr, flush=True)
    print(markdown(rows))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "wall_s": round(time.monotonic() - t0, 1), "command": " ".join(sys.argv)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rnn.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
