"""Does `gv`'s wide first tile pay without PDL? (issue 18: the decode lane's share at M <= 4)

    PYTHONPATH=src:bench python bench/gv_pre_plain.py --out gv_pre_plain.json   # ~60-90 s

Session 34 measured `_p{PRE}` (the first PRE K tiles of a CTA's slab requested before the loop)
only with `_pdl`, where they go out before `gdc_wait`. Without PDL the same tile is simply more
bytes in flight at the kernel's start, which small weights (k/v projections: 8.4 MB, latency
bound) may want; the build's candidate space holds no plain `_p{PRE}` form. Here, at the
Llama-3-8B decode widths (fp16, as the shipped table's keys) and M = 1 and 4: cuBLAS (F.linear),
the shipped table's M=1 pick at that key, and every plain `_p{PRE}` form the family's rule admits
of the M <= 4 FMA configs, each timed two ways over weight copies rotated past 2x the L2 (cold):
`sep` = graph_timing.protocol_ms (a separator kernel after each call, its cost subtracted: the
build's protocol) and `b2b` = decode_limit.graph_us (back to back in one graph, as in a model
where GEMMs follow each other). Every arm is first checked against the fp64 product.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((1024, 4096), (2048, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336))
BASE = {1: ("gv1_n8x512_w4_s5_lr", "gv1_n16x256_w4_s5_lr", "gv1_n16x512_w4_s5_lr", "gv1_n8x512_w4_s5",
            "gv2_n8x512_w4_s5_lr", "gv1_n4x512_w2_s5_lr"),
        4: ("gv1_n8x512_w4_s5_lr", "gv1_n4x512_w2_s5_lr", "gv1_n16x256_w4_s5_lr", "gv1_n8x512_w4_s5")}
PRES = (1, 2, 4, 8)
PEAK_TBS = 4.3


def ids_for(n: int, k: int, m: int, shipped: str | None) -> list[str]:
    from tunedb.families.gemm import configs_gemv

    out = []
    for base in BASE[m] + ((shipped,) if shipped and shipped.startswith("gv") and not shipped.endswith("_mma") else ()):
        for pre in PRES:
            cid = base if pre == 1 else f"{base}_p{pre}"
            try:
                cfg = configs_gemv.parse_gemv(cid)
            except Exception:  # noqa: BLE001 - the rule refuses this PRE for this tile (registers)
                continue
            if cid not in out and configs_gemv.gemv_reason(cfg, n, k, m) is None:
                out.append(cid)
    return out


def shipped_pick(n: int, k: int, m: int) -> str | None:
    doc = json.loads((Path(__file__).resolve().parents[1] / "src/tunedb/db/sm90/gemm.json").read_text())
    ent = doc["entries"].get(f"gemm|op=gemm|dt=half|N={n}|K={k}")
    if not ent:
        return None
    for hi, cid in ent["regions"]:
        if hi is None or m <= hi:
            return cid
    return None


def one(n: int, k: int, m: int) -> dict:
    import torch
    import torch.nn.functional as F

    import decode_limit as dl
    from graph_timing import protocol_ms
    from tunedb.families.gemm import FAMILY, launch_gemv

    nbytes = n * k * 2
    copies = dl.copies_for(nbytes)
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) * k ** -0.5 for _ in range(copies)]
    x = (torch.rand(m, k, device="cuda", generator=gen) * 2 - 1).to(torch.float16)
    ref = x.double() @ ws[0].double().t()
    bound = 4 * (ref.to(torch.float16).double() - ref).abs().max().item() + 2e-3 * ref.abs().max().item()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(2)]
    pick = shipped_pick(n, k, m)
    row = {"N": n, "K": k, "M": m, "MB": round(nbytes / 1e6, 1), "shipped": pick, "arms": {}}
    sig = FAMILY.make_signature("gemm", "half", n, k)
    runs = {"torch": lambda a, w, o: F.linear(a, w)}
    for cid in ids_for(n, k, m, pick):
        runs[cid] = (lambda fn: (lambda a, w, o: fn(a, w, None, o)))(launch_gemv.launcher(cid, sig))
    calls = max(16, copies)
    for cid, run in runs.items():
        try:
            outs[0].fill_(float("nan"))
            y = run(x, ws[0], outs[0])
            err = (y.double() - ref).abs().max().item()
            if not err <= bound:
                row["arms"][cid] = {"status": "incorrect", "err": err}
                continue
            for i in range(copies):
                run(x, ws[i], outs[i % 2])
            torch.cuda.synchronize()
            sep = protocol_ms(lambda i, r=run: r(x, ws[i % copies], outs[i % 2]), calls) * 1e3
            b2b = dl.graph_us(lambda i, r=run: r(x, ws[i], outs[i % 2]), copies, calls)
        except Exception as exc:  # noqa: BLE001 - one arm failing leaves the rest
            row["arms"][cid] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        row["arms"][cid] = {"sep_us": sep, "b2b_us": b2b, "sep_share": nbytes / (sep * 1e-6) / (PEAK_TBS * 1e12),
                            "b2b_share": nbytes / (b2b * 1e-6) / (PEAK_TBS * 1e12)}
    del ws
    torch.cuda.empty_cache()
    return row


def summary(row: dict) -> str:
    arms = {c: a for c, a in row["arms"].items() if "sep_us" in a}
    t = arms["torch"]
    plain1 = {c: a for c, a in arms.items() if c.startswith("gv") and "_p" not in c.split("_s")[-1]}
    wide = {c: a for c, a in arms.items() if c.startswith("gv") and c not in plain1}
    parts = [f"{row['N']}x{row['K']} M={row['M']} ({row['MB']} MB): torch sep {t['sep_us']:.2f} b2b {t['b2b_us']:.2f}"]
    if row["shipped"] in arms:
        a = arms[row["shipped"]]
        parts.append(f"shipped {row['shipped']} sep {a['sep_us']:.2f} b2b {a['b2b_us']:.2f}")
    for label, group in (("best PRE1", plain1), ("best PRE>1", wide)):
        for how in ("sep", "b2b"):
            if group:
                c = min(group, key=lambda c: group[c][f"{how}_us"])
                a = group[c]
                parts.append(f"{label} {how} {c} {a[f'{how}_us']:.2f} ({a[f'{how}_share']:.0%})")
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gv_pre_plain.json")
    ap.add_argument("--ms", default="1,4")
    args = ap.parse_args()
    import torch
    import triton

    t0 = time.time()
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        for n, k in SHAPES:
            rows.append(one(n, k, m))
            print(summary(rows[-1]), flush=True)
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "wall_s": round(time.time() - t0, 1)}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(env)


if __name__ == "__main__":
    main()
