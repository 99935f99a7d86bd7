"""The unseen zoo (bench/unseen_zoo_models.py) through `tunedb.optimize` on the CPU: no GPU needed.

    PYTHONPATH=src python bench/unseen_zoo_cpu.py [--models vit,unet] [--dtypes fp32,bf16]

Per model, dtype (fp32, bf16) and variant of optimize():
- default: optimize(copy.deepcopy(model)), as a user calls it;
- swapped: the same with TUNEDB_LEAVE_UNMEASURED=0 (unmeasured Linears swapped, as autotune()
  swaps them; the GPU test's second arm);
- all: optimize(families="all") with TUNEDB_LEAVE_UNMEASURED=0 (every family patches every
  module it could serve, as the census of `tunedb tune` does), plus the bmm family's product mode
  installed by hand on models without nn.MultiheadAttention (optimize() installs it only where
  CUDA runs; on CPU tensors it must hand every product back to torch).
Checked: optimize() does not raise; the optimized model's output (no grad, eval) equals the plain
model's (CPU tensors take the torch arms): max |tuned - plain| / max |plain| <= 1e-5 in fp32,
<= 1e-2 in bf16 (one bf16 rounding), same shape and dtype; its state_dict keys are the plain
model's, and so are its named_parameters() names (session 35: the LSTM / GRU wrapper of before
renamed them, `gru.rnn.weight_ih_l0`); a backward of mean(out^2) in train mode (as
bench/unseen_zoo.py's) runs and gives the parameters (matched by position) the plain model's
gradients within the same bounds (relative Frobenius).
All with the shipped tables alone (TUNEDB_USER_DB=off). Prints a table; exits 1 on any failure.
About 1-2 minutes for all models on an 8-core CPU.
"""
from __future__ import annotations

import argparse
import copy
import time
import traceback

import torch

from unseen_zoo_models import ZOO, build

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BOUND = {"fp32": 1e-5, "bf16": 1e-2}
VARIANTS = ("default", "swapped", "all")


def _optimized(model: torch.nn.Module, variant: str) -> torch.nn.Module:
    import tunedb
    from tunedb import settings
    from tunedb.families.bmm import serving

    if variant == "default":
        return tunedb.optimize(copy.deepcopy(model))
    with settings.override(LEAVE_UNMEASURED="0"):
        if variant == "swapped":
            return tunedb.optimize(copy.deepcopy(model))
        tuned = tunedb.optimize(copy.deepcopy(model), families="all")
    if not serving.holds_native_fast_path(tuned):
        serving.install(tuned)
    return tuned


def _grads(model: torch.nn.Module, inputs: tuple) -> list[tuple[str, torch.Tensor | None]]:
    """(name, gradient) of every parameter in parameters() order, after mean(out^2).backward()."""
    model.zero_grad(set_to_none=True)
    model.train()
    with torch.enable_grad():
        model(*inputs).float().square().mean().backward()
    model.eval()
    return [(n, None if p.grad is None else p.grad.float()) for n, p in model.named_parameters()]


def _max_rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def _grad_rel(got: list, ref: list) -> tuple[float, str]:
    """Relative Frobenius difference of all gradients, parameters matched by position (an
    optimized model's parameters keep their order; their names may gain a wrapper's level)."""
    if len(got) != len(ref):
        return float("inf"), f"{len(got)} parameters, plain has {len(ref)}"
    missing = [n for (n, g), (_, r) in zip(got, ref) if (g is None) != (r is None)]
    if missing:
        return float("inf"), f"gradient presence differs on {missing[:3]}"
    num = sum(float((g - r).square().sum()) for (_, g), (_, r) in zip(got, ref) if r is not None)
    den = sum(float(r.square().sum()) for _, r in ref if r is not None)
    return (num / max(den, 1e-30)) ** 0.5, ""


