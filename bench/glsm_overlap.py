"""The triton_overlap arm (docs/glsm_gap.md: one persistent launch, the fix-ups of tiles written
LAG tiles earlier overlapping later tiles' GEMM) beside torch's linear + log_softmax and what the
shipped table serves, at the CTC census points, in ONE run.

    PYTHONPATH=src python bench/glsm_overlap.py --out DIR [--quick] [--budget-s 110]

Points: bench/census/ctc_heads.json (bf16 with bias; N = 5000 / 16000 / 32000, K = 256 / 512 /
512, M = 64..8192); --quick: M in {64, 256, 1024, 8192} (12 points) and 3 overlap configs.
Arms, each checked first against the fp32 reference (NaN-poisoned output, within 4x torch's own
error: else a failed row, not timed), then timed as bench/glsm_rows.py times them (a CUDA graph
over head-weight copies read cold, median of replays):
  torch      F.linear + torch.log_softmax
  shipped    the config src/tunedb/db/sm90/gemm_log_softmax.json serves at (signature, M)
  ov_...     the triton_overlap configs (valid at M >= 256)
  no-overlap the first ov config's tile as the rowfix lane's two kernels under PDL (tiles, then
             the fix-up, at every M: the rowfix predicate's M <= 1024 bypassed): the same Triton
             GEMM without the overlap, which says what the overlap itself buys
  linear     F.linear alone (the share of the time cuBLAS's GEMM takes)
Per point: torch us, the shipped pick and its x torch, the best ov config and its x, the best of
the two. Geomeans of shipped, best-of(shipped, ov) (what a rebuilt table could serve if the
build agrees) and of ov where valid. Writes DIR/glsm_overlap.json after every point. Expected
run time on an H200: --quick 50-80 s (most of it ~8 first compiles), full 90-120 s; --budget-s
stops starting new points (smallest M first).
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
from tunedb.families.gemm_log_softmax import configs_overlap, configs_rowfix
from tunedb.families.gemm_log_softmax.launch_overlap import overlap_arm
from tunedb.families.gemm_log_softmax.launch_rowfix import rowfix_arm
from tunedb.measure.timers import rotation_copies

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from gemm_log_softmax import failed_arms, geomean, graph_us  # noqa: E402  (bench/gemm_log_softmax.py)

FAM = families.get("gemm_log_softmax")
ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "bench" / "census" / "ctc_heads.json"
TABLE = ROOT / "src" / "tunedb" / "db" / "sm90" / "gemm_log_softmax.json"
QUICK_MS = (64, 256, 1024, 8192)
QUICK_OV = ("ov_b128x256x64_w8_s3", "ov_b128x128x64_w8_s3", "ov_b64x256x64_w4_s4")


def census_points(quick: bool):
    """(N, K, M) of the census, smallest M first (if the budget runs out the compiles are done)."""
    pts = set()
    for p in json.loads(CENSUS.read_text())["points"]:
        fields = dict(kv.split("=") for kv in p["signature"].split("|")[2:])
        if not quick or int(p["M"]) in QUICK_MS:
            pts.add((int(fields["N"]), int(fields["K"]), int(p["M"])))
    return sorted(pts, key=lambda t: (t[2], t[0]))


def shipped_pick(table: dict, sig_key: str, m: int) -> str:
    """The config the shipped table's regions serve at M (torch where the signature has none)."""
    entry = table["entries"].get(sig_key)
    if entry is None:
        return "torch"
    for hi, cid in entry["regions"]:
        if hi is None or m <= hi:
            return cid
    return "torch"


