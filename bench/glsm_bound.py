"""Where gemm_log_softmax's geomean can move: per census point, the served speedup from the
shipped table's own evidence and what a design keeping cuBLAS's GEMM with a row pass AT its
memory floor would give (a simple bound model; CPU only, no measurement).

    PYTHONPATH=src python bench/glsm_bound.py [--table src/tunedb/db/sm90/gemm_log_softmax.json]
        [--probe bench/results/s13_B/logs.tgz] [--bw-tbs 3.9] [--min-pass-us 2.5]

Model: torch's time t and the served arm's s are the table's evidence. torch.log_softmax alone
is a + r * floor (floor = one read + one write of the M x N logits at 4.3 TB/s), a and r fitted
per N to session 13 B's probe (bench/lsm_probe.py: N = 5000 and 32000, M = 64/1024/8192) and
interpolated in log N; F.linear's time is then L = t - lsm. A served linear_rows arm's row pass
is s - L. The bound: t / (L + max(pass floor at --bw-tbs, --min-pass-us)): the GEMM stays
cuBLAS's and the row pass streams the logits once at copy speed (a launch gap after the GEMM
included in --min-pass-us). Points served by rowfix or torch get the same bound (it is the
linear_rows design's). Prints a markdown table and the geomeans (served, bound, and served with
each N's points lifted to the bound in turn: which points can move the geomean).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR_TBS = 4.3  # the probe's floor convention


def floor_us(m: int, n: int, tbs: float = FLOOR_TBS) -> float:
    return 4.0 * m * n / (tbs * 1e6)  # bf16: 2 bytes read + 2 written an element


def probe_rows(path: Path) -> list[dict]:
    with tarfile.open(path) as tar:
        member = next(x for x in tar.getmembers() if x.name.endswith("lsm_probe.json"))
        return json.load(io.TextIOWrapper(tar.extractfile(member)))["rows"]


def lsm_model(rows: list[dict]):
    """lsm(M, N) = a(N) + r(N) * floor: least squares per probed N, linear in log N between."""
    fits = {}
    for n in sorted({r["N"] for r in rows}):
        pts = [(floor_us(r["M"], n), r["lsm_us"]) for r in rows if r["N"] == n]
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        r_ = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        fits[n] = (my - r_ * mx, r_)
    ns = sorted(fits)

    def lsm(m: int, n: int) -> float:
        lo = max([x for x in ns if x <= n] or [ns[0]])
        hi = min([x for x in ns if x >= n] or [ns[-1]])
        f = 0.0 if lo == hi else (math.log(n) - math.log(lo)) / (math.log(hi) - math.log(lo))
        a = fits[lo][0] + f * (fits[hi][0] - fits[lo][0])
        r_ = fits[lo][1] + f * (fits[hi][1] - fits[lo][1])
        return a + r_ * floor_us(m, n)

    return lsm, fits


def served(regions, m):
    for hi, cid in regions:
        if hi is None or m <= hi:
            return cid
    return "torch"


def geo(vals):
    return math.exp(sum(map(math.log, vals)) / len(vals))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=str(ROOT / "src/tunedb/db/sm90/gemm_log_softmax.json"))
    ap.add_argument("--probe", default=str(ROOT / "bench/results/s13_B/logs.tgz"))
    ap.add_argument("--bw-tbs", type=float, default=3.9, help="the row pass's streaming rate at its floor")
    ap.add_argument("--min-pass-us", type=float, default=2.5, help="the least a row pass after the GEMM costs")
    args = ap.parse_args()
    lsm, fits = lsm_model(probe_rows(Path(args.probe)))
    table = json.loads(Path(args.table).read_text())
    pts = []
    for sig, entry in table["entries"].items():
        f = dict(kv.split("=") for kv in sig.split("|")[2:])
        for point, ev in entry["evidence"].items():
            pts.append((int(f["N"]), int(f["K"]), int(point[2:]), entry["regions"], ev))
    # F.linear at a probed N: t - lsm. At an N the probe did not see (16000), torch's
    # log_softmax may be another kernel (a 32 KB row fits shared memory, a 64 KB one does not),
    # so its linear is scaled from a probed N with the same K and M (work and output scale with N)
    lin_at = {(n, k, m): ev["torch"][0] * 1e3 - lsm(m, n) for n, k, m, _, ev in pts if n in fits}
    rows = []
    for n, k, m, regions, ev in pts:
        cid = served(regions, m)
        t, s = ev["torch"][0] * 1e3, ev[cid][0] * 1e3
        if (n, k, m) in lin_at:
            lin = lin_at[(n, k, m)]
        else:
            ref_n = min((nn for nn, kk, mm in lin_at if kk == k and mm == m), key=lambda nn: abs(nn - n))
            lin = lin_at[(ref_n, k, m)] * n / ref_n
        cur = s - lin if cid.startswith("lr_") else None
        best_pass = max(floor_us(m, n, args.bw_tbs), args.min_pass_us)
        rows.append(dict(N=n, K=k, M=m, served=cid, torch=t, s=s, x=t / s, linear=lin,
                         pass_us=cur, floor=floor_us(m, n), bound=t / (lin + best_pass)))
    rows.sort(key=lambda r: (r["N"], r["M"]))
    print("lsm model (us) a + r * floor per probed N: " + ", ".join(f"N={n}: a={a:.2f}, r={r:.2f}" for n, (a, r) in fits.items()))
    print("\n| N | K | M | served | torch us | served us | x | linear us (model) | row pass us | floor us | pass / floor | bound x |")
    print("|" + "---|" * 12)
    for r in rows:
        pf = "-" if r["pass_us"] is None else f"{r['pass_us']:.1f}"
        rat = "-" if r["pass_us"] is None else f"{r['pass_us'] / r['floor']:.2f}"
        print(f"| {r['N']} | {r['K']} | {r['M']} | {r['served']} | {r['torch']:.1f} | {r['s']:.1f} | {r['x']:.3f} "
              f"| {r['linear']:.1f} | {pf} | {r['floor']:.1f} | {rat} | {max(r['bound'], r['x']):.3f} |")
    xs = [r["x"] for r in rows]
    bs = [max(r["bound"], r["x"]) for r in rows]
    print(f"\ngeomean over {len(rows)} points: served {geo(xs):.3f}x, bound {geo(bs):.3f}x")
    for n in sorted({r["N"] for r in rows}):
        lifted = [max(r["bound"], r["x"]) if r["N"] == n else r["x"] for r in rows]
        print(f"  N={n} lifted to the bound alone: {geo(lifted):.3f}x")
    for label, sel in (("M <= 256", lambda r: r["M"] <= 256), ("M >= 1024", lambda r: r["M"] >= 1024)):
        lifted = [max(r["bound"], r["x"]) if sel(r) else r["x"] for r in rows]
        print(f"  {label} lifted to the bound alone: {geo(lifted):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
