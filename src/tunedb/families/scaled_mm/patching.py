"""optimize() for torchao-quantized models: every nn.Linear whose weight is a torchao W8A8 tensor
(torchao_bridge.is_quantized) becomes a QuantizedLinear that quantizes its activation the way the
scheme does (per token for row-wise and int8, per 1x128 block for block scales; dynamic, as
torchao's configs) and runs the GEMM through tunedb's op, so the selector's table (or the
`heuristic` sentinel) picks the kernel instead of torchao's fixed path (torch._scaled_mm for fp8
row-wise, torchao's Triton kernel for blocks, _int_mm for int8). The weight and its scales are
torchao's own tensors' data, shared, not copied.

Numerics: the activation's scale is amax/QMAX per row (or block) in fp32 (on CUDA, per-token
scales take one kernel, launch.quantize_rows; torch ops otherwise). torchao 0.18 differs: fp8
divides amax by 448 in the activation's dtype (bf16), int8 takes amax/127.5 over [-128, 127];
so q differs in places and outputs differ by about the activation's 8-bit rounding. The
quantized GEMM accumulates in fp32 per K tile (torchao's fp8 default asks cuBLAS for fast
accumulation, which is less precise), so outputs agree with torchao's to the fp8 (int8) rounding
of the activation, not bit for bit. Activations of a dtype the op does not serve (fp32; fp16 for
fp8) run torchao's own path (QuantizedLinear.served_dtype); served ones come back in their dtype.

The report (tuning_report()) gets one line per optimized model and family, spec 000's wording:
"scaled_mm_fp8: 15 quantized layer(s) over 5 signature(s) (LlamaMirror): 15 with a tuning entry
(system=15), 0 on the shape heuristic". A layer counts under the weakest tier any of its calls
resolved at; layers that have not run on a GPU yet are counted apart.
"""
from __future__ import annotations

import weakref
from typing import Any

from tunedb.families.scaled_mm import torchao_bridge
from tunedb.families.scaled_mm.configs import INT8_FAMILY

_models: list[tuple[weakref.ref, str, str, list[weakref.ref]]] = []  # (model, name, family, layers)


def quantized_linear_class() -> type:
    from tunedb.families.scaled_mm.module import QuantizedLinear

    return QuantizedLinear


def servable(module: Any) -> bool:
    """A plain nn.Linear holding a torchao W8A8 weight of a layout the ops serve (bf16 in)."""
    import torch

    if type(module) is not torch.nn.Linear or not torchao_bridge.is_quantized(module.weight):
        return False
    w = module.weight
    if w.qdata.dtype == torch.float8_e4m3fn:
        return torchao_bridge.scale_mode(w) is not None and getattr(w, "dtype", None) == torch.bfloat16
    # int8: one scale per output channel, or one for the tensor (served as N equal ones)
    n = int(w.qdata.shape[0])
    return getattr(w, "dtype", None) in (torch.bfloat16, torch.float16) and w.scale.numel() in (1, n)


def optimize(model: Any, family: str) -> Any:
    """Swap `model`'s servable torchao Linears of `family` (in place) and register them for the
    report. Hooks on a Linear keep it (its hooks must keep firing)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return model
    cls = quantized_linear_class()
    layers: list[Any] = []
    swapped: dict[int, Any] = {}
    for parent in list(model.modules()):
        for attr, child in list(parent._modules.items()):
            if not servable(child) or child._forward_hooks or child._forward_pre_hooks:
                continue
            is_int8 = child.weight.qdata.dtype == torch.int8
            if (family == INT8_FAMILY) != is_int8:
                continue
            layer = swapped.get(id(child)) or cls(child)
            swapped[id(child)] = layer
            setattr(parent, attr, layer)
            layers.append(layer)
    if layers:
        _models[:] = [r for r in _models if r[0]() is not None and not (r[0]() is model and r[2] == family)]
        _models.append((weakref.ref(model), type(model).__name__, family, [weakref.ref(l) for l in layers]))
    return model


def report_lines(only: str | None = None) -> list[str]:
    """One line per optimized model and quantized family (`only`: that family's lines)."""
    from tunedb.runtime import selector

    counts = selector.counters()
    lines = []
    for model_ref, name, family, refs in _models:
        if model_ref() is None or (only is not None and family != only):
            continue
        sigs_seen = counts.get(family, {}).get("signatures", {})
        layers = [r() for r in refs if r() is not None]
        tiers: dict[str, int] = {}
        entry = heuristic = not_run = 0
        sigs = set()
        for layer in layers:
            sig = layer.signature()
            sigs.add(sig)
            per_tier = sigs_seen.get(sig.format())
            used = [t for t in selector.TIER_NAMES if per_tier and per_tier.get(t)]
            if not used:
                not_run += 1
                continue
            weakest = used[-1]  # TIER_NAMES runs strongest first
            if weakest in ("user", "system"):
                entry += 1
                tiers[weakest] = tiers.get(weakest, 0) + 1
            else:
                heuristic += 1
        by_tier = ", ".join(f"{t}={n}" for t, n in tiers.items())
        text = (f"{family}: {len(layers)} quantized layer(s) over {len(sigs)} signature(s) ({name}): "
                f"{entry} with a tuning entry{f' ({by_tier})' if by_tier else ''}, {heuristic} on the shape heuristic")
        if not_run:
            text += f", {not_run} not yet run on a GPU"
        lines.append(text)
    return lines