def check(name: str, dtype: str, variants=VARIANTS) -> list[dict]:
    model, inputs = build(name, device="cpu", dtype=DTYPES[dtype])
    with torch.no_grad():
        ref = model(*inputs)
    ref_grads = _grads(copy.deepcopy(model), inputs)
    keys = set(model.state_dict())
    before = {type(m).__name__ for m in model.modules()}
    rows = []
    for variant in variants:
        row = {"model": name, "dtype": dtype, "variant": variant, "problems": []}
        t0 = time.perf_counter()
        try:
            tuned = _optimized(model, variant)
            row["swapped"] = sorted({type(m).__name__ for m in tuned.modules()} - before)
            with torch.no_grad():
                out = tuned(*inputs)
            if out.shape != ref.shape or out.dtype != ref.dtype:
                row["problems"].append(f"output {tuple(out.shape)} {out.dtype} != {tuple(ref.shape)} {ref.dtype}")
            else:
                row["out"] = _max_rel(out, ref)
                row["exact"] = bool(torch.equal(out, ref))
                if not row["out"] <= BOUND[dtype]:
                    row["problems"].append(f"output differs: {row['out']:.2e}")
            got_keys = set(tuned.state_dict())
            if got_keys != keys:
                extra, lost = sorted(got_keys - keys)[:3], sorted(keys - got_keys)[:3]
                row["problems"].append(f"state_dict keys: +{extra} -{lost}")
            got_grads = _grads(tuned, inputs)
            row["grad"], why = _grad_rel(got_grads, ref_grads)
            if why or not row["grad"] <= BOUND[dtype]:
                row["problems"].append(why or f"gradients differ: {row['grad']:.2e}")
            renamed = [(r, g) for (g, _), (r, _) in zip(got_grads, ref_grads) if g != r]
            if renamed:
                row["problems"].append(f"named_parameters renamed {len(renamed)} ({renamed[0][0]} -> {renamed[0][1]})")
        except Exception as exc:
            row["problems"].append(f"{type(exc).__name__}: {exc}"[:300])
            row["traceback"] = traceback.format_exc()
        row["s"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, of: {', '.join(ZOO)}")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, of: fp32, bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--tracebacks", action="store_true", help="print each failure's traceback")
    a = ap.parse_args(argv)
    names = [n for n in a.models.split(",") if n]
    dtypes = [d for d in a.dtypes.split(",") if d]
    variants = [v for v in a.variants.split(",") if v]
    for what, got, allowed in (("model", names, ZOO), ("dtype", dtypes, DTYPES), ("variant", variants, VARIANTS)):
        bad = [n for n in got if n not in allowed]
        if bad:
            ap.error(f"unknown {what}(s) {', '.join(bad)}; allowed: {', '.join(allowed)}")
    from tunedb import settings
    from tunedb.runtime import selector

    rows = []
    with settings.override(USER_DB="off"):  # the shipped tables alone, as on a new machine
        selector.reload()
        for name in names:
            for dtype in dtypes:
                got = check(name, dtype, variants)
                rows += got
                print(f"{name} {dtype}: " + "; ".join(f"{r['variant']} {'FAIL' if r['problems'] else 'ok'}"
                                                      for r in got), flush=True)
    selector.reload()
    print(f"\nunseen zoo on CPU, torch {torch.__version__}")
    print("| model | dtype | variant | swapped in | out max rel diff | bit-exact | grad rel diff | s | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out = f"{r['out']:.1e}" if "out" in r else "-"
        grad = f"{r['grad']:.1e}" if "grad" in r else "-"
        print(f"| {r['model']} | {r['dtype']} | {r['variant']} | {', '.join(r.get('swapped', [])) or '-'} | {out} | "
              f"{'yes' if r.get('exact') else 'no' if 'exact' in r else '-'} | {grad} | {r['s']:.1f} | "
              f"{'**' + '; '.join(r['problems']) + '**' if r['problems'] else 'ok'}"
              f"{''.join(f'; note: {n}' for n in r.get('notes', []))} |")
    failed = [r for r in rows if r["problems"]]
    if a.tracebacks:
        for r in failed:
            if "traceback" in r:
                print(f"\n{r['model']} {r['dtype']} {r['variant']}:\n{r['traceback']}")
    print(f"\n{len(rows) - len(failed)}/{len(rows)} ok")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
