"""The arithmetic and tables of bench/decode_pf.py (pure Python, no torch): the best arm of each kind
per point, each `_pf` variant's geomean over cuBLAS, the goals (share of 4.3 TB/s at M=1 for
weights >= 16 MB, geomean over cuBLAS through the gate) and the layer chains.

A point row holds N, K, M, MB, cublas_us, read_us / read (the fastest pure read of the weight, PDL
read arms included) and all_us {config id: us} for every lane arm that passed the reference check.
Old arms are `dk` ids without `_pf`, new arms those with `_pf{P}`; every time is per call of a
chain of back-to-back calls on rotating cold weights, so a `_pdl` arm overlaps its predecessor.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

from decode_bounds import GOAL_BW, GOAL_GEOMEAN, GOAL_MIN_MB, geomean, share, weight_bytes

_PF = re.compile(r"_pfn?\d+")


def is_pf(cid: str) -> bool:
    return bool(_PF.search(cid))


def is_old(cid: str) -> bool:
    return cid.startswith("dk") and not is_pf(cid)


def best(all_us: Mapping[str, float], pred: Callable[[str], bool], pdl: bool | None = None) -> str | None:
    pool = [c for c in all_us if pred(c) and (pdl is None or c.endswith("_pdl") == pdl)]
    return min(pool, key=all_us.__getitem__) if pool else None


def picks(row: Mapping) -> dict[str, str | None]:
    us = row["all_us"]
    return {"old_pdl": best(us, is_old, pdl=True), "pf_pdl": best(us, is_pf, pdl=True),
            "pf_nopdl": best(us, is_pf, pdl=False)}


def point_line(row: Mapping) -> str:
    nb = weight_bytes(row["N"], row["K"])
    p = picks(row)
    out = [f"{row['N']:6d}x{row['K']:<6d} M={row['M']:2d} {row['MB']:7.1f} MB  cuBLAS {row['cublas_us']:7.2f} us "
           f"({share(nb, row['cublas_us']):5.1%})"]
    if row.get("read_us"):
        out.append(f"read {row['read_us']:7.2f} ({share(nb, row['read_us']):5.1%})")
    for kind in ("old_pdl", "pf_pdl", "pf_nopdl"):
        cid = p[kind]
        if cid:
            us = row["all_us"][cid]
            out.append(f"{kind} {us:7.2f} ({share(nb, us):5.1%}, x{row['cublas_us'] / us:.3f}) {cid}")
    return "  ".join(out)


def summarize(rows: Sequence[Mapping], variants: Sequence[str]) -> dict:
    """Per variant: points, geomean x cuBLAS, worst share at M=1 for weights >= 16 MB; per kind
    (best of each kind per point): the same, raw and through the gate (max(1, x): cuBLAS serves
    where the arm loses)."""
    out: dict = {"per_variant": {}, "per_kind": {}}
    for cid in variants:
        xs = [r["cublas_us"] / r["all_us"][cid] for r in rows if cid in r["all_us"]]
        bw = [share(weight_bytes(r["N"], r["K"]), r["all_us"][cid]) for r in rows
              if cid in r["all_us"] and r["M"] == 1 and r["MB"] >= GOAL_MIN_MB]
        if xs:
            out["per_variant"][cid] = {"points": len(xs), "geomean_x_cublas": geomean(xs),
                                       "min_bw_m1_16MB": min(bw) if bw else None}
    for kind in ("old_pdl", "pf_pdl", "pf_nopdl", "read"):
        xs, bw = [], []
        for r in rows:
            if kind == "read":
                us = r.get("read_us")
            else:
                cid = picks(r)[kind]
                us = r["all_us"][cid] if cid else None
            if not us:
                continue
            xs.append(r["cublas_us"] / us)
            if r["M"] == 1 and r["MB"] >= GOAL_MIN_MB:
                bw.append(share(weight_bytes(r["N"], r["K"]), us))
        if xs:
            out["per_kind"][kind] = {"points": len(xs), "geomean_x_cublas": geomean(xs),
                                     "geomean_gated": geomean(max(1.0, x) for x in xs),
                                     "min_bw_m1_16MB": min(bw) if bw else None}
    return out


def verdicts(summary: Mapping) -> list[str]:
    lines = ["(each time is per call of a chain of 8 calls of one config: a PDL arm overlaps a copy of itself;"
             " the Llama layer chain below is the model's case)"]
    for kind, name in (("pf_pdl", "new _pf lane (PDL)"), ("old_pdl", "old lane (PDL)"), ("read", "pure read")):
        s = summary["per_kind"].get(kind)
        if not s:
            continue
        if s["min_bw_m1_16MB"] is not None:
            ok = s["min_bw_m1_16MB"] >= GOAL_BW
            lines.append(f"bandwidth goal (>= {GOAL_BW:.0%} of 4.3 TB/s at M=1, weights >= {GOAL_MIN_MB:.0f} MB), "
                         f"{name}: worst {s['min_bw_m1_16MB']:.1%} -> {'MET' if ok else 'NOT MET'}")
        if kind != "read":
            ok = s["geomean_gated"] >= GOAL_GEOMEAN
            lines.append(f"geomean goal (>= {GOAL_GEOMEAN:.2f}x cuBLAS through the gate, M = 1 and 16 here), {name}: "
                         f"{s['geomean_gated']:.3f}x (raw {s['geomean_x_cublas']:.3f}x) -> {'MET' if ok else 'NOT MET'}")
    return lines


def report(rows: Sequence[Mapping], variants: Sequence[str], occupancy: Mapping[str, Mapping]) -> list[str]:
    """Print the variant table and the verdicts; return the verdict lines."""
    s = summarize(rows, variants)
    print("\n| config | points | geomean x cuBLAS | worst % 4.3 TB/s M=1 >= 16 MB | CTAs/SM | grid at 4096x4096 | waves |")
    print("|---|---|---|---|---|---|---|")
    for cid, v in sorted(s["per_variant"].items(), key=lambda kv: -kv[1]["geomean_x_cublas"]):
        occ = occupancy.get(cid, {})
        bw = f"{v['min_bw_m1_16MB']:.1%}" if v["min_bw_m1_16MB"] is not None else "-"
        print(f"| `{cid}` | {v['points']} | {v['geomean_x_cublas']:.3f}x | {bw} | {occ.get('ctas_per_sm', '-')} | "
              f"{occ.get('grid', '-')} | {occ.get('waves', '-')} |")
    print("\n| best of each kind per point | points | geomean x cuBLAS | gated | worst % 4.3 TB/s M=1 >= 16 MB |")
    print("|---|---|---|---|---|")
    for kind, v in s["per_kind"].items():
        bw = f"{v['min_bw_m1_16MB']:.1%}" if v["min_bw_m1_16MB"] is not None else "-"
        print(f"| {kind} | {v['points']} | {v['geomean_x_cublas']:.3f}x | {v['geomean_gated']:.3f}x | {bw} |")
    for r in rows:  # the goal's worst weight (33.6 MB): every arm side by side
        if (r["N"], r["K"]) == (4096, 4096):
            nb = weight_bytes(r["N"], r["K"])
            print(f"\n4096x4096 M={r['M']}: cuBLAS {r['cublas_us']:.2f} us ({share(nb, r['cublas_us']):.1%}), "
                  f"read {r.get('read_us') or float('nan'):.2f} us ({r.get('read')})")
            for cid, us in sorted(r["all_us"].items(), key=lambda kv: kv[1]):
                print(f"  {us:7.2f} us {share(nb, us):6.1%} x{r['cublas_us'] / us:.3f}  {cid}")
    lines = verdicts(s)
    print()
    for ln in lines:
        print(ln)
    return lines


def report_chains(chains: Sequence[Mapping]) -> None:
    print("\nLlama layer chain (qkv, o, gate_up, down; cold layers, one CUDA graph), us per layer:")
    for c in chains:
        if "error" in c or "cublas_us" not in c:
            print(f"  M={c.get('M')}: {c.get('error', 'no picks')}")
            continue
        parts = [f"cuBLAS {c['cublas_us']:.1f}"]
        for key in ("old_pdl", "pf_pdl", "pf_nopdl", "read"):
            if f"{key}_us" in c:
                parts.append(f"{key} {c[f'{key}_us']:.1f} (x{c['cublas_us'] / c[f'{key}_us']:.3f})")
        print(f"  M={c['M']:2d}: " + ", ".join(parts))
