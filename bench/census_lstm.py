"""The rnn census of transducer prediction networks and LSTM layers, taken on meta tensors with
the family's module-level recorder (families/rnn/census.py): nn.LSTM with input = hidden in
{320, 512, 1024}, 1 layer, batch-first, batch in {1, 8, 64}, 100 steps, bf16 and fp32.

    PYTHONPATH=src python bench/census_lstm.py --out bench/census/lstm_100steps.json

Runs on the CPU in about 30 s (meta tensors: the native path decomposes every step). The file feeds `tunedb build --family rnn`.
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch

from tunedb.census.censusfile import write_census
from tunedb.families.rnn.census import record
from tunedb.records import Point, ShapeSet


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    calls: Counter = Counter()
    for dt in (torch.bfloat16, torch.float32):
        for h in (320, 512, 1024):
            lstm = torch.nn.LSTM(h, h, batch_first=True).to(device="meta", dtype=dt)
            for b in (1, 8, 64):
                x = torch.empty(b, 100, h, device="meta", dtype=dt)
                calls.update(record(lambda: lstm(x)))
    total = sum(calls.values())
    census = ShapeSet(tuple(Point(sig, t, weight=c / total, calls=c, must_tune=True)
                            for (sig, t), c in sorted(calls.items())), workload="lstm_100steps")
    write_census(args.out, census)
    print(f"{len(calls)} points -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
