"""Where an eager forward's host time goes: plain model against tunedb.optimize(model), profiled.

    PYTHONPATH=src python bench/profile_eager.py --model llama-3-8b --batch 1 [--iters 200] [--device cuda]
        [--pin tma_b128x256x64_w8_s3_g8]

A host-bound eager forward (decode, small batches) costs what the host spends issuing it. This
prints the wall time per forward of both (synchronised at the ends of each loop, best of 3), the
difference per tuned-op call, and cProfile's top functions by own time for the tuned model, so a
regression in the tuned ops' host path shows by name. The models are bench/e2e_models.py's.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_models  # noqa: E402
from host_overhead import per_call_us  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b", choices=sorted(e2e_models.SPECS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--compile", action="store_true",
                   help="compile both models (torch.compile default mode): compiled plain against "
                        "compiled tunedb.optimize(model), so the compiler's own fusions cancel")
    p.add_argument("--pin", default=None,
                   help="serve every tuned shape with this config (a resolver override), e.g. a TMA tile")
    args = p.parse_args(argv)

    import torch

    from tunedb.runtime import launch_table

    try:
        bm, plain_model, tuned, pin = e2e_models.plain_and_tuned(args.model, args.device, args.batch,
                                                                 args.pin, args.compile)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    plain_fn, tuned_fn = bm.call(plain_model, args.batch), bm.call(tuned, args.batch)
    with torch.no_grad():
        for fn in (plain_fn, tuned_fn):  # warm-up, and the compile with --compile: before the
            for _ in range(10):  # recording, which would keep every tuned op opaque in the graph
                fn()
        with launch_table.recording() as seen:
            tuned_fn()
        calls = len(seen)  # tuned-op calls per forward (under --compile: those left in the graph)
        plain = per_call_us(plain_fn, args.iters, 3, sync) / 1e3  # ms per forward, best of 3 loops
        fast = per_call_us(tuned_fn, args.iters, 3, sync) / 1e3
        served = {b.config.id for _k, b in launch_table.entries()}
        print(f"{args.model} b{args.batch} on {args.device}{' (both compiled)' if args.compile else ''}: "
              f"plain {plain:.3f} ms, tunedb {fast:.3f} ms per "
              f"forward ({plain / fast:.3f}x); {calls} tuned-op calls per forward"
              + (f", {(fast - plain) * 1e3 / calls:+.2f} us per call" if calls else " (all compiled inline)")
              + f"; configs served: {sorted(served)}")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            tuned_fn()
        sync()
        prof.disable()
    pin.close()
    if args.compile:
        from torch._dynamo.utils import counters

        print(f"dynamo: {dict(counters['stats'])}; graph breaks: {dict(counters['graph_break'])}")
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
