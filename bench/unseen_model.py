"""A decoder no preset, census or table names, as a new user would try it: `tunedb.optimize` on the
shipped tables (no tune) against the same model plain, eager and in CUDA graphs, in one run.

    PYTHONPATH=src python bench/unseen_model.py [--out JSON] [--layers 2] [--quick]

The model (bench/unseen_decoder.py) is plain torch with random weights (bf16, CUDA): pre-norm blocks with
grouped-query attention (biased q/k/v, as Qwen2's), a SiLU-gated MLP, widths 2560 / 6912 / 20
heads / 4 KV heads, none of which a shipped table measured, so every GEMM key is one the default
path has never seen: what serves there is the family's rule for unmeasured keys (the vendor op,
or a model-tier config only with measured confidence), plus the run-time's own host cost per
Linear. Points: decode steps (one token per sequence, no KV cache) at batches 1 and 16, and a
512-token prefill at batch 1. Each point checks tunedb's output against plain's (relative
Frobenius error) and times both variants in paired, shuffled rounds (per round, the wall time of a
block of forwards back to back, synchronised at its ends, per forward; eager forwards, graph
replays); the ratio is the median of the per-round ratios, and "A/A" is a deep copy of the plain
model timed in the same rounds against it (the noise floor: one model object over another). `tunedb/plain`
below 1 is faster. Expected: about 40 s on the H200.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics

import linalg_eager  # bench/: _wall, a block of calls timed by wall clock
import torch
from e2e_timing import graph_of, paired_rounds, rel_err
from unseen_decoder import FFN, HEADS, KV_HEADS, WIDTH, build  # the model, in a file of its own


def _block_ms(step, n: int) -> float:
    """Wall time of n calls back to back, the stream synchronised before and after, per call (ms):
    what a loop of eager forwards costs where the host sets the pace; for graph replays it is
    the replay's device time plus its launch."""
    return linalg_eager._wall(step, n) / 1e3


def point(plain, tuned, batch: int, tokens: int, rounds: int, per_round: int, twin=None) -> dict:
    x = torch.randn(batch, tokens, WIDTH, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = plain(x)
        err = rel_err(tuned(x), ref)
        eager = {"plain": lambda: plain(x), "tunedb": lambda: tuned(x)}
        if twin is not None:  # A/A: a deep copy of plain, timed in the same rounds (the noise floor)
            eager["plain copy"] = lambda: twin(x)
        graphs = {k: graph_of(f, warmup=3) for k, f in eager.items()}
        steps = {f"{k} {mode}": (f if mode == "eager" else graphs[k].replay)
                 for mode in ("eager", "graph") for k, f in eager.items()}
        for f in steps.values():
            f()
        per = paired_rounds(steps, rounds, lambda step: _block_ms(step, per_round), seed=batch * 1000 + tokens, warmup=1)
    ms = {k: statistics.median(v) for k, v in per.items()}
    row = {"batch": batch, "tokens": tokens, "rel_err": err, "ms": ms}
    for mode in ("eager", "graph"):
        for k, name in (("tunedb", "tunedb"), ("plain copy", "aa")):
            if f"{k} {mode}" in per:
                ratios = [t / p for t, p in zip(per[f"{k} {mode}"], per[f"plain {mode}"])]
                row[f"{mode}_{name}_over_plain"] = statistics.median(ratios)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import tunedb
    from tunedb import settings

    from tunedb.runtime import selector

    with settings.override(USER_DB="off"):  # the shipped tables alone, as on a new machine
        selector.reload()
        plain = build(a.layers)
        tuned = tunedb.optimize(copy.deepcopy(plain))
        rounds, per_round = (5, 10) if a.quick else (9, 20)
        twin = copy.deepcopy(plain)
        rows = [point(plain, tuned, b, t, rounds, per_round, twin) for b, t in ((1, 1), (16, 1), (1, 512))]
        report = tunedb.tuning_report()
    print(f"unseen decoder: {a.layers} layers, width {WIDTH}, ffn {FFN}, {HEADS}/{KV_HEADS} heads, bf16; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| batch x tokens | rel err | plain eager ms | tunedb eager ms | eager tunedb/plain | eager A/A | plain graph ms "
          "| tunedb graph ms | graph tunedb/plain | graph A/A |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms"]
        print(f"| {r['batch']} x {r['tokens']} | {r['rel_err']:.1e} | {ms['plain eager']:.4f} | {ms['tunedb eager']:.4f} | "
              f"{r['eager_tunedb_over_plain']:.3f} | {r['eager_aa_over_plain']:.3f} | {ms['plain graph']:.4f} | "
              f"{ms['tunedb graph']:.4f} | {r['graph_tunedb_over_plain']:.3f} | {r['graph_aa_over_plain']:.3f} |")
    print(f"\nserved (tuning_report): {report!s:.2000}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "report": str(report), "torch": torch.__version__,
                       "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
