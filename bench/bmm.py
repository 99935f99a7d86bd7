"""Batched products of the presets' attention (census bmm keys) on the GPU: torch.bmm against
every Triton config of the bmm family's space (the predicate's valid ones; --quick: a pruned
14-tile space), the untuned tile, the pick rule's choice over the sweep (what a build would
write) and the selector's served config (the shipped / user table, when one exists), in one run.

    PYTHONPATH=src python bench/bmm.py --out DIR [--quick] [--budget-s 90]

Keys: recorded from the presets' mirrors on meta tensors (no hub): whisper-base and
whisper-large-v3 at batch 1 (q @ k^T lay=nt, probs @ v lay=nn), Llama-3-8B prefill of 512
tokens (batch 1), and the Llama mirror's decode step. M: the census M and {1, 256}
(--quick) or {1, 16, 64, 128, 256, 512, 1024} (full). Timing: a CUDA graph of n calls (operands
hot in L2, as attention's are: produced just before), median of 7 replays / n; every arm first
checked against the fp32 reference (within 4x torch.bmm's error + 1e-3; failures are reported,
not timed). --budget-s caps the timing only (each point's share; configs past it are counted as
skipped); every valid config is compiled and checked. Expected: --quick about 2 min on the H200
with a cold Triton cache (compiles dominate: one binary per config and stride alignment),
under 1 min warm; full about 5 min. Prints a markdown table; writes DIR/bmm.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
import time

import torch

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.families.bmm import configs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from graph_timing import replay_ms  # noqa: E402

BMM = families.get("bmm")
SM90 = shipped_profile("sm90")
QUICK_MS, FULL_MS = (1, 256), (1, 16, 64, 128, 256, 512, 1024)
_timing = [0.0]  # seconds spent timing (the budget caps this; compiles and checks always run)


def census_keys() -> list[tuple[str, object, int]]:
    """(preset, signature, census M) of every bmm key of the presets, recorded on meta tensors."""
    from tunedb.census import presets
    from tunedb.census.recorder import Recorder

    out = []
    for name, make in (("whisper-base", lambda w: w.inputs(1, 3000)), ("whisper-large-v3", lambda w: w.inputs(1, 3000)),
                       ("llama-3-8b prefill 512", lambda w: w.inputs(1, 512)),
                       ("llama-3-8b decode", lambda w: w.decode_inputs(1))):
        preset = name.split()[0]
        built = presets.workload(preset).build(torch.device("meta"), "mirror")
        with torch.no_grad(), Recorder(families=("bmm",)) as rec:
            built.model(*make(built))
        for (sig, m) in sorted(rec.calls, key=lambda c: c[0].format()):
            out.append((name, sig, m))
    return out


def graph_us(fn, n_min=8) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(n_min, min(200, int(2e-3 / max(time.perf_counter() - t0, 1e-6))))
    return replay_ms(lambda _i: fn(), n) * 1000.0


def rel_err(y, ref) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def served(sig, m) -> str | None:
    from tunedb.runtime import selector

    res = selector.peek("bmm", sig.with_dt("bf16"), m)
    return None if res.tier == "default" else res.config.id


def run_point(preset, sig, m, space, budget, rows):
    (a, b), _ = BMM.make_inputs(sig, m, "cuda", seed=m)
    ref = BMM.reference(sig, a, b)
    out = torch.empty((sig.get("B"), m, sig.get("N")), dtype=a.dtype, device="cuda")
    torch_err = None
    times: dict[str, float] = {}
    failed: dict[str, str] = {}
    ids = ["torch", configs.UNTUNED.id] + [c.id for c in space if c.id != configs.UNTUNED.id]
    pick_served = served(sig, m)
    if pick_served and pick_served not in ids:
        ids.append(pick_served)
    for cid in ids:
        cfg = configs.parse(cid)
        why = configs.invalid_reason(cfg, sig, m, SM90)
        if why:
            failed[cid] = f"invalid: {why}"
            continue
        fn = BMM.launcher(cfg, sig)
        out.fill_(float("nan"))
        try:
            fn(a, b, out)
        except Exception as exc:  # a config that does not compile is a result, not a crash
            failed[cid] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        err = rel_err(out, ref)
        if cid == "torch":
            torch_err = err
        elif not err <= 4 * torch_err + 1e-3:
            failed[cid] = f"error {err:.3g} > 4 x torch.bmm's {torch_err:.3g}"
            continue
        if cid not in ("torch", configs.UNTUNED.id, pick_served) and _timing[0] > budget:
            failed[cid] = "budget"
            continue
        t = time.monotonic()
        times[cid] = graph_us(lambda: fn(a, b, out))
        _timing[0] += time.monotonic() - t
    triton = {c: t for c, t in times.items() if c != "torch"}
    best = min(triton, key=triton.get) if triton else None
    pick = BMM.pick_rule().pick(times).winner
    oracle = min(times.values())
    row = {"preset": preset, "signature": sig.format(), "M": m, "torch_us": times.get("torch"),
           "untuned_us": times.get(configs.UNTUNED.id), "best_triton": best,
           "best_triton_us": triton.get(best) if best else None, "pick": pick, "pick_us": times[pick],
           "pick_regret": times[pick] / oracle - 1.0, "served": pick_served,
           "served_us": times.get(pick_served) if pick_served else None, "torch_err": torch_err,
           "times": times, "failed": {k: v for k, v in failed.items() if v != "budget"},
           "skipped_for_budget": sum(v == "budget" for v in failed.values()),
           "flops": BMM.work(sig, m)[0]}
    rows.append(row)


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def markdown(rows) -> str:
    lines = ["| preset | key | M | torch.bmm us | untuned us | best Triton (config) us | pick | pick us | pick/torch | served |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |"]
    for r in rows:
        key = r["signature"].split("|", 3)[3].replace("|", " ")
        best = f"{r['best_triton']} {r['best_triton_us']:.2f}" if r["best_triton"] else "-"
        untuned = f"{r['untuned_us']:.2f}" if r["untuned_us"] else "-"
        lines.append(f"| {r['preset']} | {key} | {r['M']} | {r['torch_us']:.2f} | {untuned} | {best} | {r['pick']} | "
                     f"{r['pick_us']:.2f} | {r['torch_us'] / r['pick_us']:.2f}x | {r['served'] or '-'} |")
    return "\n".join(lines)


def summarize(rows) -> dict:
    return {
        "points": len(rows),
        "geomean_best_triton_over_torch": geomean(r["torch_us"] / r["best_triton_us"] for r in rows if r["best_triton_us"]),
        "geomean_pick_over_torch": geomean(r["torch_us"] / r["pick_us"] for r in rows),
        "geomean_pick_over_untuned": geomean(r["untuned_us"] / r["pick_us"] for r in rows if r["untuned_us"]),
        "points_where_triton_wins_the_pick": sum(r["pick"] != "torch" for r in rows),
        "max_pick_regret": max((r["pick_regret"] for r in rows), default=None),
        "failed_arms": sum(len(r["failed"]) for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for bmm.json")
    ap.add_argument("--quick", action="store_true", help="the pruned 14-tile space, M in {1, 256} + census M")
    ap.add_argument("--budget-s", type=float, default=90.0, help="cap on the sweep's wall time (torch, the "
                    "untuned and the served arms always run)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    keys = census_keys()
    space = configs.quick_grid() if args.quick else configs.config_space("sm90")
    extra = QUICK_MS if args.quick else FULL_MS
    points = [(p, s, m) for p, s, cm in keys for m in sorted(set(extra) | {cm})]
    print(f"[{time.monotonic() - t0:6.1f}s] {len(keys)} census keys, {len(points)} points, {len(space)} configs",
          file=sys.stderr, flush=True)
    rows: list[dict] = []
    for i, (preset, sig, m) in enumerate(points):
        run_point(preset, sig, m, space, args.budget_s * (i + 1) / len(points), rows)
        print(f"[{time.monotonic() - t0:6.1f}s] {preset} {sig.format()} M={m}", file=sys.stderr, flush=True)
    summary = summarize(rows)
    print(markdown(rows))
    print("\n" + json.dumps(summary, indent=1))
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "command": " ".join(sys.argv), "impl_hash": BMM.impl_hash()}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bmm.json"), "w") as fh:
        json.dump({"env": env, "summary": summary, "rows": rows}, fh, indent=1)
    print(f"\n{env}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
