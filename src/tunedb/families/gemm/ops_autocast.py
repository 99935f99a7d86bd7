"""The tuned GEMM ops under torch.autocast: they compute what F.linear (+ activation) computes there.

Under autocast, `nn.Linear` casts its input, weight and bias to the autocast dtype (aten::linear's
Autocast kernel, whose cast cache keeps one copy of each weight per autocast region), so an fp32
model runs its GEMMs in bf16/fp16, and a bf16 activation may meet an fp32 weight. Without a rule of
their own the tuned ops saw those operands as given: mixed dtypes raised ValueError ("x dtype ...
differs from weight dtype") where the plain model ran, and an fp16 model under bf16 autocast
returned fp16 where the plain model returns bf16.

So the ops get an Autocast kernel per device (the PyTorch convention for custom ops): it calls
F.linear + activation with autocast still on, which applies autocast's own casts and cache --
exactly the plain model's call. Where autocast would cast nothing (x, weight and bias already in
its dtype: a bf16 model under bf16 autocast) the kernel steps aside and the tuned op runs below
it, so turning autocast on does not turn tunedb off for a model already cast. Otherwise the tuned
kernels are not used under autocast: their weight would be re-cast every call (autocast's cache
belongs to aten::linear), which in a decode loop costs more than the GEMM; cast the model to
fp16/bf16 for tuned kernels. The eager entry points
(ops.gemm / ops.gemm_act) send a call made under autocast through the dispatcher, which reaches
this kernel; under torch.compile the trace sees the aten ops, as it would for the plain model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from tunedb.runtime.autocast_rule import casts

# autocast's dispatch keys of the devices tunedb serves (CUDA) or runs a patched model on (CPU),
# with the device type whose autocast dtype each applies
AUTOCAST_KEYS = {"AutocastCPU": "cpu", "AutocastCUDA": "cuda"}


def off_for(x: torch.Tensor) -> bool:
    """Autocast is on, but for no device x is on (a meta census of a model whose forward enters
    torch.autocast: no Autocast kernel applies to meta tensors). The census recorder's entry
    points then serve the call eagerly: through the dispatcher it reached the recorder's own
    handler, where an fp32 call's F.linear ran unseen, so `tunedb tune` (a fused census) lost
    the GEMMs the aten-level census keys (session 41's CLI audit)."""
    device_type = x.device.type
    return device_type not in AUTOCAST_KEYS.values() or not torch.is_autocast_enabled(device_type)


def register(lib: Any, acts: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> None:
    """Register both ops' Autocast kernels on `lib` (ops.py's Library); `acts` maps act names to
    the activation the torch arm applies."""

    for key, device_type in AUTOCAST_KEYS.items():
        below = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
        lib.impl("gemm", _gemm_kernel(device_type, below), key, with_keyset=True)
        lib.impl("gemm_act", _gemm_act_kernel(device_type, below, acts), key, with_keyset=True)


def _gemm_kernel(device_type: str, below: Any) -> Callable[..., torch.Tensor]:
    def gemm(_keyset: Any, x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> torch.Tensor:
        if not casts(device_type, x, weight):
            with torch._C._ExcludeDispatchKeyGuard(below):
                return torch.ops.tunedb.gemm.default(x, weight, tiers)
        return F.linear(x, weight)

    return gemm


def _gemm_act_kernel(device_type: str, below: Any,
                     acts: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> Callable[..., torch.Tensor]:
    def gemm_act(_keyset: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 act: str, tiers: str = "") -> torch.Tensor:
        if act not in acts:  # the op's own error (ops._check), not a KeyError
            from tunedb.errors import SignatureError

            raise SignatureError(f"unknown activation act={act!r}; allowed: {', '.join(acts)}")
        if not casts(device_type, x, weight, bias):
            with torch._C._ExcludeDispatchKeyGuard(below):
                return torch.ops.tunedb.gemm_act.default(x, weight, bias, act, tiers)
        return acts[act](F.linear(x, weight, bias))

    return gemm_act
