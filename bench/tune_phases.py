"""Where a model's tune spends its wall time, with the probes batched (protocol.PROBE_BATCH) and
one config per probe request, side by side on the same census in one run.

    PYTHONPATH=src python bench/tune_phases.py --model whisper-large-v3 --batches 8 [--repeats 2]

The census is e2e.py's (every tuned-op call of one forward per batch, tunedb.optimize'd model);
each variant builds it into its own directory with e2e.py's build options (thin, 3 points per
signature, top 8), the variants alternating per repeat (batched first), so a warming file cache
favours the one-per-request variant. Prints each build's phases (protocol.PHASES), its wall and
whether the two tiers' regions agree (the probes only decide which arms are measured, so a
changed region is the protocol's noise, not the batching).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_models  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="whisper-large-v3", choices=sorted(e2e_models.SPECS))
    p.add_argument("--batches", type=int, nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-points", type=int, default=3)
    p.add_argument("--top-k", type=int, default=8)
    args = p.parse_args(argv)

    import torch

    import tunedb
    from tunedb import pipeline, settings
    from tunedb.bench import protocol

    if not torch.cuda.is_available():
        print("tune_phases.py needs a CUDA GPU", file=sys.stderr)
        return 2
    bm = e2e_models.build(args.model, "cuda", batches=tuple(args.batches) if args.batches else None)
    shapes = e2e_models.tuned_points(bm, tunedb.optimize(bm.module, inplace=False))
    variants = {"batched": protocol.PROBE_BATCH, "one per request": 1}
    rows: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for label, size in variants.items():
            protocol.PROBE_BATCH = size
            with tempfile.TemporaryDirectory() as out, settings.override(USER_DB=out):
                opts = pipeline.BuildOptions(out=out, thin=True, max_points=args.max_points, top_k=args.top_k)
                t0 = time.perf_counter()
                res = pipeline.build([(bm.name, shapes)], opts)
                wall = time.perf_counter() - t0
                entries = json.loads(Path(res.path).read_text())["entries"]
                winners = {sig: e["regions"] for sig, e in entries.items()}
            rows[label].append({"wall": wall, "arms": res.arms_measured, **res.phase_seconds,
                                "winners": winners})
    print(f"{bm.name} batches {bm.batches}: {len(shapes.points)} points, probes of {variants['batched']} "
          f"configs per request vs 1; medians over {args.repeats} repeat(s), seconds")
    keys = [k for k in ("wall", *protocol.PHASES) if any(k in r for rs in rows.values() for r in rs)]
    print(f"  {'variant':18s} " + " ".join(f"{k:>15s}" for k in keys) + f" {'arms':>6s}")
    for label, rs in rows.items():
        cells = [statistics.median(r.get(k, 0.0) for r in rs) for k in keys]
        print(f"  {label:18s} " + " ".join(f"{c:15.2f}" for c in cells) + f" {rs[0]['arms']:6d}")
    a, b = (statistics.median(r["wall"] for r in rows[k]) for k in variants)
    print(f"batched / one per request: wall {a / b:.3f}x")
    same = rows["batched"][0]["winners"] == rows["one per request"][0]["winners"]
    print(f"regions (config per M range) identical in the first repeat: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
