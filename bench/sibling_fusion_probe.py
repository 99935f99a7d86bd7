"""What one GEMM for sibling projections buys Llama-3-8B decode (issue 18's end-to-end goal).

    PYTHONPATH=src:bench python bench/sibling_fusion_probe.py --out sibling_fusion_probe.json   # ~60 s
    PYTHONPATH=src:bench python bench/sibling_fusion_probe.py --model llama-3.2-3b --out p3b.json  # keys no table names

A probe, not a feature: at decode a layer's q, k and v projections (and gate and up) read the
same input and are three (two) GEMMs whose fixed cost (launch, ramp, tail: 5.4 us for the 8.4 MB
k projection at M=1, 1.95 us of it moving bytes) is paid per call. Here the bench model (2 decoder
layers of transformers' Llama, CUDA graphs, as bench/chain_pdl_e2e.py) is rewritten so that
q_proj computes [q | k | v] with one nn.Linear over the concatenated weights and k_proj / v_proj
return their slices (likewise gate_proj / up_proj: `qkv+gu`), then timed beside the model as
written, plain and through tunedb.optimize() (shipped tables, no tune), in paired rounds. The
fused key 6144x4096 (28672x4096) is in no shipped table, so tunedb serves it as its fallback
does (cuBLAS). The rewrite is the probe's own (a closure per layer), valid only for a forward
that calls the siblings on the same tensor, in order, once each: what a feature would prove.
Since session 35 the feature exists (families/gemm/siblings.py, TUNEDB_SIBLINGS, default on):
`tunedb` is optimize() with it, `tunedb, siblings off` without it (the rewritten models too),
`tunedb, split auto` with TUNEDB_SIBLING_SPLIT=auto (K split where a group's slabs are fewer than
the SMs; at one row nothing changes).
"""
from __future__ import annotations

import copy
import json
import statistics
import time

import torch
from torch import nn

import tunedb
from e2e_models import build
from e2e_timing import output_tensor, paired_speedups, rel_err, rounds_args, run_env, write_result
from tunedb import settings
from tunedb.measure.cudagraph import capture
from tunedb.runtime import selector


class _Lead(nn.Module):
    """The first sibling: one GEMM over all siblings' weights, the others' slices left in `box`."""

    def __init__(self, lins: list[nn.Linear], box: list) -> None:
        super().__init__()
        w = torch.cat([l.weight for l in lins])
        b = torch.cat([l.bias for l in lins]) if lins[0].bias is not None else None
        self.fused = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.fused.weight.copy_(w)
            if b is not None:
                self.fused.bias.copy_(b)
        self.sizes = [l.out_features for l in lins]
        self.box = box

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.fused(x).split(self.sizes, dim=-1)
        self.box[:] = list(parts[1:])
        return parts[0]


class _Follow(nn.Module):
    def __init__(self, box: list) -> None:
        super().__init__()
        self.box = box

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.box.pop(0)


def fuse(model: nn.Module, groups: tuple[tuple[str, ...], ...]) -> nn.Module:
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for names in groups:
            if all(isinstance(getattr(parent, n, None), nn.Linear) for n in names):
                box: list = []
                lins = [getattr(parent, n) for n in names]
                setattr(parent, names[0], _Lead(lins, box))
                for n in names[1:]:
                    setattr(parent, n, _Follow(box))
    return model


QKV = (("q_proj", "k_proj", "v_proj"),)
QKV_GU = QKV + (("gate_proj", "up_proj"),)


def main(argv=None) -> int:
    a = rounds_args(__doc__, argv, models=("llama-3-8b", "llama-3.2-3b"))
    t0 = time.time()
    rows = {}
    with settings.override(USER_DB="off"), torch.no_grad():
        selector.reload()
        bm = build(a.model, "cuda", batches=(1, 16))
        plain = bm.module
        variants = {"plain qkv": fuse(plain, QKV), "plain qkv+gu": fuse(plain, QKV_GU)}
        with settings.override(SIBLINGS="0"):
            variants["tunedb, siblings off"] = tunedb.optimize(plain, inplace=False)
        variants["tunedb"] = tunedb.optimize(plain, inplace=False)  # TUNEDB_SIBLINGS=1: one launch a group
        with settings.override(SIBLING_SPLIT="auto"):  # K split for groups of fewer slabs than SMs (session 38)
            variants["tunedb, split auto"] = tunedb.optimize(plain, inplace=False)
        with settings.override(SIBLINGS="0"):
            variants["tunedb qkv"] = tunedb.optimize(fuse(plain, QKV), inplace=False)
            variants["tunedb qkv+gu"] = tunedb.optimize(fuse(plain, QKV_GU), inplace=False)
        for batch in (1, 16):
            ref = output_tensor(bm.call(plain, batch)())
            graphs, errs = {}, {}
            keep: list = []
            graphs["plain"] = capture(bm.call(plain, batch), warmup=3, keep=keep)
            for label, mod in variants.items():
                keep = []
                graphs[label] = capture(bm.call(mod, batch), warmup=3, keep=keep)
                graphs[label].replay()
                torch.cuda.synchronize()
                errs[label] = rel_err(output_tensor(keep[-1]), ref)
            ms, ratios = paired_speedups({k: g.replay for k, g in graphs.items()}, "plain", a.rounds, a.per_round,
                                         seed=batch)
            rows[batch] = {"ms": ms, "speedup_over_plain": {k: statistics.median(v) for k, v in ratios.items()},
                           "err_vs_plain": errs}
            print(f"batch {batch}: {json.dumps(rows[batch])}", flush=True)
    env = run_env(bm.label, t0)
    print("\n| batch | variant | ms | x plain | rel err vs plain |")
    print("|---|---|---|---|---|")
    for b, r in rows.items():
        for label in r["ms"]:
            print(f"| {b} | {label} | {r['ms'][label]:.4f} | {r['speedup_over_plain'].get(label, 1.0):.3f} "
                  f"| {r['err_vs_plain'].get(label, 0.0):.1e} |")
    write_result(a.out, env, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
