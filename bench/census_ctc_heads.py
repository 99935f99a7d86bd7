"""The gemm_log_softmax census of CTC / transducer output heads, taken on meta tensors with the
family's function-level recorder (families/gemm_log_softmax/census.py): a Conformer-style CTC
head (d=256, 5000-token vocabulary), a d=512 head over 16000 tokens and a d=512 head over a
32000-token vocabulary, at batch x frames giving M from 64 to 8192, bf16.

    PYTHONPATH=src python bench/census_ctc_heads.py --out bench/census/ctc_heads.json

Runs on the CPU in a second. The file feeds `tunedb build --family gemm_log_softmax`.
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch

from tunedb.census.censusfile import write_census
from tunedb.families.gemm_log_softmax.census import record, to_shapeset

HEADS = ((256, 5000), (512, 16000), (512, 32000))
BATCH_FRAMES = ((1, 64), (4, 64), (4, 256), (16, 256), (16, 512), (32, 256))  # M = 64 .. 8192


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    calls: Counter = Counter()
    for d, vocab in HEADS:
        head = torch.nn.Sequential(torch.nn.Linear(d, vocab), torch.nn.LogSoftmax(dim=-1))
        head = head.to(device="meta", dtype=torch.bfloat16)
        for b, t in BATCH_FRAMES:
            x = torch.empty(b, t, d, device="meta", dtype=torch.bfloat16)
            calls.update(record(lambda: head(x)))
    write_census(args.out, to_shapeset(calls, workload="ctc_heads"))
    print(f"{len(calls)} points, {len({s for s, _ in calls})} signatures -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
