"""Sibling projections at M = 1 (and, with --rows, 2-16: the kernel's tensor-core path) in one
launch (families/gemm/kernels_siblings.py) against the same GEMMs one by one (issue 18: decode
end to end).

    PYTHONPATH=src:bench python bench/siblings_gemv.py --out siblings_gemv.json   # ~30 s
    PYTHONPATH=src:bench python bench/siblings_gemv.py --rows 1,4,8,16 --dtypes bfloat16 --out s.json

Per group (Llama-3-8B q/k/v and gate/up, Qwen2-7B q/k/v with bias, a BERT-base and a small
decoder's q/k/v), fp16 and bf16 where said, weights cold (copies rotated past 2x the L2), each arm
timed as the build times (graph_timing.protocol_ms: a separator after each call) and back to back
in one graph (decode_limit.graph_us): `torch` = one F.linear per sibling (cuBLAS), `tunedb` = one
tuned call per sibling as the shipped table serves it (gemm's ops.gemm), `cat` = one F.linear
over the concatenated weights (a weight copy, the upper bound of one cuBLAS call), `siblings` =
the one-launch kernel. Each output checked against fp64 first.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# name -> (K, sibling N's, bias)
GROUPS = {"llama3-8b qkv": (4096, (4096, 1024, 1024), False), "llama3-8b gate/up": (4096, (14336, 14336), False),
          "qwen2-7b qkv": (3584, (3584, 512, 512), True), "bert-base qkv": (768, (768, 768, 768), True),
          "small decoder qkv": (1024, (1024, 256, 256), False), "llama3-70b qkv": (8192, (8192, 1024, 1024), False),
          "qwen2-7b gate/up": (3584, (18944, 18944), False), "llama3.2-3b qkv": (3072, (3072, 1024, 1024), False),
          "llama3.2-3b gate/up": (3072, (8192, 8192), False), "llama3.2-1b gate/up": (2048, (8192, 8192), False),
          "qwen2-0.5b gate/up": (896, (4864, 4864), False), "deep narrow qkv": (4096, (512, 128, 128), False),
          # session 42: groups of few weight slabs, where K split in the kernel may pay: tensor-parallel
          # shards (Llama-3-70B q/k/v over 8 GPUs, Llama-3-8B over 4; "deep narrow qkv" is Llama-3-8B's
          # over 8) and DeepSeek-V3's MLA down-projections (q_a, kv_a with its rope part)
          "llama3-70b tp8 qkv": (8192, (1024, 128, 128), False), "llama3-8b tp4 qkv": (4096, (1024, 256, 256), False),
          "llama3-8b tp8 gate/up": (4096, (1792, 1792), False), "deepseek-v3 mla q_a/kv_a": (7168, (1536, 576), False)}


# (BN, BK, warps, stages[, split]) besides kernels_siblings.tile's: one row (FMA slabs), 2-16 rows (tl.dot:
# BN >= 16). Session 37 call 2 also timed the weight on the MMA's M side (64-128-row slabs): it
# lost at every point, and the kernel no longer has it.
TILES = ((8, 512, 4, 5), (32, 256, 8, 4), (16, 512, 4, 4), (8, 256, 2, 6), (16, 256, 4, 3))
TILES_MMA = ((16, 256, 1, 5), (32, 256, 2, 4), (32, 128, 1, 5), (64, 128, 4, 5), (64, 64, 4, 6), (64, 128, 4, 4),
             (128, 128, 4, 4), (128, 64, 4, 6), (128, 256, 8, 3),
             # session 38: deeper pipelines and K split in the kernel (a fifth number: the runs of K
             # tiles, reduced in split order), for groups of too few programs to keep HBM busy
             (64, 128, 4, 7), (64, 128, 4, 5, 2), (64, 128, 4, 5, 3), (64, 128, 4, 5, 4), (32, 128, 1, 5, 2),
             (64, 64, 4, 6, 2), (32, 256, 2, 4, 2), (128, 128, 4, 4, 2),
             (32, 256, 2, 4, 3), (32, 256, 2, 4, 4), (64, 128, 4, 5, 6))


def one(name: str, dtype_name: str, m: int = 1) -> dict:
    import torch
    import torch.nn.functional as F

    import decode_limit as dl
    from graph_timing import protocol_ms
    from tunedb.families.gemm import kernels_siblings, ops

    k, ns, has_bias = GROUPS[name]
    dtype = getattr(torch, dtype_name)
    nbytes = sum(ns) * k * 2
    copies = dl.copies_for(nbytes)
    gen = torch.Generator(device="cuda").manual_seed(k + sum(ns))
    sets = [[torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) * k ** -0.5 for n in ns] for _ in range(copies)]
    bias = [torch.randn(n, device="cuda", dtype=dtype, generator=gen) if has_bias else None for n in ns]
    cats = [torch.cat(ws) for ws in sets]
    bcat = torch.cat(bias) if has_bias else None
    x = (torch.rand(m, k, device="cuda", generator=gen) * 2 - 1).to(dtype)
    refs = [x.double() @ w.double().t() + (b.double() if b is not None else 0) for w, b in zip(sets[0], bias)]
    outs = [torch.empty(m, n, device="cuda", dtype=dtype) for n in ns]
    arms = {
        "torch": lambda i: [F.linear(x, w, b) for w, b in zip(sets[i], bias)],
        "tunedb": lambda i: [ops.gemm(x, w) if b is None else ops.gemm_act(x, w, b, "none") for w, b in zip(sets[i], bias)],
        "cat": lambda i: F.linear(x, cats[i], bcat).split(list(ns), -1),
    }

    def group(t):  # one launch with a workspace made once (its counters are left zero by each launch)
        sizes = kernels_siblings.workspace_sizes(ns, k, m, t)
        work = (torch.zeros(sizes[0], device="cuda"), torch.zeros(sizes[1], device="cuda", dtype=torch.int32))
        return lambda i: (kernels_siblings.launch(x, sets[i], bias, outs, tiles=t, workspace=work), outs)[1]
    arms["siblings"] = group(None)
    for t in (TILES if m == 1 else TILES_MMA):
        try:
            arms["siblings " + "x".join(map(str, t))] = group(t)
        except ValueError:  # a split the kernel refuses at this K (fewer K tiles than runs): not a candidate
            continue
    row = {"group": name, "dtype": dtype_name, "M": m, "K": k, "N": list(ns), "MB": round(nbytes / 1e6, 1), "arms": {}}
    calls = max(16, copies)
    for arm, fn in arms.items():
        try:
            got = fn(0)
            torch.cuda.synchronize()
            err = max(((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(got, refs))
            for i in range(copies):
                fn(i)
            torch.cuda.synchronize()
            sep = protocol_ms(lambda i, f=fn: f(i % copies), calls) * 1e3
            b2b = dl.graph_us(lambda i, f=fn: f(i), copies, calls)
        except Exception as exc:  # noqa: BLE001 - one arm failing leaves the rest
            row["arms"][arm] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        row["arms"][arm] = {"sep_us": sep, "b2b_us": b2b, "err": err, "share_b2b": nbytes / (b2b * 1e-6) / 4.3e12}
    del sets, cats
    torch.cuda.empty_cache()
    return row


def line(r: dict) -> str:
    a = r["arms"]
    cells = []
    for arm in ("torch", "tunedb", "cat", "siblings"):
        v = a.get(arm, {})
        cells.append(f"{v['sep_us']:.2f} / {v['b2b_us']:.2f}" if "sep_us" in v else v.get("error", "-")[:60])
    t, s = a.get("torch", {}), a.get("siblings", {})
    x = f"{t['sep_us'] / s['sep_us']:.3f}" if "sep_us" in t and "sep_us" in s else "-"
    tu = a.get("tunedb", {})
    xt = f"{tu['sep_us'] / s['sep_us']:.3f}" if "sep_us" in tu and "sep_us" in s else "-"
    return f"| {r['group']} | {r['dtype']} | {r.get('M', 1)} | {r['MB']} | " + " | ".join(cells) + f" | {x} | {xt} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="siblings_gemv.json")
    ap.add_argument("--rows", default="1", help="comma-separated rows M (1-16)")
    ap.add_argument("--dtypes", default="", help="comma-separated torch dtypes (default: fp16, and bf16 for Llama)")
    ap.add_argument("--groups", default="", help="comma-separated group names (default: all)")
    args = ap.parse_args()
    rows_m = [int(v) for v in args.rows.split(",")]
    if not all(1 <= v <= 16 for v in rows_m):
        ap.error(f"--rows takes 1 to 16, got {args.rows!r}")
    groups = [g for g in args.groups.split(",") if g] or list(GROUPS)
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        ap.error(f"unknown group(s) {bad}; groups are {list(GROUPS)}")
    import torch
    import triton

    from tunedb import settings
    from tunedb.runtime import selector

    t0 = time.time()
    rows = []
    with settings.override(USER_DB="off"):
        selector.reload()
        for name in groups:
            dts = args.dtypes.split(",") if args.dtypes else (
                ("float16", "bfloat16") if name.startswith("llama3-8b") else ("float16",))
            for dt in dts:
                for m in rows_m:
                    rows.append(one(name, dt, m))
                    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
    print("| group | dtype | M | MB | torch sep / b2b us | tunedb | cat | siblings | siblings x torch (sep) | x tunedb |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(line(r))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "wall_s": round(time.time() - t0, 1)}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    for r in rows:
        best = min((a for a in r["arms"] if a.startswith("siblings") and "sep_us" in r["arms"][a]),
                   key=lambda a: r["arms"][a]["sep_us"], default=None)
        if best:
            print(r["group"], r["dtype"], "M", r.get("M", 1), "best siblings tile", best, round(r["arms"][best]["sep_us"], 2),
                  "x torch", round(r["arms"]["torch"]["sep_us"] / r["arms"][best]["sep_us"], 3))
    print(env)


if __name__ == "__main__":
    main()
