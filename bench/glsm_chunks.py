"""The chunked linear_rows design (docs/glsm_gap.md, "Chunks in L2": cuBLAS's GEMM and the row
pass chunk by chunk of R rows, so the pass reads and rewrites each chunk's logits in L2) beside
torch's linear + log_softmax and what the shipped table serves, at the CTC census points with
M >= 256 plus M = 2048, in ONE run.

    PYTHONPATH=src python bench/glsm_chunks.py --out DIR [--quick] [--budget-s 80]

Points: bench/census/ctc_heads.json's (N, K) (bf16 with bias; N = 5000 / 16000 / 32000,
K = 256 / 512 / 512) at M = 256, 1024, 2048 (not a census M), 4096, 8192 (15 points).
Arms, each checked first against the fp32 reference (NaN-poisoned output, within 4x torch's own
error: else a failed row, not timed), then timed as bench/gemm_log_softmax.py times the family (a
CUDA graph of n calls over head-weight copies read cold, median of 7 replays / n):
  torch         F.linear + torch.log_softmax
  shipped       the config src/tunedb/db/sm90/gemm_log_softmax.json serves at (signature, M)
  lc_m{R}_st{S}_<pass>  the family's chunked_rows lane (configs_chunks.py, through FAM.launch)
                with the shipped row pass's config (linear_rows' at that point; the table's lr
                config of the signature where it serves rowfix): chunks of R rows (R in CHUNKS,
                R < M, valid by the family's predicate: the chunk's logits within 0.55 of L2),
                st1 (one stream), st1 + _pdl (the pass a programmatic dependent of its chunk's
                GEMM) and st2 (each chunk's pass forked onto a side stream, overlapping the next
                chunk's GEMM); --quick: R = 128 only at M <= 1024; full runs also with ALT's
                row pass (one read of each row)
  whole_s1      launch_chunks.chunked_call with R = M: one GEMM into the output, the pass in
                place (what chunking changes beside the shipped arm's separate logits buffer)
  linear        F.linear alone (cuBLAS's share)
Per point: us, x torch and x shipped of every arm, the best chunked arm. Geomeans over the
census points (M = 2048 left out) of shipped and best-of(shipped, chunked); and a projection over
all 15 census points with M = 64 at the shipped table's own evidence (labelled as such). Writes
DIR/glsm_chunks.json after every point. Expected run time on an H200: --quick 40-75 s (a few
row-pass compiles, cuBLAS's first calls; 15 points, about 175 timed arms), full 90-150 s (set
--budget-s 140); --budget-s stops
starting new points (largest M first: M = 256, where one chunk of 128 rows is all there is,
runs last).
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
from tunedb.database import write_atomic
from tunedb.families.gemm_log_softmax import configs_chunks as chunks
from tunedb.families.gemm_log_softmax.launch_chunks import chunked_call

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from gemm_log_softmax import cell, failed_arms, gated_times, geomean, gpu_l2, graph_us, point_inputs  # noqa: E402  (bench/gemm_log_softmax.py)

FAM = families.get("gemm_log_softmax")
ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "bench" / "census" / "ctc_heads.json"
TABLE = ROOT / "src" / "tunedb" / "db" / "sm90" / "gemm_log_softmax.json"
MS = (256, 1024, 2048, 4096, 8192)
EXTRA_MS = (2048,)  # not census points: left out of the census geomeans
CHUNKS = chunks.CHUNK_ROWS
QUICK_CHUNKS = CHUNKS
VARIANTS = ((1, False), (1, True), (2, False))  # (streams, pdl)
QUICK_SMALL_MAX_M = 1024  # --quick: R = 128 only up to this M (64 chunks at 8192 cost capture time)
# full runs only: a second row pass inside the chunks, one read of each row (the shipped pass at
# N = 16000 is two-pass, C = 8192 < N; at 32000 persistent; at 5000 one row a program)
ALT = {5000: "lr_r4_c8192_w16", 16000: "lr_r1_c16384_w16", 32000: "lr_r1_c32768_w16"}


def census_pairs() -> list[tuple[int, int]]:
    pairs = set()
    for p in json.loads(CENSUS.read_text())["points"]:
        fields = dict(kv.split("=") for kv in p["signature"].split("|")[2:])
        pairs.add((int(fields["N"]), int(fields["K"])))
    return sorted(pairs)


def census_weights() -> dict[tuple[int, int, int], float]:
    """{(N, K, M): weight} of the census points (the geomean weighs points equally, as the
    issue's goal does; the weights are recorded for the reader)."""
    out = {}
    for p in json.loads(CENSUS.read_text())["points"]:
        fields = dict(kv.split("=") for kv in p["signature"].split("|")[2:])
        out[(int(fields["N"]), int(fields["K"]), int(p["M"]))] = p["weight"]
    return out


def points() -> list[tuple[int, int, int]]:
    """Largest M first: if the budget runs out, the points where chunking can matter are done."""
    return sorted(((n, k, m) for n, k in census_pairs() for m in MS), key=lambda t: (-t[2], t[0]))


def shipped_pick(table: dict, sig_key: str, m: int) -> str:
    """The config the shipped table's regions serve at M (torch where the signature has none)."""
    entry = table["entries"].get(sig_key)
    if entry is None:
        return "torch"
    for hi, cid in entry["regions"]:
        if hi is None or m <= hi:
            return cid
    return "torch"


def row_config(table: dict, sig_key: str, m: int) -> str:
    """The row pass the chunked arms use: the shipped pick where it is linear_rows, else the
    signature's first linear_rows pick at a larger M, else lr_r1_c8192_w8."""
    pick = shipped_pick(table, sig_key, m)
    if pick.startswith("lr_"):
        return pick
    for _, cid in (table["entries"].get(sig_key) or {"regions": []})["regions"]:
        if cid.startswith("lr_"):
            return cid
    return "lr_r1_c8192_w8"


def chunk_rows(n: int, m: int, grid, quick: bool = False, arch=None) -> tuple[int, ...]:
    """R of the grid with R < M whose chunk's logits the family's predicate admits (arch: the
    shipped sm90 profile's L2 unless given)."""
    budget = chunks.l2_budget(arch or shipped_profile("sm90"))
    return tuple(r for r in grid if r < m and r * n * 2 <= budget and not (quick and r == 128 and m > QUICK_SMALL_MAX_M))


def pass_params(cid: str) -> dict:
    rc = FAM.parse_config(cid)
    return dict(rows=rc.param("rows"), chunk=rc.param("chunk"), warps=rc.param("warps"),
                pdl=rc.param("launch") == "pdl", persist=rc.param("persist"))


def run_point(n, k, m, l2, sm90, table, grid, device="cuda", timer=graph_us, dt="bf16", lr=None, alt=None,
              quick=False):
    """Every arm at one point; `device`, `timer`, `dt` and `lr` let the CPU smoke test run it
    under the interpreter (fp16: the interpreter's tl.dot mishandles bf16)."""
    sig, x, w, b, ref, out, copies, weights = point_inputs(dt, n, k, m, l2, device)
    pick = shipped_pick(table, sig.format(), m)
    lr = lr or row_config(table, sig.format(), m)
    rp = pass_params(lr)
    arms = {"torch": lambda w_, b_: FAM.launch(FAM.parse_config("torch"), sig, x, w_, b_, out=out)}
    if pick != "torch":
        arms["shipped"] = lambda w_, b_, cfg=FAM.parse_config(pick): FAM.launch(cfg, sig, x, w_, b_, out=out)
    arms["whole_s1"] = lambda w_, b_: chunked_call(x, w_, b_, out, m, 1, **rp)
    passes = [rp] + ([pass_params(alt)] if alt and alt != lr else [])
    for r in chunk_rows(n, m, grid, quick=quick, arch=sm90):
        for pp in passes:
            for s, pdl in VARIANTS:
                cfg = chunks.make(r, s, pp["rows"], pp["chunk"], pp["warps"], pdl=pdl, persist=pp["persist"])
                if FAM.invalid_reason(cfg, sig, m, sm90) is None:
                    arms[cfg.id] = lambda w_, b_, cfg=cfg: FAM.launch(cfg, sig, x, w_, b_, out=out)
    row = {"N": n, "K": k, "M": m, "copies": copies, "shipped_pick": pick, "row_pass": lr, "times_us": {},
           "errors": {}, "failed": {}}
    gated_times(row, arms, w, b, out, ref, timer, weights)
    row["times_us"]["linear"] = timer(lambda w_, b_: torch.nn.functional.linear(x, w_, b_), weights)
    summarise(row)
    return row


def summarise(row):
    t = row["times_us"]
    tt = t["torch"]
    shipped = t.get("shipped", tt if row["shipped_pick"] == "torch" else None)
    ch = {c: v for c, v in t.items() if c.startswith(chunks.PREFIX) or c == "whole_s1"}
    best = min(ch, key=ch.get) if ch else None
    row["shipped_x"] = tt / shipped if shipped else None
    row["chunk_best"], row["chunk_x"] = best, (tt / ch[best] if best else None)
    row["chunk_vs_shipped"] = shipped / ch[best] if best and shipped else None
    cands = [v for v in (shipped, ch.get(best)) if v]
    row["best_x"] = tt / min(cands) if cands else None


def markdown(rows, evidence_x=None):
    f = cell
    lines = ["| N | K | M | torch us | linear us | shipped pick | shipped us | shipped x | row pass | best chunked "
             "| chunked us | chunked x torch | chunked x shipped |", "|" + "---|" * 13]
    for r in rows:
        t = r["times_us"]
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {f(t['torch'], '.1f')} | {f(t.get('linear'), '.1f')} "
                     f"| {r['shipped_pick']} | {f(t.get('shipped'), '.1f')} | {f(r['shipped_x'])} | {r['row_pass']} "
                     f"| {r['chunk_best'] or '-'} | {f(t.get(r['chunk_best']) if r['chunk_best'] else None, '.1f')} "
                     f"| {f(r['chunk_x'])} | {f(r['chunk_vs_shipped'])} |")
    lines += ["", "Every arm (us, x torch, x shipped):", "", "| N | M | arm | us | x torch | x shipped |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        t = r["times_us"]
        sh = t.get("shipped", t["torch"] if r["shipped_pick"] == "torch" else None)
        for name, us in t.items():
            if name in ("torch", "linear"):
                continue
            lines.append(f"| {r['N']} | {r['M']} | {name} | {us:.1f} | {t['torch'] / us:.3f} "
                         f"| {f(sh / us if sh else None, '.3f')} |")
    lines += failed_arms(rows, lambda r: f"{r['N']}x{r['K']} M={r['M']}")
    census = [r for r in rows if r["M"] not in EXTRA_MS]
    lines += ["", f"census points here ({len(census)}, M >= 256): shipped {geomean([r['shipped_x'] for r in census]):.3f}x, "
                  f"best of shipped and chunked {geomean([r['best_x'] for r in census]):.3f}x torch"]
    if evidence_x:
        proj = [r["best_x"] for r in census] + list(evidence_x.values())
        shp = [r["shipped_x"] for r in census] + list(evidence_x.values())
        lines.append(f"projection over {len(proj)} census points (M = 64 at the shipped table's evidence, "
                     f"{', '.join(f'{k}: {v:.3f}x' for k, v in evidence_x.items())}): shipped {geomean(shp):.3f}x, "
                     f"best of shipped and chunked {geomean(proj):.3f}x")
    return "\n".join(lines)


def evidence_x(table: dict, ms=(64,)) -> dict[str, float]:
    """{'N=..,M=..': torch / pick} from the shipped table's own evidence at the census M not run here."""
    out = {}
    for key, entry in table["entries"].items():
        n = int(dict(kv.split("=") for kv in key.split("|")[2:])["N"])
        for m in ms:
            ev = entry.get("evidence", {}).get(f"M={m}", {})
            pick = shipped_pick(table, key, m)
            if "torch" in ev and pick in ev:
                out[f"N={n},M={m}"] = ev["torch"][0] / ev[pick][0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a directory for glsm_chunks.json, or a path ending .json")
    ap.add_argument("--quick", action="store_true", help="the shipped row pass only; R = 128 only at M <= 1024")
    ap.add_argument("--budget-s", type=float, default=80.0, help="stop starting new points after this")
    ap.add_argument("--table", default=str(TABLE), help="the shipped table whose picks are timed")
    args = ap.parse_args()
    gpu = gpu_l2()
    if gpu is None:
        return 2
    sm90, l2 = gpu
    table = json.loads(Path(args.table).read_text())
    grid = QUICK_CHUNKS if args.quick else CHUNKS
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "glsm_chunks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ev = evidence_x(table)
    t0 = time.monotonic()
    rows, skipped = [], []
    for n, k, m in points():
        if time.monotonic() - t0 > args.budget_s:
            skipped.append((n, k, m))
            continue
        rows.append(run_point(n, k, m, l2, sm90, table, grid, alt=None if args.quick else ALT.get(n), quick=args.quick))
        r = rows[-1]
        print(f"[{time.monotonic() - t0:6.1f}s] N={n} K={k} M={m}: torch {r['times_us']['torch']:.1f} us, shipped "
              f"{r['shipped_x'] or 0:.3f}x ({r['shipped_pick']}), chunked {r['chunk_x'] or 0:.3f}x ({r['chunk_best']}), "
              f"x shipped {r['chunk_vs_shipped'] or 0:.3f}", file=sys.stderr, flush=True)
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
               "command": " ".join(sys.argv), "skipped": skipped, "l2_bytes": l2,
               "budget_bytes": chunks.l2_budget(sm90),
               "chunks": list(grid), "evidence_x_m64": ev}
        write_atomic(path, json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    if skipped:
        doc = json.loads(path.read_text()) if path.exists() else {"env": {}, "rows": rows}
        doc["env"]["skipped"] = skipped
        write_atomic(path, json.dumps(doc, indent=1) + "\n")
    print(markdown(rows, ev))
    print(f"\nwall {time.monotonic() - t0:.1f} s; skipped (budget): {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
