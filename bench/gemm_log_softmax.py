"""GEMM + log-softmax (CTC / transducer output layers) on the GPU: torch's F.linear then
log_softmax against both fused Triton designs (recompute: stats pass + recompute pass, the
logits never written; fixup: logits written once in bf16/fp16, lse subtracted in place), the
linear_rows lane (cuBLAS's F.linear, then a Triton row log-softmax replacing torch's) and the
tuned pick (the family's pick rule over this run's gated times: what a `tunedb build` table
would serve at these points), in the same run.

    PYTHONPATH=src python bench/gemm_log_softmax.py --out DIR [--quick]

Shapes: vocabulary N in {5000, 16000, 32000} x K in {256, 512} x M in {64, 256, 1024, 4096,
8192}, bf16 (fp16 at N=32000, K=512, M in {64, 1024, 8192}); --quick: N in {5000, 32000}, K=512, M in {64, 1024, 8192}, bf16.
Timing: a CUDA graph of n calls into one preallocated output (torch's logits are allocated in
the graph's pool), the head's weight rotated through enough copies to be read cold (a head
runs after the encoder has swept L2), median of 7 replays / n. Every arm is checked first
against the fp32 reference: within 4x the torch arm's error, else reported and not timed.
Expected run time on an H200: 2-3 minutes (--quick: about 1), most of it first-launch
compiles (10 tiles x 2 dtypes x the N%16 specialisation, 4 kernels each). Prints a markdown table and writes DIR/gemm_log_softmax.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.measure.timers import rotation_copies

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from graph_timing import replay_ms  # noqa: E402

FAM = families.get("gemm_log_softmax")
ARMS = ("rc_b16x128x64_w4_s3", "rc_b64x128x64_w4_s3", "rc_b64x256x64_w8_s3", "rc_b128x128x64_w8_s3",
        "rc_b128x256x64_w8_s3", "fx_b16x128x64_w4_s3", "fx_b64x128x64_w4_s3", "fx_b64x256x64_w8_s3",
        "fx_b128x128x64_w8_s3", "fx_b128x256x64_w8_s3") + tuple(
    c.id for c in FAM.config_space("sm90") if c.lane == "linear_rows")
FULL = dict(ns=(5000, 16000, 32000), ks=(256, 512), ms=(64, 256, 1024, 4096, 8192))
QUICK = dict(ns=(5000, 32000), ks=(512,), ms=(64, 1024, 8192))


def graph_us(call, weights, n_min=6) -> float:
    n = max(n_min, len(weights))
    for wb in weights:
        call(*wb)
    return replay_ms(lambda i: call(*weights[i % len(weights)]), n) * 1000.0


def point_inputs(dt, n, k, m, l2, device="cuda"):
    """One point's inputs: (sig, x, w, b, the fp32 reference, a preallocated output, the number
    of weight copies a cold read needs, those copies as (w, b) pairs)."""
    sig = FAM.make_signature(n, k, dt, 1)
    (x, w, b), _ = FAM.make_inputs(sig, m, device, seed=m + n + k)
    ref = FAM.reference(sig, x, w, b)
    out = torch.empty((m, n), dtype=x.dtype, device=device)
    copies = rotation_copies(1 << 40, l2, FAM.weight_bytes(sig), x.numel() * 2 + 2 * out.numel() * 2)
    return sig, x, w, b, ref, out, copies, [(w.clone(), b.clone()) for _ in range(copies)]


def gated_times(row, calls, w, b, out, ref, timer, weights) -> None:
    """Each of `calls` ({name: call(w, b) writing `out`}, "torch" first) checked against the fp32
    reference (NaN-poisoned output; within 4x torch's error, else a failed row and not timed),
    then timed with `timer` over the weight copies: into row's errors, failed and times_us."""
    base = None
    for name, call in calls.items():
        try:
            out.fill_(float("nan"))
            call(w, b)
            err = ((out.float() - ref).norm() / ref.norm()).item()
        except Exception as exc:  # a compile or launch failure is a row, not a crash
            row["failed"][name] = f"error: {type(exc).__name__}: {exc}"[:300]
            continue
        row["errors"][name] = err
        if name == "torch":
            base = err
        elif not err <= 4 * base:
            row["failed"][name] = f"gate: error {err:.3g} > 4 x torch's {base:.3g}"
            continue
        row["times_us"][name] = timer(call, weights)


def time_arms(dt, n, k, m, l2, sm90, arms, device="cuda", timer=None) -> dict:
    """torch and `arms` at one point through gated_times (graph_us by default: a CUDA graph over
    weight copies read cold). The row's times_us, errors, failed."""
    sig, x, w, b, ref, out, copies, weights = point_inputs(dt, n, k, m, l2, device)
    row = {"dt": dt, "N": n, "K": k, "M": m, "copies": copies, "times_us": {}, "errors": {}, "failed": {}}
    calls = {}
    for cid in ("torch",) + tuple(arms):
        cfg = FAM.parse_config(cid)
        why = FAM.invalid_reason(cfg, sig, m, sm90)
        if why:
            row["failed"][cid] = f"invalid: {why}"
            continue
        calls[cid] = lambda w_, b_, c=cfg: FAM.launch(c, sig, x, w_, b_, out=out)
    gated_times(row, calls, w, b, out, ref, timer or graph_us, weights)
    return row


def best(times: dict, prefix: str) -> tuple:
    """(us, config) of the fastest timed arm whose id starts with `prefix`; (None, None) if none."""
    got = [(t, c) for c, t in times.items() if c.startswith(prefix)]
    return min(got) if got else (None, None)


def run_point(dt, n, k, m, l2, sm90):
    row = time_arms(dt, n, k, m, l2, sm90, ARMS)
    times = row["times_us"]
    row["tuned"] = FAM.pick_rule().pick({c: t / 1000.0 for c, t in times.items()}).winner
    fused = {c: t for c, t in times.items() if c != "torch"}
    best_rc, best_fx, best_lr = best(fused, "rc_"), best(fused, "fx_"), best(fused, "lr_")
    row.update(torch_us=times.get("torch"), rc_us=best_rc[0], rc_best=best_rc[1], fx_us=best_fx[0], fx_best=best_fx[1],
               lr_us=best_lr[0], lr_best=best_lr[1],
               tuned_us=times[row["tuned"]], speedup=times["torch"] / times[row["tuned"]],
               best_fused_speedup=(times["torch"] / min(fused.values())) if fused else None)
    return row


def gpu_l2():
    """(the shipped sm90 profile, this GPU's L2 bytes) for a bench's main, or None without CUDA
    (said on stderr: the main returns 2)."""
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return None
    sm90 = shipped_profile("sm90")
    return sm90, torch.cuda.get_device_properties(0).L2_cache_size or sm90.l2_bytes


def cell(v, spec: str = ".2f") -> str:
    """A markdown table cell: `v` formatted, "-" for None."""
    return "-" if v is None else format(v, spec)


def geomean(vals) -> float:
    """The geometric mean of the values given (None and 0 left out; nan when none is left)."""
    vals = [v for v in vals if v]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else float("nan")


def failed_arms(rows, where) -> list[str]:
    """Markdown lines naming every arm that failed at a row (configs invalid there left out);
    where(row) names the point. [] when none failed."""
    fails = [f"{where(r)} {c}: {why}" for r in rows for c, why in r["failed"].items() if not why.startswith("invalid")]
    return ["", "Failed arms:"] + [f"- {x}" for x in fails] if fails else []


def markdown(rows):
    f = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["| dt | N | K | M | torch us | recompute best (us) | fixup best (us) | linear + rows best (us) | tuned pick | tuned us | tuned vs torch | best Triton arm vs torch |",
             "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['dt']} | {r['N']} | {r['K']} | {r['M']} | {f(r['torch_us'])} | {r['rc_best'] or '-'} ({f(r['rc_us'])}) "
                     f"| {r['fx_best'] or '-'} ({f(r['fx_us'])}) | {r.get('lr_best') or '-'} ({f(r.get('lr_us'))}) | {r['tuned']} | {f(r['tuned_us'])} | {f(r['speedup'], '.2f')} "
                     f"| {f(r['best_fused_speedup'], '.2f')} |")
    lines += failed_arms(rows, lambda r: f"{r['dt']} {r['N']}x{r['K']} M={r['M']}")
    sp = [r["speedup"] for r in rows]
    lines += ["", f"tuned vs torch: geomean {geomean(sp):.2f}x, min {min(sp):.2f}x, "
                  f"max {max(sp):.2f}x; points >= 1.3x: {sum(s >= 1.3 for s in sp)}/{len(sp)}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for gemm_log_softmax.json")
    ap.add_argument("--quick", action="store_true", help="2 vocabularies, K=512, M in {64, 1024, 8192}, bf16")
    args = ap.parse_args()
    gpu = gpu_l2()
    if gpu is None:
        return 2
    sm90, l2 = gpu
    grid = QUICK if args.quick else FULL
    points = [("bf16", n, k, m) for n in grid["ns"] for k in grid["ks"] for m in grid["ms"]]
    if not args.quick:
        points += [("fp16", 32000, 512, m) for m in (64, 1024, 8192)]
    t0 = time.monotonic()
    rows = []
    for dt, n, k, m in points:
        rows.append(run_point(dt, n, k, m, l2, sm90))
        print(f"[{time.monotonic() - t0:6.1f}s] {dt} N={n} K={k} M={m}: {rows[-1]['speedup']:.2f}x ({rows[-1]['tuned']})",
              file=sys.stderr, flush=True)
    text = markdown(rows)
    print(text)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "command": " ".join(sys.argv)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_log_softmax.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
