"""The census files the shipped quantized tables are built from: bench/quant_llama.py's model
(Llama-3-8B widths, 2 layers) quantized online with torchao per scheme, probed at exactly the
sizes the end-to-end bench serves: decode batch 1 and 16 (M = 1, 16) and a 2048-token prefill
(M = 2048; the LM head sees the last position only, M = 1). On meta tensors: no GPU, seconds.

    PYTHONPATH=src:. python bench/scaled_mm_census.py [--out-dir bench/census]

writes quant_llama_<scheme>.json for fp8-rowwise, fp8-block and int8 (needs torchao).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path


def census(scheme: str) -> object:
    from tunedb.census.modes import Key
    from tunedb.census.presets import Built
    from tunedb.census.probe import probe
    from tunedb.families.scaled_mm.torchao_bridge import quantize_model
    from tunedb.records import Point, ShapeSet

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.quant_llama import make

    model, inputs, decode = make("meta")
    quantize_model(model, scheme, "meta")
    built = Built(model, inputs, decode, "mirror")
    keys = {Key(1, 0, True): 1, Key(16, 0, True): 1, Key(1, 2048, True): 1}
    calls: Counter = Counter()
    for key, n in keys.items():
        for point, c in probe(built, key, quantized=True).items():
            calls[point] += n * c
    total = sum(calls.values())
    points = tuple(Point(s, m, weight=c / total, calls=c, must_tune=True, eager_share=0.0)
                   for (s, m), c in sorted(calls.items()))
    meta = (("mode", "decode 1/16 + prefill 2048"), ("impl", "mirror"), ("device", "meta"),
            ("quantization", scheme), ("workload", "bench.quant_llama:make"))
    return ShapeSet(points, "quant_llama", meta)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "census"))
    args = ap.parse_args()
    from tunedb.census import write_census

    for scheme in ("fp8-rowwise", "fp8-block", "int8"):
        c = census(scheme)
        path = Path(args.out_dir) / f"quant_llama_{scheme}.json"
        write_census(path, c)
        quant = [p for p in c.points if p.signature.family.startswith("scaled_mm")]
        print(f"{path}: {len(quant)} quantized points over {len({p.signature for p in quant})} signatures "
              f"(M {sorted({p.m for p in quant})})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
