"""Two MoE layers end to end (bench/moe.py's second part): transformers' own sparse MoE blocks
(router, experts, Qwen1.5's shared expert) of a preset, x = x + block(rms_norm(x)) twice, at
decode batch 1/16/64 (one token each) and a 2048-token prefill, bf16, random weights.

Arms: transformers' experts forward as the model ships it -- `eager` (its loop over the experts
that received tokens; it reads which experts were hit back to the host, so it runs eagerly,
CUDA events around the call) and `grouped_mm` (transformers' torch._grouped_mm path, captured in
a CUDA graph) -- against the same blocks after tunedb's swap (group_gemm.moe.swap_experts: the
router stays the model's) serving the tuned table of bench/moe.py's kernel part, and serving the
untuned Triton default, both captured in a CUDA graph. Attention is not part of these layers.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tunedb.families.group_gemm import moe
from tunedb.records import Config
from tunedb.runtime import launch_table

SCENARIOS = (("decode", 1, 1), ("decode", 16, 1), ("decode", 64, 1), ("prefill", 1, 2048))  # (kind, batch, seq)


def _blocks(preset: str, device: str):
    """The preset's two MoE blocks on the GPU with random bf16 weights (from a meta model)."""
    model = moe.meta_model(preset, layers=2)
    blocks = [layer.mlp for layer in model.model.layers]
    gen = torch.Generator(device=device).manual_seed(0)
    for b in blocks:
        b.to_empty(device=device)
        for name, p in b.named_parameters():
            fan_in = p.shape[-1]
            with torch.no_grad():
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        b.eval()
    return model, blocks


def _forward(blocks, x):
    for b in blocks:
        y = b(F.rms_norm(x, (x.shape[-1],)))
        x = x + (y[0] if isinstance(y, tuple) else y)
    return x


def run_e2e(models, picks_by_model: dict, log) -> dict:
    import moe as kernel_bench  # bench/moe.py (its directory is on sys.path)

    try:
        import transformers
    except ImportError as exc:
        log(f"e2e skipped: transformers is not installed ({exc})")
        return {"skipped": f"transformers not installed: {exc}"}
    results = {"transformers": transformers.__version__}
    for preset in models:
        try:
            model, blocks = _blocks(preset, kernel_bench.DEVICE)
        except Exception as exc:  # an older transformers without the stacked-experts layout
            log(f"e2e {preset} skipped: {type(exc).__name__}: {exc}")
            results[preset] = {"skipped": f"{type(exc).__name__}: {exc}"}
            continue
        experts = [b.experts for b in blocks]
        if not all(moe.recognise(e, b) for e, b in zip(experts, blocks)):
            results[preset] = {"skipped": "this transformers' MoE experts are not the stacked layout group_gemm swaps"}
            continue
        picks = picks_by_model.get(preset, {})
        h = model.config.hidden_size
        rows = []
        for kind, batch, seq in SCENARIOS:
            x = torch.randn((batch, seq, h), device=kernel_bench.DEVICE, dtype=torch.bfloat16)
            row = {"scenario": f"{kind} {batch}x{seq}", "tokens": batch * seq}
            with torch.no_grad():
                # transformers with the experts interface runs `eager` (its loop) or `grouped_mm`
                # by config; an older 5.x has only its own forward (a loop: timed as eager)
                switchable = all(hasattr(e, "config") for e in experts)
                for impl in ("eager", "grouped_mm") if switchable else ("eager",):
                    if switchable:
                        for e in experts:
                            e.config._experts_implementation = impl
                    try:
                        fn = lambda: _forward(blocks, x)  # noqa: E731
                        row[f"hf_{impl}"] = (kernel_bench.time_eager(fn) if impl == "eager"
                                             else kernel_bench.time_graph(fn))
                    except Exception as exc:  # an implementation this torch/transformers cannot run
                        log(f"e2e {preset} {row['scenario']} hf {impl}: {type(exc).__name__}: {str(exc)[:160]}")
                        row[f"hf_{impl}"] = None
                ref = _forward(blocks, x).float()
                moe.swap_experts(model)
                for arm in ("tuned", "default"):
                    def override(family, sig, m, arm=arm):
                        if family.name != "group_gemm":
                            return None
                        if arm == "default":
                            return Config.sentinel("default"), "bench"
                        table = picks.get("up" if sig.get("x") == "token" else "down")
                        if not table:
                            return Config.sentinel("default"), "bench"
                        cid = kernel_bench.served({int(k): v for k, v in table.items()}, m)
                        return family.parse_config(cid), "bench"
                    try:
                        with launch_table.overriding(override):
                            y = _forward(blocks, x).float()
                            err = float((y - ref).norm() / ref.norm())
                            row[f"{arm}_rel_err_vs_hf"] = err
                            row[arm] = kernel_bench.time_graph(lambda: _forward(blocks, x))
                    except Exception as exc:
                        log(f"e2e {preset} {row['scenario']} {arm}: {type(exc).__name__}: {str(exc)[:160]}")
                        row[arm] = None
                for e in experts:  # back to the model's own forward for the next scenario
                    e.__dict__.pop("forward", None)
                    e._tunedb_group_gemm = False
            best_hf = min((t for t in (row.get("hf_eager"), row.get("hf_grouped_mm")) if t), default=None)
            row["tuned_vs_best_hf"] = best_hf / row["tuned"] if best_hf and row.get("tuned") else None
            rows.append(row)
        results[preset] = {"rows": rows}
        model = blocks = experts = None  # free this preset's weights before the next
        torch.cuda.empty_cache()
        _print(preset, rows)
    geo = [r["tuned_vs_best_hf"] for v in results.values() if isinstance(v, dict)
           for r in v.get("rows", []) if r.get("tuned_vs_best_hf")]
    results["geomean_tuned_vs_best_hf"] = math.exp(sum(map(math.log, geo)) / len(geo)) if geo else None
    print(f"\n- e2e geomean tuned vs best transformers arm: {results['geomean_tuned_vs_best_hf']}")
    return results


def _print(preset: str, rows) -> None:
    f = lambda t: f"{t:.4f}" if t else "-"  # noqa: E731
    print(f"\n### {preset}: two MoE layers, ms (hf eager: events around eager calls; the rest CUDA graphs)\n")
    print("| scenario | hf eager | hf grouped_mm | tunedb default | tunedb tuned | tuned vs best hf | rel err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['tuned_vs_best_hf']:.2f}x" if r.get("tuned_vs_best_hf") else "-"
        err = r.get("tuned_rel_err_vs_hf")
        print(f"| {r['scenario']} | {f(r.get('hf_eager'))} | {f(r.get('hf_grouped_mm'))} | {f(r.get('default'))} | "
              f"{f(r.get('tuned'))} | {ratio} | {err:.1e} |" if err is not None else
              f"| {r['scenario']} | {f(r.get('hf_eager'))} | {f(r.get('hf_grouped_mm'))} | - | - | {ratio} | - |")
