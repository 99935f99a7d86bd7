"""The arithmetic and tables of bench/decode_lane_s14.py (pure Python, no torch): the best arm of
each kind per point, the goals (bandwidth at M=1, geomean over cuBLAS) and what each idea buys.

A point row holds N, K, M, MB, read_us (the best non-PDL pure read), cublas_us and all_us
{config id: us} for every arm that passed the reference check. New arms are `ds_` (stream
kernel) configs, old arms `dk` ones; `_pdl` arms are reported apart (back to back they overlap
their own previous call, which a chain of different GEMMs does not).
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from decode_bounds import GOAL_BW, GOAL_GEOMEAN, GOAL_MIN_MB, geomean, share, weight_bytes


def is_new(cid: str) -> bool:
    return cid.startswith("ds_")


def is_old(cid: str) -> bool:
    return cid.startswith("dk")


def is_det(cid: str) -> bool:
    return "_at" not in cid


def best(all_us: Mapping[str, float], pred: Callable[[str], bool], pdl: bool | None = None) -> str | None:
    """The fastest arm satisfying pred (and, unless pdl is None, with or without `_pdl`)."""
    pool = [c for c in all_us if pred(c) and (pdl is None or c.endswith("_pdl") == pdl)]
    return min(pool, key=all_us.__getitem__) if pool else None


def picks(row: Mapping) -> dict[str, str | None]:
    """The arm of each kind at one point."""
    us = row["all_us"]
    return {"old": best(us, is_old), "old_nopdl": best(us, is_old, pdl=False),
            "new": best(us, is_new, pdl=False), "new_det": best(us, lambda c: is_new(c) and is_det(c), pdl=False),
            "new_pdl": best(us, is_new, pdl=True),
            "lane": best(us, lambda c: True, pdl=False)}


def _cell(row: Mapping, cid: str | None) -> str:
    if cid is None:
        return "- | - | -"
    us = row["all_us"][cid]
    return f"{us:.2f} | {share(weight_bytes(row['N'], row['K']), us):.1%} | {row['cublas_us'] / us:.3f}x"


def point_line(row: Mapping) -> str:
    p = picks(row)
    nb = weight_bytes(row["N"], row["K"])

    def one(kind):
        cid = p[kind]
        if cid is None:
            return f"{kind} -"
        us = row["all_us"][cid]
        return f"{kind} {us:7.2f} us ({share(nb, us):5.1%}, x{row['cublas_us'] / us:.3f}) {cid}"

    return (f"  {row['N']}x{row['K']} M={row['M']:2d} cuBLAS {row['cublas_us']:7.2f} us ({share(nb, row['cublas_us']):5.1%}) "
            f"read {row['read_us']:7.2f} | {one('old')} | {one('new')} | {one('new_pdl')}"
            + (f" | failed {row['failed']}" if row.get("failed") else ""))


def _ratios(rows: Iterable[Mapping], cid: str | None = None, kind: str | None = None) -> list[float]:
    out = []
    for r in rows:
        c = cid if cid is not None else picks(r)[kind]
        if c is not None and c in r["all_us"]:
            out.append(r["cublas_us"] / r["all_us"][c])
    return out


def summarize(rows: Sequence[Mapping], new: Sequence[str]) -> dict:
    """Goals and ablations over the measured points."""
    out: dict = {"points": len(rows)}
    for kind in ("old", "old_nopdl", "new", "new_det", "new_pdl", "lane"):
        xs = _ratios(rows, kind=kind)
        if xs:
            out[f"geomean_{kind}"] = geomean(xs)
            out[f"geomean_{kind}_gated"] = geomean(max(1.0, x) for x in xs)  # the gate serves cuBLAS below 1x
            out[f"covered_{kind}"] = len(xs)
    big = [r for r in rows if r["M"] == 1 and r["MB"] >= GOAL_MIN_MB]
    for kind in ("old_nopdl", "new", "new_det", "lane"):
        bws = [share(weight_bytes(r["N"], r["K"]), r["all_us"][picks(r)[kind]]) for r in big if picks(r)[kind]]
        if bws and len(bws) == len(big):
            out[f"min_bw_m1_{kind}"] = min(bws)
    out["per_variant"] = {c: {"geomean_x_cublas": geomean(xs), "points": len(xs)}
                          for c in new if (xs := _ratios(rows, cid=c))}
    # ideas: the atomic reduction against its deterministic twin, PDL against its original
    at = [r["all_us"][c.replace("_at", "")] / r["all_us"][c] for r in rows for c in r["all_us"]
          if is_new(c) and "_at" in c and not c.endswith("_pdl") and c.replace("_at", "") in r["all_us"]]
    if at:
        out["atomic_over_det"] = geomean(at)
    pdl = [r["all_us"][c[:-4]] / r["all_us"][c] for r in rows for c in r["all_us"]
           if is_new(c) and c.endswith("_pdl") and c[:-4] in r["all_us"]]
    if pdl:
        out["pdl_self_overlap_gain"] = geomean(pdl)
    for label, pred in (("dot", lambda c: is_new(c) and "_fma" not in c), ("fma", lambda c: is_new(c) and "_fma" in c)):
        out[f"geomean_best_{label}"] = {str(m): geomean(r["cublas_us"] / r["all_us"][b] for r in rows if r["M"] == m
                                                        and (b := best(r["all_us"], pred, pdl=False)))
                                        for m in sorted({r["M"] for r in rows})
                                        if any(best(r["all_us"], pred, pdl=False) for r in rows if r["M"] == m)}
    noise = [r["cublas_again_us"] / r["cublas_us"] for r in rows if r.get("cublas_again_us")]
    if noise:
        out["cublas_repeat_ratio_range"] = [min(noise), max(noise)]
    return out


def verdicts(s: Mapping) -> list[str]:
    lines = []
    for kind, what in (("new", "new lane (ds, no PDL)"), ("lane", "whole lane (old or new, no PDL)")):
        if f"min_bw_m1_{kind}" in s:
            v = s[f"min_bw_m1_{kind}"]
            lines.append(f"bandwidth goal (>= {GOAL_BW:.0%} of 4.3 TB/s at M=1, weights >= {GOAL_MIN_MB:.0f} MB), "
                         f"{what}: worst {v:.1%} -> {'MET' if v >= GOAL_BW else 'NOT MET'}")
        if f"geomean_{kind}_gated" in s:
            g = s[f"geomean_{kind}_gated"]
            lines.append(f"geomean goal (>= {GOAL_GEOMEAN:.2f}x cuBLAS), {what}: {s[f'geomean_{kind}']:.3f}x raw, "
                         f"{g:.3f}x through the gate over {s[f'covered_{kind}']} points -> "
                         f"{'MET' if g >= GOAL_GEOMEAN else 'NOT MET'}")
    if "geomean_old" in s:
        lines.append(f"old lane (dk, PDL twins included, as BENCHMARKS.md): {s['geomean_old']:.3f}x raw")
    return lines


def _matrix(rows: Sequence[Mapping]) -> None:
    """Every arm at every point as x cuBLAS (blank: invalid, failed or cut by the budget)."""
    arms = list(dict.fromkeys(c for r in rows for c in r["all_us"]))
    arms.sort(key=lambda c: (not is_new(c), c.endswith("_pdl"), c))
    print("\n| arm (x cuBLAS) | " + " | ".join(f"{r['N']}x{r['K']} M{r['M']}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for c in arms:
        cells = [f"{r['cublas_us'] / r['all_us'][c]:.2f}" if c in r["all_us"] else "" for r in rows]
        print(f"| `{c}` | " + " | ".join(cells) + " |")


def report(rows: Sequence[Mapping], new: Sequence[str]) -> list[str]:
    """Print the tables; return the verdict lines."""
    print("\n| N x K | MB | M | read us | cuBLAS us | % 4.3 | old best us | % 4.3 | x cuBLAS | new best us | % 4.3 | "
          "x cuBLAS | new det us | % 4.3 | x cuBLAS | new+PDL us | % 4.3 | x cuBLAS | old id | new id |")
    print("|" + "---|" * 20)
    for r in rows:
        p = picks(r)
        nb = weight_bytes(r["N"], r["K"])
        print(f"| {r['N']} x {r['K']} | {r['MB']} | {r['M']} | {r['read_us']:.2f} | {r['cublas_us']:.2f} | "
              f"{share(nb, r['cublas_us']):.1%} | {_cell(r, p['old'])} | {_cell(r, p['new'])} | {_cell(r, p['new_det'])} | "
              f"{_cell(r, p['new_pdl'])} | `{p['old']}` | `{p['new']}` |")
    s = summarize(rows, new)
    _matrix(rows)
    print("\n| new variant | geomean x cuBLAS | points |")
    print("|---|---|---|")
    for c, v in sorted(s["per_variant"].items(), key=lambda kv: -kv[1]["geomean_x_cublas"]):
        print(f"| `{c}` | {v['geomean_x_cublas']:.3f} | {v['points']} |")
    print()
    for key in ("atomic_over_det", "pdl_self_overlap_gain", "geomean_best_dot", "geomean_best_fma",
                "cublas_repeat_ratio_range"):
        if key in s:
            print(f"{key}: {s[key]}")
    lines = verdicts(s)
    print()
    for line in lines:
        print(line)
    return lines


def report_chains(chains: Sequence[Mapping]) -> None:
    """The layer chains: per-layer us and x cuBLAS for the old lane, the new, the new with PDL."""
    if not chains:
        return
    print("\n| layer chain M | cuBLAS us | old best us (x) | new best us (x) | new best + PDL us (x) | new picks |")
    print("|---|---|---|---|---|---|")
    for c in chains:
        if "cublas_us" not in c:
            print(f"| {c.get('M')} | {c.get('error', 'no pick for every GEMM of the layer')} |")
            continue
        cells = [f"{c[k]:.1f} ({c[k.replace('_us', '_x_cublas')]:.3f}x)" if k in c else "-"
                 for k in ("old_us", "new_us", "new_pdl_us")]
        print(f"| {c['M']} | {c['cublas_us']:.1f} | {' | '.join(cells)} | {c['picks']} |")
