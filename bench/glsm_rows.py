"""The gemm_log_softmax row pass with the divisibility hint (VEC) and PDL, beside torch, the
row pass as shipped (VEC=1: the kernel before the hint) and the rowfix lane before/after the
hint, at the CTC census points, in ONE run; plus the terms of the bound model: F.linear alone,
torch.log_softmax alone, a device copy of the logits (read + write: the row pass's practical
floor) and each row pass alone over the same logits.

    PYTHONPATH=src python bench/glsm_rows.py --out DIR [--quick] [--budget-s 140]

Points: bench/census/ctc_heads.json (bf16 with bias; N = 5000 / 16000 / 32000, K = 256 / 512 /
512, M = 64 / 256 / 1024 / 4096 / 8192); --quick: M in {64, 256, 1024, 8192} and fewer configs.
Arms (bench/gemm_log_softmax.py's check and timing: each full arm against the fp32 reference
first, NaN-poisoned output, within 4x torch's error, else reported and not timed; then a CUDA
graph over head-weight copies read cold, median of 7 replays / n):
  torch                 F.linear + torch.log_softmax
  lr_...@old, rf_...@old the shipped lanes as they ran before the hint (VEC=1)
  lr_..., lr_..._pdl, rf_... the same configs now (VEC from launch.row_vec), and the PDL twins
  lr_..._p{P}           the persistent prefetching row pass (new)
  linear, lsm, copy     F.linear alone; torch.log_softmax alone; out.copy_(logits)
  pass:<cid>[@old]      the row pass alone over the logits (in L2 where they fit, as after the GEMM)
Per point: torch us, the old pick (the family's pick rule over torch + the @old arms: what the
shipped table serves) and the new pick (torch + the new arms) x torch, the bound torch / (linear
+ copy) (a design keeping cuBLAS's GEMM with its row pass at the floor), and the row passes'
time / copy. Writes DIR/glsm_rows.json after every point. Expected run time on an H200: 90-130 s
(most of it ~55 first-launch compiles, a third of them rowfix tiles; --quick 50-70 s); --budget-s
(default 140) stops starting new points (smallest M first: the compiles land in the first ones).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tunedb import families
from tunedb.arch import shipped_profile  # noqa: F401  (the bench test reads it from here)
from tunedb.families.gemm_log_softmax.launch import rows_arm, rows_pass
from tunedb.families.gemm_log_softmax.launch_rowfix import rowfix_arm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from gemm_log_softmax import cell, failed_arms, gated_times, geomean, gpu_l2, graph_us, point_inputs  # noqa: E402  (bench/gemm_log_softmax.py)

FAM = families.get("gemm_log_softmax")
CENSUS = Path(__file__).resolve().parent / "census" / "ctc_heads.json"
# linear_rows configs per N (the shipped table's picks first; --quick keeps the first two)
LR = {5000: ("lr_r1_c2048_w8", "lr_r1_c8192_w8", "lr_r1_c8192_w16", "lr_r2_c8192_w8", "lr_r4_c8192_w16"),
      16000: ("lr_r1_c16384_w8", "lr_r1_c16384_w16", "lr_r1_c8192_w8"),
      32000: ("lr_r1_c16384_w16", "lr_r1_c16384_w8", "lr_r1_c8192_w8", "lr_r1_c32768_w16")}
# the persistent prefetching passes (new: no @old arm), whole rows of each N (--quick: the first)
STREAM = {5000: ("lr_r1_c8192_w8_p4", "lr_r4_c8192_w16_p2"), 16000: ("lr_r1_c16384_w8_p2", "lr_r1_c16384_w16_p1"),
          32000: ("lr_r1_c32768_w16_p1",)}
RF = ("rf_b64x32x128_w4_s3_pdl", "rf_b64x128x64_w4_s3_pdl", "rf_b64x64x64_w4_s3_pdl", "rf_b128x128x64_w8_s3_pdl")
RF_MAX_M = 256
QUICK_MS = (64, 256, 1024, 8192)


def census_points(quick: bool):
    """(N, K, M) of the census, smallest M first (if the budget runs out the small-M rows are there)."""
    pts = set()
    for p in json.loads(CENSUS.read_text())["points"]:
        fields = dict(kv.split("=") for kv in p["signature"].split("|")[2:])
        if not quick or int(p["M"]) in QUICK_MS:
            pts.add((int(fields["N"]), int(fields["K"]), int(p["M"])))
    return sorted(pts, key=lambda t: (t[2], t[0]))


def twin(cid: str) -> str | None:
    pdl = cid + "_pdl"
    return pdl if any(c.id == pdl for c in FAM.config_space("sm90")) else None


def run_point(n, k, m, l2, sm90, quick, device="cuda", timer=graph_us, dt="bf16", lr=None, rf=None, stream=None):
    """Every arm at one point; `device`, `timer`, `dt`, `lr`, `rf` and `stream` let the CPU smoke
    test run it under the interpreter (fp16: the interpreter's tl.dot mishandles bf16)."""
    sig, x, w, b, ref, out, copies, weights = point_inputs(dt, n, k, m, l2, device)
    logits = torch.nn.functional.linear(x, w, b)
    lref = torch.log_softmax(logits.double(), dim=-1)
    lr = lr if lr is not None else (LR[n][:2] if quick else LR[n])
    stream = stream if stream is not None else (STREAM[n][:1] if quick else STREAM[n])
    rf = rf if rf is not None else ((RF[:2] if quick else RF) if m <= RF_MAX_M else ())
    full = {"torch": lambda w_, b_: FAM.launch(FAM.parse_config("torch"), sig, x, w_, b_, out=out)}
    passes = {}
    for cid in lr:
        cfg = FAM.parse_config(cid)
        r, c, wp = cfg.param("rows"), cfg.param("chunk"), cfg.param("warps")
        full[cid + "@old"] = lambda w_, b_, cfg=cfg: rows_arm(cfg, x, w_, b_, out=out, vec=1)
        full[cid] = lambda w_, b_, cfg=cfg: FAM.launch(cfg, sig, x, w_, b_, out=out)
        passes[f"pass:{cid}@old"] = lambda r=r, c=c, wp=wp: rows_pass(logits, out, r, c, wp, vec=1)
        passes[f"pass:{cid}"] = lambda r=r, c=c, wp=wp: rows_pass(logits, out, r, c, wp)
        if twin(cid):
            tcfg = FAM.parse_config(twin(cid))
            full[tcfg.id] = lambda w_, b_, cfg=tcfg: FAM.launch(cfg, sig, x, w_, b_, out=out)
    for cid in stream:
        cfg = FAM.parse_config(cid)
        r, c, wp, p = cfg.param("rows"), cfg.param("chunk"), cfg.param("warps"), cfg.param("persist")
        full[cid] = lambda w_, b_, cfg=cfg: FAM.launch(cfg, sig, x, w_, b_, out=out)
        passes[f"pass:{cid}"] = lambda r=r, c=c, wp=wp, p=p: rows_pass(logits, out, r, c, wp, persist=p)
    for cid in rf:
        cfg = FAM.parse_config(cid)
        # at N % 16 == 0 the runtime's own specialisation already vectorised the old kernels
        # (VEC=1 compiles to the same accesses): the new arm stands for both there
        old = (lambda w_, b_, cfg=cfg: rowfix_arm(cfg, x, w_, b_, out=out, vec=1)) if n % 16 else None
        full[cid] = lambda w_, b_, cfg=cfg: FAM.launch(cfg, sig, x, w_, b_, out=out)
        if old:
            full[cid + "@old"] = old
    row = {"N": n, "K": k, "M": m, "copies": copies, "times_us": {}, "errors": {}, "failed": {}}
    valid = {}
    for name, call in full.items():
        why = FAM.invalid_reason(FAM.parse_config(name.split("@")[0]), sig, m, sm90)
        if why:
            row["failed"][name] = f"invalid: {why}"
        else:
            valid[name] = call
    gated_times(row, valid, w, b, out, ref, timer, weights)
    aux = {"linear": lambda w_, b_: torch.nn.functional.linear(x, w_, b_),
           "lsm": lambda w_, b_: torch.ops.aten._log_softmax.out(logits, -1, False, out=out),
           "copy": lambda w_, b_: out.copy_(logits)}
    for name, call in passes.items():
        out.fill_(float("nan"))
        call()
        err = (out.double() - lref).abs().max().item()
        row["errors"][name] = err
        if not err <= 2.0 ** -8 * lref.abs().max().item() + 1e-4:
            row["failed"][name] = f"row pass max error {err:.3g}"
            continue
        aux[name] = lambda w_, b_, call=call: call()
    for name, call in aux.items():
        row["times_us"][name] = timer(call, weights)
    summarise(row)
    return row


def summarise(row):
    t = row["times_us"]
    tt = t["torch"]
    old = {"torch": tt, **{k[:-4]: v for k, v in t.items() if k.endswith("@old") and not k.startswith("pass:")}}
    if row["N"] % 16 == 0:  # the rowfix kernels as they were: the new arm (see run_point)
        old.update({k: v for k, v in t.items() if k.startswith("rf_") and "@" not in k})
    new = {"torch": tt, **{k: v for k, v in t.items() if k[:3] in ("lr_", "rf_") and "@" not in k}}
    for tag, times in (("old", old), ("new", new)):
        pick = FAM.pick_rule().pick({c: v / 1000.0 for c, v in times.items()}).winner
        row[f"{tag}_pick"], row[f"{tag}_x"] = pick, tt / times[pick]
    row["bound_x"] = tt / (t["linear"] + t["copy"])
    for tag, sel in (("old", lambda k: k.endswith("@old")), ("new", lambda k: "@" not in k)):
        ps = [v for k, v in t.items() if k.startswith("pass:") and sel(k)]
        row[f"pass_{tag}_over_copy"] = min(ps) / t["copy"] if ps else None


def markdown(rows):
    f = cell
    lines = ["| N | K | M | torch us | linear us | lsm us | copy us | old pick | old x | new pick | new x | bound x "
             "| pass old / copy | pass new / copy |", "|" + "---|" * 14]
    for r in rows:
        t = r["times_us"]
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {f(t['torch'], '.1f')} | {f(t['linear'], '.1f')} "
                     f"| {f(t['lsm'], '.1f')} | {f(t['copy'], '.1f')} | {r['old_pick']} | {f(r['old_x'])} "
                     f"| {r['new_pick']} | {f(r['new_x'])} | {f(r['bound_x'])} | {f(r['pass_old_over_copy'])} "
                     f"| {f(r['pass_new_over_copy'])} |")
    lines += failed_arms(rows, lambda r: f"{r['N']}x{r['K']} M={r['M']}")
    lines += ["", f"geomean over {len(rows)} points: old pick {geomean([r['old_x'] for r in rows]):.3f}x, new pick "
                  f"{geomean([r['new_x'] for r in rows]):.3f}x, bound (cuBLAS + a row pass at copy speed) "
                  f"{geomean([r['bound_x'] for r in rows]):.3f}x torch"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for glsm_rows.json")
    ap.add_argument("--quick", action="store_true", help="M in {64, 256, 1024, 8192}, fewer configs")
    ap.add_argument("--budget-s", type=float, default=140.0, help="stop starting new points after this")
    args = ap.parse_args()
    gpu = gpu_l2()
    if gpu is None:
        return 2
    sm90, l2 = gpu
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows, skipped = [], []
    for n, k, m in census_points(args.quick):
        if time.monotonic() - t0 > args.budget_s:
            skipped.append((n, k, m))
            continue
        rows.append(run_point(n, k, m, l2, sm90, args.quick))
        r = rows[-1]
        print(f"[{time.monotonic() - t0:6.1f}s] N={n} K={k} M={m}: torch {r['times_us']['torch']:.1f} us, old "
              f"{r['old_x']:.2f}x ({r['old_pick']}), new {r['new_x']:.2f}x ({r['new_pick']}), bound {r['bound_x']:.2f}x",
              file=sys.stderr, flush=True)
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
               "command": " ".join(sys.argv), "skipped": skipped}
        (out / "glsm_rows.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(markdown(rows))
    print(f"\nwall {time.monotonic() - t0:.1f} s; skipped (budget): {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
