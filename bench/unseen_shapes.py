"""Shapes no build measured, on the GPU: the arm the shipped tables served there before the
measured-support rule (a region's config far from its evidence, or a family's untuned tile for an
unmeasured key) against the arm served now (the pick rule's fallback: the vendor op, or
scaled_mm's heuristic) and the fallback itself, side by side in one run.

    PYTHONPATH=src python bench/unseen_shapes.py --out DIR [--quick]

"before" is the raw region lookup of the system tier's entry (runtime/serving.walk before
serving.unsupported), or the family default for a key no entry names; "now" is what the
selector serves (selector.peek, user tier off). Each arm is timed by the build's protocol
(measure.protocol.measure_point: the CUDA-graph timer, every arm checked against the reference
first, rounds until the medians settle; no arm dropped early). A row reads now / before < 1 where
the change made that shape faster. Expected: --quick (6 points) about 1 min on the H200 with a cold
Triton cache, full (13 points) about 2 min; --dry-run lists the arms without a GPU. Prints a markdown table; writes DIR/unseen_shapes.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunedb import families, settings


def points(quick: bool) -> list[tuple[str, str, object, int]]:
    """(family, what, signature, M): the shapes the measured-support rule or the default tier
    now serves differently. linalg is not here: its batches past the grid keep the edge's winner
    (its `extrapolates` hook), and its arms are timed by its own ladder (bench/linalg_ladder.py;
    the generic protocol cannot feed its ring-policy solvers)."""
    from tunedb.families.bmm.keys import make_signature as bmm
    from tunedb.families.gemm.signatures import make_signature as gemm
    from tunedb.families.group_gemm.keys import make_signature as moe
    from tunedb.families.scaled_mm.keys import make_signature as smm

    q_kt = bmm(20, 1500, 64, "half", "nt")
    silu = gemm("gemm_act", "half", 2048, 512, "silu", True)
    int8 = smm("scaled_mm", "scaled_mm", 4096, 4096, "bf16")
    qwen3 = moe(128, 1536, 2048, 8, "bf16", "token")
    mixtral = moe(8, 14336, 4096, 2, "bf16", "token")
    out = [("bmm", "whisper-large decoder q@k^T, 1 token", q_kt, 1),
           ("scaled_mm", "int8 4096x4096 between decode and prefill", int8, 100),
           ("group_gemm", "Mixtral experts (no entry)", mixtral, 16),
           ("group_gemm", "Qwen3 experts between 256 and 1024", qwen3, 300),
           ("group_gemm", "Mixtral experts (no entry)", mixtral, 4096),
           ("gemm", "fused silu 2048x512 at M=1 (measured from 3)", silu, 1)]
    if not quick:
        out += [("bmm", "whisper-large decoder q@k^T, 64 tokens", q_kt, 64),
                ("bmm", "whisper-large decoder q@k^T, 448 tokens", q_kt, 448),
                ("scaled_mm", "int8 4096x4096 M=17", int8, 17),
                ("scaled_mm", "int8 4096x4096 M=512", int8, 512),
                ("group_gemm", "Mixtral experts (no entry)", mixtral, 1),
                ("group_gemm", "Mixtral experts (no entry)", mixtral, 512),
                ("group_gemm", "Mixtral experts (no entry)", mixtral, 1024)]
    return out


def before_and_now(family: str, sig, m: int) -> tuple[str, str, str]:
    """(the arm served before the rule, the arm served now, the pick rule's fallback)."""
    from tunedb import database
    from tunedb.families.contract import hook
    from tunedb.runtime import selector, serving

    fam = families.get(family)
    arch_family, profile = selector.current_arch()
    before = None
    for res in database.lookup(arch_family, family):
        for key in serving.serving_keys(fam, sig):
            entry = res.db.entries.get(key)
            before = before or (entry.lookup(m) if entry is not None else None)
    if before is None:  # what the default tier served: the family default
        before = fam.default_config(sig, profile).id
    now = selector.peek(family, sig, m).config.id
    return before, now, hook(fam, "pick_rule")().fallback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for unseen_shapes.json")
    ap.add_argument("--quick", action="store_true", help="6 points instead of 13")
    ap.add_argument("--dry-run", action="store_true", help="the arms per point, nothing timed (no GPU)")
    args = ap.parse_args(argv)
    from tunedb.measure import protocol
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"):  # the shipped tables alone
        selector.configure()
        if args.dry_run:
            selector.configure("sm90")
            for family, what, sig, m in points(args.quick):
                print(family, what, f"M={m}", "before/now/fallback:", *before_and_now(family, sig, m))
            return 0
        rows = run(args.quick, protocol)
    report(rows, Path(args.out))
    return 0


def run(quick: bool, protocol) -> list[dict]:
    rows = []
    for family, what, sig, m in points(quick):
        before, now, fallback = before_and_now(family, sig, m)
        arms = list(dict.fromkeys([before, now, fallback]))
        got = {r.config_id: r for r in protocol.measure_point(family, sig, m, arms, keep=arms)}

        def ms(cid):
            r = got.get(cid)
            return r.median_ms if r is not None and r.status.ok else None

        b, n = ms(before), ms(now)
        rows.append({"family": family, "what": what, "signature": sig.format(), "m": m,
                     "before": before, "before_ms": b, "now": now, "now_ms": n,
                     "fallback": fallback, "fallback_ms": ms(fallback),
                     "now_over_before": (n / b) if (b and n) else None,
                     "failed": {c: f"{r.status.value}: {r.detail}" for c, r in got.items() if not r.status.ok}})
    return rows


def report(rows: list[dict], out: Path) -> None:
    print("| family | shape | M | before | ms | now | ms | now/before |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda x: "fail" if x is None else f"{x:.4f}"  # noqa: E731
        ratio = "-" if r["now_over_before"] is None else f"{r['now_over_before']:.2f}"
        print(f"| {r['family']} | {r['what']} | {r['m']} | {r['before']} | {f(r['before_ms'])} | "
              f"{r['now']} | {f(r['now_ms'])} | {ratio} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "unseen_shapes.json").write_text(json.dumps({"rows": rows}, indent=1, default=str))
    print(f"wrote {out / 'unseen_shapes.json'}")


if __name__ == "__main__":
    raise SystemExit(main())
