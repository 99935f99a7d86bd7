"""QuantizedLinear, what optimize() puts in a torchao W8A8 Linear's slot (patching.py: the swap and
the report). A class of this module (not one made inside a function) so that torch.save / pickle
of an optimized model can name it."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunedb.families.scaled_mm import (
    ops,  # registers the ops; its entry points skip the dispatcher in eager
    torchao_bridge,
)
from tunedb.families.scaled_mm.configs import FP8_FAMILY, INT8_FAMILY, SCALE_BLOCK

_QMAX = {"int8": 127.0, "fp8": 448.0}


class QuantizedLinear(nn.Module):
    """A torchao W8A8 Linear served by tunedb::scaled_mm_fp8 / tunedb::scaled_mm_int8."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dt = "int8" if w.qdata.dtype == torch.int8 else "fp8"
        self.family = INT8_FAMILY if self.dt == "int8" else FP8_FAMILY
        self.scale = "row" if self.dt == "int8" else torchao_bridge.scale_mode(w)
        # the torchao tensor the layer came from, under nn.Linear's name: state_dict keys and
        # checkpoints stay the Linear's (`weight`, `bias`)
        self.weight = w
        self.bias = linear.bias
        self._bind()

    def _bind(self) -> None:
        """qweight and w_scale, the op's operands, from the torchao weight (its data, shared)."""
        w = self.weight
        self.register_buffer("qweight", w.qdata.contiguous(), persistent=False)
        ws = w.scale.to(torch.float32)
        if self.scale == "row":  # int8 per tensor (one scale) served per channel: the same scale N times
            ws = ws.reshape(-1, 1).expand(self.out_features, 1) if ws.numel() == 1 else ws.reshape(self.out_features, 1)
        self.register_buffer("w_scale", ws.contiguous(), persistent=False)

    def _apply(self, fn: Any, recurse: bool = True) -> "QuantizedLinear":
        """.to(dtype) / .half() / .cuda() as on the torchao Linear: the weight goes its own way (torchao's
        tensor keeps its quantized data), and the operands are taken from it again: a float cast must
        not reach the fp32 scales or the fp8 data."""
        out = super()._apply(fn, recurse)
        self._bind()
        return out

    @property
    def torchao_weight(self) -> Any:
        return self.weight

    def __setstate__(self, state: dict[str, Any]) -> None:
        params = state.get("_parameters", {})
        if "torchao_weight" in params:  # pickled before the weight kept its name
            params["weight"] = params.pop("torchao_weight")
        super().__setstate__(state)

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
        elif self.scale == "tensor":  # (no rows: a scale of 1, amax of nothing is an error)
            amax = xf.abs().amax() if xf.numel() else xf.new_ones(())
            s = (amax.clamp_min(1e-12) / qmax).reshape(1)
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
            return torch.nn.functional.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()
        if self.dt == "int8" and x.dtype is not self.__dict__.get("_out_dtype"):
            self.__dict__["_out_dtype"] = x.dtype  # what signature() keys: the op's output dtype
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
        """The key of this layer's op calls: int8 writes the activation's dtype (the last call's;
        the weight's before any call), fp8 bf16."""
        from tunedb import families

        fam = families.get(self.family)
        dtype = self.__dict__.get("_out_dtype", self.weight.dtype)
        out = "bf16" if self.dt == "fp8" else {torch.float16: "fp16"}.get(dtype, "bf16")
        return fam.make_signature("scaled_mm", self.out_features, self.in_features, out, self.scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self.family} scale={self.scale}, bias={self.bias is not None}")
