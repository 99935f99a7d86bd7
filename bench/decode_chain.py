"""Decode GEMMs back to back: what programmatic dependent launch buys when a weight stream follows
another (issue 18 item 2's PDL, "measure what each idea buys"; the decode lane's share goal).

    PYTHONPATH=src python bench/decode_chain.py --out decode_chain.json [--quick]   # ~60-90 s on an H200

bench/decode_gemv_bf16.py times each arm alone (a separator kernel after every call), where a `_pdl`
kernel has nothing to overlap. Here every arm runs as a model's decode runs it: one CUDA graph of
>= 32 calls back to back, each reading a different cold copy of the weight (copies rotated past 2x
the 60 MiB L2; decode_limit.graph_us), median of 7 replays / calls. Per weight (bf16, the Llama-3-8B
decode widths and 2048x4096, whose 16.8 MB is also the fp8 4096x4096 weight's size) and M = 1 and
16, the arms:
  * torch: F.linear (cuBLAS), as the model calls it;
  * read: bench/read_roofline.py's pure read of the same bytes (the quick binaries, one CTA per
    block and 4 CTAs an SM), without PDL, with PDL (`_pdl`: dependents triggered right after
    gdc_wait) and with the late trigger (`_pdlate`: after the CTA's last block);
  * gv: the GEMM family's `gv` configs for that M (its space's winners) and their `_pdl` twins.
Prints one table per M (us per call, share of 4.3 TB/s, x torch) and writes the rows to --out.
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

SHAPES = ((2048, 4096), (4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096))
QUICK_SHAPES = ((2048, 4096), (4096, 4096), (4096, 14336))
GV = {1: ("gv1_n16x256_w4_s5_lr", "gv1_n8x512_w4_s5_lr"), 16: ("gv1_n32x256_w4_s4_mma", "gv1_n64x256_w4_s3_mma")}
PEAK_TBS = 4.3
MIN_CALLS = 32


def arms_for(m: int) -> list[str]:
    """Every arm id at M = m: torch, the reads (plain, _pdl, _pdlate), the gv configs and twins."""
    import read_roofline as rr

    reads = rr.configs(quick=True)
    reads = reads + rr.late_twins(reads)
    gv = [c for cid in GV[m] for c in (cid, cid + "_pdl")]
    return ["torch", *("read:" + c.id for c in reads), *gv]


def one(n: int, k: int, m: int, sms: int) -> dict:
    import torch

    import decode_limit as dl
    from tunedb.families.gemm import FAMILY

    nbytes = n * k * 2
    copies = dl.copies_for(nbytes)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
    x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    sig = FAMILY.make_signature("gemm", "bf16", n, k)
    row = {"N": n, "K": k, "M": m, "MB": round(nbytes / 1e6, 1), "copies": copies, "arms": {}}
    thunks = {}
    for arm in arms_for(m):
        if arm == "torch":
            thunks[arm] = lambda w: (lambda: torch.nn.functional.linear(x, w))
        elif arm.startswith("read:"):
            thunks[arm] = lambda w, rid=arm[5:]: dl.read_call(rid, w, sms)
        else:
            fn = FAMILY.launcher(FAMILY.parse_config(arm), sig)
            thunks[arm] = lambda w, fn=fn: (lambda: fn(x, w, None, out))
    time_arms(row, thunks, ws, nbytes)
    del ws
    torch.cuda.empty_cache()
    return row


def time_arms(row: dict, thunks: dict, ws: list, nbytes: int) -> None:
    """row["arms"][arm] = {us, share of PEAK_TBS, x_torch} for each arm, `thunks[arm](w)` making its
    call on weight copy w, timed back to back over the copies (decode_limit.graph_us); an arm that
    fails is recorded with its error and the run goes on. `thunks` must hold "torch"."""
    import decode_limit as dl

    for arm, thunk_for in thunks.items():
        calls = [thunk_for(w) for w in ws]
        try:
            us = dl.graph_us(lambda i: calls[i](), len(ws), MIN_CALLS)
        except Exception as exc:  # noqa: BLE001 - reported per arm, the run goes on
            row["arms"][arm] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        row["arms"][arm] = {"us": us, "share": nbytes / (us * 1e-6) / (PEAK_TBS * 1e12)}
    torch_us = row["arms"]["torch"]["us"]
    for a in row["arms"].values():
        if "us" in a:
            a["x_torch"] = torch_us / a["us"]


def best(row: dict, pred) -> tuple[str, dict] | None:
    got = [(a["us"], name, a) for name, a in row["arms"].items() if "us" in a and pred(name)]
    return (min(got)[1], min(got)[2]) if got else None


KINDS = (("read", lambda a: a.startswith("read:") and not a.endswith(("_pdl", "_pdlate"))),
         ("read _pdl", lambda a: a.startswith("read:") and a.endswith("_pdl")),
         ("read _pdlate", lambda a: a.startswith("read:") and a.endswith("_pdlate")),
         ("gv", lambda a: a.startswith("gv") and not a.endswith("_pdl")),
         ("gv _pdl", lambda a: a.startswith("gv") and a.endswith("_pdl")))


def table(rows: list[dict], m: int, kinds: tuple = KINDS) -> str:
    """One markdown table of rows at M = m: torch, then the fastest arm of each (label, predicate)."""
    head = "| N x K | MB | torch | " + " | ".join(k for k, _ in kinds) + " |"
    lines = [f"M = {m}: us per call back to back, cold (share of {PEAK_TBS} TB/s; x torch)", head,
             "|" + "---|" * (3 + len(kinds))]
    for r in rows:
        if r["M"] != m:
            continue
        t = r["arms"]["torch"]
        cells = [f"{t['us']:.2f} ({t['share']:.0%})"]
        for _, pred in kinds:
            b = best(r, pred)
            cells.append("-" if b is None else f"{b[1]['us']:.2f} ({b[1]['share']:.0%}; {b[1]['x_torch']:.2f}x) `{b[0].removeprefix('read:')}`")
        lines.append(f"| {r['N']}x{r['K']} | {r['MB']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="decode_chain.json")
    ap.add_argument("--quick", action="store_true", help="three weights (16.8, 33.6, 117 MB)")
    args = ap.parse_args()
    import torch
    import triton

    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for n, k in QUICK_SHAPES if args.quick else SHAPES:
        for m in (1, 16):
            rows.append(one(n, k, m, sms))
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "wall_s": round(time.time() - t0, 1), "timing": "back to back in one CUDA graph (decode_limit.graph_us), cold copies, median of 7 replays"}
    summary = {}
    for kind, pred in KINDS:
        shares = [best(r, pred)[1]["share"] for r in rows if r["M"] == 1 and r["MB"] >= 16 and best(r, pred)]
        summary[kind] = {"m1_share_min": min(shares) if shares else None,
                         "m1_share_median": statistics.median(shares) if shares else None}
    Path(args.out).write_text(json.dumps({"env": env, "summary": summary, "rows": rows}, indent=1))
    for m in (1, 16):
        print(table(rows, m))
        print()
    print(json.dumps(summary, indent=1))
    print(env)


if __name__ == "__main__":
    main()
