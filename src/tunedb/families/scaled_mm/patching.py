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
from tunedb.families.scaled_mm.configs import FP8_FAMILY, INT8_FAMILY, SCALE_BLOCK

_QMAX = {"int8": 127.0, "fp8": 448.0}
_models: list[tuple[weakref.ref, str, str, list[weakref.ref]]] = []  # (model, name, family, layers)


def _module_class() -> type:
    import torch
    from torch import nn

    from tunedb.families.scaled_mm import ops  # registers the ops; its entry points skip the dispatcher in eager

    class QuantizedLinear(nn.Module):
        """A torchao W8A8 Linear served by tunedb::scaled_mm_fp8 / tunedb::scaled_mm_int8."""

        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            w = linear.weight
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.dt = "int8" if w.qdata.dtype == torch.int8 else "fp8"
            self.family = INT8_FAMILY if self.dt == "int8" else FP8_FAMILY
            self.scale = "row" if self.dt == "int8" else torchao_bridge.scale_mode(w)
            n = self.out_features
            self.register_buffer("qweight", w.qdata.contiguous(), persistent=False)
            ws = w.scale.to(torch.float32)
            self.register_buffer("w_scale", ws.reshape(n, 1) if self.scale == "row" else ws.contiguous(),
                                 persistent=False)
            self.bias = linear.bias
            self.torchao_weight = w  # what the layer came from (state_dict round trips keep it)

        def quantize_input(self, x2: Any) -> tuple[Any, Any]:
            """(q, scale) of the [M, K] activation: amax / QMAX per row, or per 1x128 block."""
            if self.scale == "row" and x2.is_cuda and x2.is_contiguous():
                from tunedb.families.scaled_mm.launch import quantize_rows

                return quantize_rows(x2, self.dt)  # one kernel (the _quant op's row quantizer)
            qmax = _QMAX[self.dt]
            xf = x2.float()
            if self.scale == "block":
                m, k = xf.shape
                kb = -(-k // SCALE_BLOCK)
                padded = torch.nn.functional.pad(xf, (0, kb * SCALE_BLOCK - k)) if k % SCALE_BLOCK else xf
                amax = padded.view(m, kb, SCALE_BLOCK).abs().amax(dim=2)
                s = amax.clamp_min(1e-12) / qmax
                v = (padded.view(m, kb, SCALE_BLOCK) / s.unsqueeze(2)).view(m, -1)[:, :k]
            elif self.scale == "tensor":
                s = (xf.abs().amax().clamp_min(1e-12) / qmax).reshape(1)
                v = xf / s
            else:
                s = xf.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / qmax
                v = xf / s
            v = v.clamp(-qmax, qmax)
            if self.dt == "int8":
                return v.round().to(torch.int8), s
            return v.to(torch.float8_e4m3fn), s

        def served_dtype(self, dtype: Any) -> bool:
            """Whether the op serves an activation of `dtype` (its output is the activation's
            dtype, as torchao's): fp8 writes bf16 only, int8 bf16 or fp16. The census keys the
            same calls only (torchao_bridge.linear_key)."""
            return dtype == torch.bfloat16 or (self.dt == "int8" and dtype == torch.float16)

        def forward(self, input: Any) -> Any:
            x = input  # nn's own parameter name: module(input=t) works as on the module replaced
            if not self.served_dtype(x.dtype):
                # an fp32 (or, for fp8, fp16) activation: torchao's own path, what the model ran
                # before optimize(); the op returned bf16 here (fp8) or refused fp32 (int8)
                return torch.nn.functional.linear(x, self.torchao_weight, self.bias)
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features).contiguous()
            if torchao_bridge.ACTIVE:  # a census is recording (tunedb census --fused --quantization)
                torchao_bridge.ACTIVE[-1].calls[(self.signature(), x2.shape[0])] += 1
            q, s = self.quantize_input(x2)
            if self.dt == "int8":
                y = ops.scaled_mm_int8(q, self.qweight, s, self.w_scale, x.dtype)
            else:
                y = ops.scaled_mm_fp8(q, self.qweight, s, self.w_scale, self.scale)
            if self.bias is not None:
                # added in fp32 where the dtypes differ (a bf16 bias on an fp16 activation), then
                # the activation's dtype, as torchao returns it (the sum promoted to fp32 here)
                y = (y + self.bias).to(x.dtype)
            return y.view(*lead, self.out_features)

        def signature(self) -> Any:
            from tunedb import families

            fam = families.get(self.family)
            out = "bf16" if self.dt == "fp8" else {torch.float16: "fp16"}.get(self.torchao_weight.dtype, "bf16")
            return fam.make_signature("scaled_mm", self.out_features, self.in_features, out, self.scale)

        def extra_repr(self) -> str:
            return (f"in_features={self.in_features}, out_features={self.out_features}, "
                    f"{self.family} scale={self.scale}, bias={self.bias is not None}")

    return QuantizedLinear


_CLASS: list[type] = []


def quantized_linear_class() -> type:
    if not _CLASS:
        _CLASS.append(_module_class())
    return _CLASS[0]


def servable(module: Any) -> bool:
    """A plain nn.Linear holding a torchao W8A8 weight of a layout the ops serve (bf16 in)."""
    import torch

    if type(module) is not torch.nn.Linear or not torchao_bridge.is_quantized(module.weight):
        return False
    w = module.weight
    if w.qdata.dtype == torch.float8_e4m3fn:
        return torchao_bridge.scale_mode(w) is not None and getattr(w, "dtype", None) == torch.bfloat16
    return getattr(w, "dtype", None) in (torch.bfloat16, torch.float16)


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
