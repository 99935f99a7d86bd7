"""Random shapes against the vendor op, every GEMM-like family, in one run: what the default path
(shipped tables, user tier off) serves at sizes and keys nobody chose, timed beside the op a user
would call instead.

    PYTHONPATH=src python bench/unseen_sweep.py --out DIR [--seed 0] [--quick] [--dry-run]

bench/unseen_shapes.py times a fixed list of shapes a rule change moved; this one draws them
(seeded): every shipped key of gemm, bmm, gemm_log_softmax, scaled_mm (int8, fp8) and group_gemm
at M drawn log-uniformly from 1 to 8192 (the measured-support rule's ground: sizes between and
beyond the measured ones), plus keys no table names for the families whose untuned choice is not
the vendor op (group_gemm's untuned tile up to 512 tokens, int8's heuristic tile). Families whose
unmeasured keys serve the vendor op by rule (gemm, bmm, gemm_log_softmax, fp8 row/tensor scales,
conv) have nothing to time there. linalg is timed by bench/linalg_eager.py --unseen (its arms run
through its own entry points).

Per point: the served config (selector.peek) and the vendor arm (`torch`: cuBLAS, _grouped_mm,
_int_mm + epilogue, _scaled_mm), both through the build's protocol (measure.protocol.measure_point:
CUDA graphs, each arm checked against the reference first, interleaved rounds), with the weights
cold as in a model (a 1 GiB working set; --warm: each call alone, a weight under L2 cached; session
30's first two runs were warm, and a split-K tile built cold lost 6-10% to cuBLAS there). `served/vendor` > 1 is a point where the default path is slower than the
vendor op; the summary counts them over 1.03 (the protocol's noise at these sizes). Points where
the vendor op serves, or cannot run (int8 at M <= 16, block-scaled fp8), are listed, not timed. Expected: full about 4-6 min on the H200 with a cold Triton cache, --quick about 2.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
from pathlib import Path

from tunedb import settings

# A model's weights pass the 60 MiB L2, so its GEMMs read their weights cold: the tables are built
# so (the build's working_set_bytes is the model's parameter bytes) and timed so here. --warm times
# each call alone, where a weight under L2 stays cached between calls.
MODEL_WORKING_SET = 1 << 30
FAMILIES = ("gemm", "bmm", "gemm_log_softmax", "scaled_mm", "scaled_mm_fp8", "group_gemm")


def _log_m(rng: random.Random, lo: int = 1, hi: int = 8192) -> int:
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def _fresh_keys(rng: random.Random, quick: bool) -> list[tuple[str, object, int]]:
    """(family, signature, M) at keys no shipped table names, for the families whose untuned
    choice is a Triton tile rather than the vendor op."""
    from tunedb.families.group_gemm.keys import make_signature as moe
    from tunedb.families.scaled_mm.keys import make_signature as smm

    out = []
    for _ in range(3 if quick else 6):
        e = rng.choice((8, 16, 32, 60, 64, 128))
        n, k = rng.choice((512, 768, 1024, 1408, 1536, 2048, 2816, 4096)), rng.choice((768, 1024, 2048, 3584, 4096))
        sig = moe(e, n, k, rng.choice((1, 2, 4, 6, 8)), "bf16", "token")
        out += [("group_gemm", sig, _log_m(rng, 1, 512)) for _ in range(2)]
    for _ in range(2 if quick else 4):
        n, k = rng.choice((1536, 2560, 3072, 5120, 6144, 11008)), rng.choice((1024, 2048, 2560, 5120))
        sig = smm("scaled_mm", "scaled_mm", n, k, "bf16")
        out += [("scaled_mm", sig, _log_m(rng, 17, 8192)) for _ in range(2)]
    return out


def points(seed: int, quick: bool) -> list[tuple[str, object, int, str]]:
    """(family, signature, M, where) over the shipped keys (random M) and fresh keys."""
    from tunedb import database
    from tunedb.runtime import selector

    rng = random.Random(seed)
    arch_family, _profile = selector.current_arch()
    out = []
    for fam in FAMILIES:
        keys = sorted({k for res in database.lookup(arch_family, fam) for k in res.db.entries}, key=str)
        if quick:
            keys = rng.sample(keys, min(len(keys), 4))
        for key in keys:
            sig = _signature(key)
            if sig is None:
                continue
            for _ in range(1 if quick else 2):
                out.append((fam, sig, _log_m(rng), "shipped key"))
    out += [(f, s, m, "fresh key") for f, s, m in _fresh_keys(rng, quick)]
    return out


def _signature(key):
    from tunedb.records import Signature

    if isinstance(key, Signature):
        return key
    try:
        return Signature.parse(str(key))
    except Exception:
        return None


def arms(family: str, sig, m: int) -> tuple[str, str | None]:
    """(served config id, vendor arm id or None where the vendor op cannot run at this point)."""
    from tunedb.runtime import selector

    from tunedb import families

    served = selector.peek(family, sig, m).config.id
    if served == "heuristic":  # the concrete arm its rule names at M (fp8 row scales: the vendor op)
        served = families.get(family).heuristic(sig, m, selector.current_arch()[1]).id
    vendor = "torch"
    if family in ("scaled_mm", "scaled_mm_fp8"):
        from tunedb.families.scaled_mm import configs

        if configs.torch_reason(sig, m) is not None:
            vendor = None
    return served, vendor


def run(pts: list, protocol, working_set: int | None) -> list[dict]:
    from rich.progress import track

    rows = []
    for family, sig, m, where in track(pts, description="points", transient=True):
        served, vendor = arms(family, sig, m)
        ids = list(dict.fromkeys([served] + ([vendor] if vendor else [])))
        row = {"family": family, "signature": sig.format(), "m": m, "where": where, "served": served,
               "vendor": vendor}
        if vendor is None or ids == [vendor]:  # the vendor op serves, or none runs: nothing to compare
            rows.append(row)
            continue
        try:
            got = {r.config_id: r for r in protocol.measure_point(family, sig, m, ids, keep=ids,
                                                                    working_set_bytes=working_set)}
        except Exception as e:  # a point the protocol cannot set up is reported, not fatal
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
            continue

        def ms(cid):
            r = got.get(cid)
            return r.median_ms if r is not None and r.status.ok else None

        row["served_ms"], row["vendor_ms"] = ms(served), (ms(vendor) if vendor else None)
        if row["served_ms"] and row["vendor_ms"]:
            row["ratio"] = row["served_ms"] / row["vendor_ms"]
        row["failed"] = {c: f"{r.status.value}: {r.detail}" for c, r in got.items() if not r.status.ok}
        rows.append(row)
    return rows


def report(rows: list[dict], out: Path, seed: int) -> None:
    print("| family | key | M | where | served | ms | vendor ms | served/vendor |")
    print("|---|---|---|---|---|---|---|---|")
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    for r in rows:
        ratio = r.get("ratio")
        mark = " **" if ratio is not None and ratio > 1.03 else ""
        print(f"| {r['family']} | {r['signature'].split('|', 1)[1]} | {r['m']} | {r['where']} | {r['served']} | "
              f"{f(r.get('served_ms'))} | {f(r.get('vendor_ms'))} | "
              f"{'-' if ratio is None else f'{ratio:.3f}'}{mark}{' ' + r['error'] if 'error' in r else ''} |")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    summary = {"seed": seed, "points": len(rows), "timed_pairs": len(ratios),
               "vendor_served": sum(r["served"] == r["vendor"] for r in rows),
               "geomean_served_over_vendor": statistics.geometric_mean(ratios) if ratios else None,
               "worst": max(ratios) if ratios else None, "over_1.03": sum(x > 1.03 for x in ratios),
               "errors": sum("error" in r for r in rows)}
    print(f"\n{summary}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "unseen_sweep.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str))
    print(f"wrote {out / 'unseen_sweep.json'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for unseen_sweep.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="about a third of the points")
    ap.add_argument("--warm", action="store_true",
                    help="each call alone (weights under L2 stay cached) instead of a model's regime")
    ap.add_argument("--dry-run", action="store_true", help="the points and their arms, nothing timed (no GPU)")
    args = ap.parse_args(argv)
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"):  # the shipped tables alone
        if args.dry_run:
            selector.configure("sm90")
            for family, sig, m, where in points(args.seed, args.quick):
                print(family, sig.format(), f"M={m}", where, "served/vendor:", *arms(family, sig, m))
            return 0
        from tunedb.measure import protocol

        selector.configure()
        rows = run(points(args.seed, args.quick), protocol, None if args.warm else MODEL_WORKING_SET)
    report(rows, Path(args.out), args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