def run_point(n, k, m, l2, sm90, table, ov_ids, device="cuda", timer=graph_us, dt="bf16"):
    """Every arm at one point; `device`, `timer` and `dt` let the CPU smoke test run it under
    the interpreter (fp16: the interpreter's tl.dot mishandles bf16)."""
    sig = FAM.make_signature(n, k, dt, 1)
    (x, w, b), _ = FAM.make_inputs(sig, m, device, seed=m + n + k)
    ref = FAM.reference(sig, x, w, b)
    out = torch.empty((m, n), dtype=x.dtype, device=device)
    copies = rotation_copies(1 << 40, l2, FAM.weight_bytes(sig), x.numel() * 2 + 2 * out.numel() * 2)
    weights = [(w.clone(), b.clone()) for _ in range(copies)]
    pick = shipped_pick(table, sig.format(), m)
    arms = {"torch": FAM.parse_config("torch")}
    if pick != "torch":
        arms["shipped"] = FAM.parse_config(pick)
    for cid in ov_ids:
        arms[cid] = configs_overlap.parse(cid)
    if ov_ids:
        c0 = configs_overlap.parse(ov_ids[0])
        arms["no-overlap"] = configs_rowfix.make(*c0.param("block"), c0.param("warps"), c0.param("stages"), "pdl")
    row = {"N": n, "K": k, "M": m, "copies": copies, "shipped_pick": pick, "times_us": {}, "errors": {}, "failed": {}}
    base = None
    for name, cfg in arms.items():
        if cfg.lane == configs_overlap.LANE:
            why = configs_overlap.reason(cfg, n, k, m, sm90)
            call = lambda w_, b_, cfg=cfg: overlap_arm(cfg, x, w_, b_, out=out)  # noqa: E731
        elif name == "no-overlap":
            why = configs_overlap.reason(arms[ov_ids[0]], n, k, m, sm90)  # where its ov twin runs
            call = lambda w_, b_, cfg=cfg: rowfix_arm(cfg, x, w_, b_, out=out)  # noqa: E731
        else:
            why = FAM.invalid_reason(cfg, sig, m, sm90)
            call = lambda w_, b_, cfg=cfg: FAM.launch(cfg, sig, x, w_, b_, out=out)  # noqa: E731
        if why:
            row["failed"][name] = f"invalid: {why}"
            continue
        try:
            out.fill_(float("nan"))
            call(w, b)
            err = ((out.float() - ref).norm() / ref.norm()).item()
        except Exception as exc:  # a compile or launch failure is a row, not a crash
            row["failed"][name] = f"error: {type(exc).__name__}: {exc}"[:300]
            continue
        row["errors"][name] = err
        base = err if name == "torch" else base
        if name != "torch" and not err <= 4 * base:
            row["failed"][name] = f"gate: error {err:.3g} > 4 x torch's {base:.3g}"
            continue
        row["times_us"][name] = timer(call, weights)
    row["times_us"]["linear"] = timer(lambda w_, b_: torch.nn.functional.linear(x, w_, b_), weights)
    summarise(row)
    return row


def summarise(row):
    t = row["times_us"]
    tt = t["torch"]
    shipped = t.get("shipped", tt if row["shipped_pick"] == "torch" else None)
    ov = {c: v for c, v in t.items() if c.startswith(configs_overlap.PREFIX)}
    best_ov = min(ov, key=ov.get) if ov else None
    row["shipped_x"] = tt / shipped if shipped else None
    row["ov_best"], row["ov_x"] = best_ov, (tt / ov[best_ov] if best_ov else None)
    cands = [v for v in (shipped, ov.get(best_ov)) if v]
    row["best_x"] = tt / min(cands) if cands else None


def markdown(rows):
    f = lambda v, s=".2f": "-" if v is None else format(v, s)  # noqa: E731
    lines = ["| N | K | M | torch us | linear us | shipped pick | shipped x | best ov | ov us | ov x | best of both x "
             "| no-overlap x |", "|" + "---|" * 12]
    for r in rows:
        t = r["times_us"]
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {f(t['torch'], '.1f')} | {f(t.get('linear'), '.1f')} "
                     f"| {r['shipped_pick']} | {f(r['shipped_x'])} | {r['ov_best'] or '-'} "
                     f"| {f(t.get(r['ov_best']) if r['ov_best'] else None, '.1f')} | {f(r['ov_x'])} | {f(r['best_x'])} "
                     f"| {f(t['torch'] / t['no-overlap'] if t.get('no-overlap') else None)} |")
    lines += failed_arms(rows, lambda r: f"{r['N']}x{r['K']} M={r['M']}")
    valid = [r for r in rows if r["ov_x"]]
    lines += ["", f"geomean over {len(rows)} points: shipped {geomean([r['shipped_x'] for r in rows]):.3f}x, "
                  f"best of shipped and ov {geomean([r['best_x'] for r in rows]):.3f}x torch",
              f"where ov is valid ({len(valid)} points): shipped {geomean([r['shipped_x'] for r in valid]):.3f}x, "
              f"ov {geomean([r['ov_x'] for r in valid]):.3f}x"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for glsm_overlap.json")
    ap.add_argument("--quick", action="store_true", help="M in {64, 256, 1024, 8192}, 3 overlap configs")
    ap.add_argument("--budget-s", type=float, default=110.0, help="stop starting new points after this")
    ap.add_argument("--table", default=str(TABLE), help="the shipped table whose picks are timed")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    sm90 = shipped_profile("sm90")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or sm90.l2_bytes
    table = json.loads(Path(args.table).read_text())
    ov_ids = QUICK_OV if args.quick else tuple(c.id for c in configs_overlap.grid())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows, skipped = [], []
    for n, k, m in census_points(args.quick):
        if time.monotonic() - t0 > args.budget_s:
            skipped.append((n, k, m))
            continue
        rows.append(run_point(n, k, m, l2, sm90, table, ov_ids))
        r = rows[-1]
        print(f"[{time.monotonic() - t0:6.1f}s] N={n} K={k} M={m}: torch {r['times_us']['torch']:.1f} us, shipped "
              f"{r['shipped_x'] or 0:.2f}x ({r['shipped_pick']}), ov {r['ov_x'] or 0:.2f}x ({r['ov_best']})",
              file=sys.stderr, flush=True)
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
               "command": " ".join(sys.argv), "skipped": skipped}
        (out / "glsm_overlap.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(markdown(rows))
    print(f"\nwall {time.monotonic() - t0:.1f} s; skipped (budget): {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
