"""Decode on one GPU's shard of a tensor-parallel Llama-3-8B (bench/tp_shard_model.py): plain
against tunedb.optimize() with the sibling K split on (TUNEDB_SIBLING_SPLIT=auto, the default) and
off ('1'), in one run, in CUDA graphs and eagerly.

    PYTHONPATH=src:bench python bench/tp_shard_decode.py [--tp 8] [--layers 4] [--out JSON]

A shard's q/k/v (512 + 128 + 128 rows at tp = 8) and gate/up (2 x 1792) are sibling groups of few
weight slabs, the case the split rule serves (kernels_siblings.split_for). Decode steps of one token
at batches 1 and 16 (no KV cache); per round, the wall time of a block of forwards (graph replays or
eager calls) back to back, synchronised at its ends; ratios are medians of per-round ratios, and
"A/A" a deep copy of plain timed in the same rounds. Outputs checked against plain's first
(relative Frobenius error). Expected: about 40 s.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch
from e2e_timing import graph_of, paired_rounds, rel_err
from unseen_model import _block_ms
from tp_shard_model import WIDTH, build


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--parts", action="store_true",
                    help="also tunedb with siblings off, and with its served layers running F.linear (same rounds)")
    a = ap.parse_args(argv)
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"):
        selector.reload()
        plain = build(a.layers, a.tp)
        variants = {"plain": plain, "plain copy": copy.deepcopy(plain)}
        with settings.override(SIBLING_SPLIT="auto"):
            variants["tunedb split"] = tunedb.optimize(copy.deepcopy(plain))
        with settings.override(SIBLING_SPLIT="1"):
            variants["tunedb no split"] = tunedb.optimize(copy.deepcopy(plain))
        if a.parts:  # where the eager excess comes from: the sibling members, or the served layers' launches
            with settings.override(SIBLINGS="0"):
                variants["tunedb siblings off"] = tunedb.optimize(copy.deepcopy(plain))
            served_plain = tunedb.optimize(copy.deepcopy(plain))
            for m in served_plain.modules():
                if type(m).__name__ == "TunedLinear" and "_as_written" not in m.__dict__:
                    m.__dict__["_as_written"] = True  # F.linear for every call its group does not take
            variants["tunedb served as F.linear"] = served_plain
        rows = []
        for batch in (1, 16):
            x = torch.randn(batch, 1, WIDTH, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                ref = plain(x)
                errs = {k: rel_err(m(x), ref) for k, m in variants.items()}
                eager = {k: (lambda m=m: m(x)) for k, m in variants.items()}
                graphs = {k: graph_of(f, warmup=3) for k, f in eager.items()}
                steps = {f"{k} {mode}": (f if mode == "eager" else graphs[k].replay)
                         for mode in ("eager", "graph") for k, f in eager.items()}
                per = paired_rounds(steps, a.rounds, lambda step: _block_ms(step, a.per_round), seed=batch, warmup=1)
            row = {"batch": batch, "rel_err": errs, "ms": {k: statistics.median(v) for k, v in per.items()}}
            for mode in ("eager", "graph"):
                for k in variants:
                    if k != "plain":
                        row[f"{k} {mode} / plain"] = statistics.median(
                            t / p for t, p in zip(per[f"{k} {mode}"], per[f"plain {mode}"]))
            rows.append(row)
        report = tunedb.tuning_report()
    print(f"Llama-3-8B shard at tp={a.tp}: {a.layers} layers, bf16; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| batch | mode | plain ms | tunedb split ms | tunedb no split ms | split / plain | no split / plain | A/A | err split |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for mode in ("graph", "eager"):
            ms = r["ms"]
            print(f"| {r['batch']} | {mode} | {ms[f'plain {mode}']:.4f} | {ms[f'tunedb split {mode}']:.4f} | "
                  f"{ms[f'tunedb no split {mode}']:.4f} | {r[f'tunedb split {mode} / plain']:.3f} | "
                  f"{r[f'tunedb no split {mode} / plain']:.3f} | {r[f'plain copy {mode} / plain']:.3f} | "
                  f"{r['rel_err']['tunedb split']:.1e} |")
    if a.parts:
        print("\n| batch | mode | siblings off / plain | served as F.linear / plain |")
        for r in rows:
            for mode in ("graph", "eager"):
                print(f"| {r['batch']} | {mode} | {r[f'tunedb siblings off {mode} / plain']:.3f} | "
                      f"{r[f'tunedb served as F.linear {mode} / plain']:.3f} |")
    print(f"\nserved (tuning_report): {report!s:.1500}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "report": str(report), "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
