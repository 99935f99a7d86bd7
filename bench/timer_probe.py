"""What the CUDA-graph timer reads at a few small GEMM points, arm by arm: its baselines (the
replay's fixed overhead, the separator's cost in context and alone), each arm's raw samples, its
overlap ratio, and the per-call median it reports. Written for session 41, where on an H100 every
arm of prewarm's two points (bf16, M=96, 512x256 and 256x512) came back with median 0.0 ms.

    PYTHONPATH=src python bench/timer_probe.py [--points 96:512:256,96:256:512,96:4096:4096] [--out JSON]

Each point is measured as prewarm measures it (the autotuner's candidates, working set of the
two Linears' bytes: warm weights) and once more with --working-set 1G (cold weights).
Expected: about 20-40 s on an H100 or H200 (the Triton compiles dominate).
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="96:512:256,96:256:512,96:4096:4096")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import torch

    from tunedb.families.gemm import FAMILY
    from tunedb.measure import protocol
    from tunedb.records import Signature
    from tunedb.runtime.autotuner import Autotuner

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    tuner = Autotuner(None, publish=False)
    for spec in args.points.split(","):
        m, n, k = (int(v) for v in spec.split(":"))
        sig = Signature.parse(f"gemm|op=gemm_act|dt=bf16|N={n}|K={k}|act=none|bias=1")
        ids = tuner.candidates(FAMILY, sig, m)[:6]
        for ws in (2 * n * k * 2, 1 << 30):
            t0 = time.monotonic()
            res = protocol.measure_point(FAMILY, sig, m, list(ids), alpha=0.0, allow_busy=True,
                                         working_set_bytes=ws)
            print(f"\n{sig} M={m} working set {ws} B ({time.monotonic() - t0:.1f} s)")
            for r in res:
                env = dict(r.env)
                keep = {k2: env[k2] for k2 in ("separator_us", "separator_alone_us", "replay_overhead_us",
                                               "overlap_ratio", "self_overlap", "calls_per_graph", "inputs", "tiny_replays_us")
                        if k2 in env}
                samples = [round(s * 1000, 3) for s in r.samples[:8]]
                print(f"  {r.config_id:<28} {r.status.value:<8} median_us={None if r.median_ms is None else round(r.median_ms * 1000, 3)}"
                      f" samples_us={samples} {keep}")
                rows.append({"sig": sig.format(), "M": m, "working_set": ws, "config": r.config_id,
                             "status": r.status.value, "median_ms": r.median_ms, "samples": list(r.samples),
                             "env": {k2: str(v) for k2, v in env.items()}})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
