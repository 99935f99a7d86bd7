"""Fourteen models no table names (bench/unseen_zoo_models.py: a ViT, torch's TransformerEncoder, a
conv net, a conv + GRU + LSTM speech model, a tied-embedding LM step, einsum attention, a
weight-normed MLP, a masked-routing MoE; session 34 added GPT-2 with Conv1D projections, a T5
encoder-decoder, a diffusion UNet, a Mamba-like scan, Mixer/ConvNeXt on strided views, shared and
fp32 heads: bench/unseen_zoo_models2.py), as a new user would try them: `tunedb.optimize` on the
shipped tables (no tune) against the same model plain, in one run.

    PYTHONPATH=src python bench/unseen_zoo.py [--models vit,txenc] [--quick] [--out JSON]

Per model (bf16, CUDA, eval): the output's relative Frobenius error against the model in fp32
(plain's and tunedb's, side by side: tunedb must not add error), the gradients of a loss with
respect to every parameter against fp32's (autograd through whatever tunedb serves), then wall
time per forward, eager and as a CUDA-graph replay (models with data-dependent shapes: eager
only), plain and tunedb in paired shuffled rounds; the ratio is the median of the per-round
ratios (tunedb / plain: above 1 is slower). Expected: about 150 s on the H200.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics

import linalg_eager  # bench/: _wall, a block of calls timed by wall clock
import torch
from e2e_timing import graph_of, paired_rounds, rel_err
from unseen_zoo_models import ZOO, build


def _block_ms(step, n: int) -> float:
    return linalg_eager._wall(step, n) / 1e3


def _grads(model, inputs) -> torch.Tensor:
    """Every floating parameter's gradient of mean(out^2), flattened in fp32 (zeros where none)."""
    model.zero_grad(set_to_none=True)
    model.train()  # cuDNN's RNN backward runs in training mode only (no model here has dropout)
    with torch.enable_grad():
        out = model(*inputs)
        out.float().square().mean().backward()
    model.eval()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                      for p in model.parameters()])


def check(name: str) -> dict:
    """Output and gradient errors against fp32, plain and tunedb."""
    import tunedb

    plain, inputs = build(name)
    ref32 = copy.deepcopy(plain).float()
    in32 = tuple(t.float() if t.is_floating_point() else t for t in inputs)
    tuned = tunedb.optimize(copy.deepcopy(plain))
    with torch.no_grad():
        ref = ref32(*in32)
        row = {"err_plain": rel_err(plain(*inputs), ref), "err_tunedb": rel_err(tuned(*inputs), ref)}
    g32 = _grads(ref32, in32)
    row["grad_err_plain"] = rel_err(_grads(plain, inputs), g32)
    row["grad_err_tunedb"] = rel_err(_grads(tuned, inputs), g32)
    row["swapped"] = sorted({type(m).__name__ for m in tuned.modules()} - {type(m).__name__ for m in plain.modules()})
    return row


def variants(which: str) -> dict:
    """name -> (optimize()'s families=, TUNEDB_* settings during optimize()) of each timed variant
    besides plain."""
    from tunedb.runtime import patching

    default = patching.patching_families()
    out = {"tunedb": (None, {})}
    if which in ("all", "aa"):
        out["plain copy"] = ([], {})  # A/A: optimize() with no family, the model as it was
    if which == "all":
        out["swap unmeasured"] = (None, {"LEAVE_UNMEASURED": "0"})  # what optimize() did before session 31
        out["gemm only"] = ("gemm", {"LEAVE_UNMEASURED": "0"})
        out["no bmm"] = ([f for f in default if f != "bmm"], {"LEAVE_UNMEASURED": "0"})
    return out


def timing(name: str, rounds: int, per_round: int, settle: int, which: str = "tunedb") -> dict:
    import tunedb

    plain, inputs = build(name)
    models = {"plain": plain}
    from tunedb import settings

    for label, (fams, knobs) in variants(which).items():
        with settings.override(**knobs):
            models[label] = tunedb.optimize(copy.deepcopy(plain), families=fams)
    capturable = ZOO[name][2]
    with torch.no_grad():
        steps = {f"{label} eager": (lambda m=m: m(*inputs)) for label, m in models.items()}
        for step in steps.values():
            for _ in range(settle):  # the bmm mode's back-off (1, 2, 4, ... forwards) settles
                step()
        if capturable:
            for label in models:
                steps[f"{label} graph"] = graph_of(steps[f"{label} eager"], warmup=3).replay
        for f in steps.values():
            f()
        per = paired_rounds(steps, rounds, lambda step: _block_ms(step, per_round), seed=len(name), warmup=1)
    row = {"ms": {k: statistics.median(v) for k, v in per.items()}}
    for label in models:
        if label == "plain":
            continue
        for mode in ("eager", "graph"):
            if f"plain {mode}" in per:
                ratios = [t / p for t, p in zip(per[f"{label} {mode}"], per[f"plain {mode}"])]
                key = f"{mode}_tunedb_over_plain" if label == "tunedb" else f"{mode}_{label}_over_plain"
                row[key] = statistics.median(ratios)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, of: {', '.join(ZOO)}")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--settle", type=int, default=200,
                    help="untimed eager forwards of each variant first (the bmm mode's back-off settles)")
    ap.add_argument("--variants", choices=("tunedb", "aa", "all"), default="aa",
                    help="aa (default): also an untouched copy of plain (the A/A noise); all: also "
                         "optimize() swapping unmeasured Linears (TUNEDB_LEAVE_UNMEASURED=0), "
                         "and that with families='gemm' and every default family but bmm")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    names = [n for n in a.models.split(",") if n]
    bad = [n for n in names if n not in ZOO]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; allowed: {', '.join(ZOO)}")
    from tunedb import settings
    from tunedb.runtime import report, selector

    rounds, per_round = (5, 5) if a.quick else (15, 20)
    rows = {}
    with settings.override(USER_DB="off"):  # the shipped tables alone, as on a new machine
        selector.reload()
        for name in names:
            try:
                rows[name] = {**check(name), **timing(name, rounds, per_round, a.settle, a.variants)}
            except Exception as exc:  # one model's failure is a row, not the end of the run
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"{name}: {rows[name]}", flush=True)
        served = report.model_lines()
    print(f"\nunseen zoo, bf16; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| model | swapped | out err plain / tunedb | grad err plain / tunedb | eager ms plain / tunedb | eager x | graph ms plain / tunedb | graph x |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | **{r['error']}** | | | | | | |")
            continue
        ms = r["ms"]
        graph = (f"{ms['plain graph']:.4f} / {ms['tunedb graph']:.4f} | {r['graph_tunedb_over_plain']:.3f}"
                 if "plain graph" in ms else "not capturable | ")
        print(f"| {name} | {', '.join(r['swapped']) or '-'} | {r['err_plain']:.1e} / {r['err_tunedb']:.1e} | "
              f"{r['grad_err_plain']:.1e} / {r['grad_err_tunedb']:.1e} | {ms['plain eager']:.4f} / "
              f"{ms['tunedb eager']:.4f} | {r['eager_tunedb_over_plain']:.3f} | {graph} |")
    extra = sorted({k for r in rows.values() for k in r if k.endswith("_over_plain") and "tunedb" not in k})
    if extra:
        print("\n| model | " + " | ".join(extra) + " |\n|---|" + "---|" * len(extra))
        for name, r in rows.items():
            print(f"| {name} | " + " | ".join(f"{r[k]:.3f}" if k in r else "" for k in extra) + " |")
    print("\nserved:\n" + "\n".join(served))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "served": served, "torch": torch.__version__,
                       "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
