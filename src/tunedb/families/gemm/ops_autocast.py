"""The tuned GEMM ops under torch.autocast: they compute what F.linear (+ activation) computes there.

Under autocast, `nn.Linear` casts its input, weight and bias to the autocast dtype (aten::linear's
Autocast kernel, whose cast cache keeps one copy of each weight per autocast region), so an fp32
model runs its GEMMs in bf16/fp16, and a bf16 activation may meet an fp32 weight. Without a rule of
their own the tuned ops saw those operands as given: mixed dtypes raised ValueError ("x dtype ...
differs from weight dtype") where the plain model ran, and an fp16 model under bf16 autocast
returned fp16 where the plain model returns bf16.

So the ops get an Autocast kernel per device (the PyTorch convention for custom ops): it calls
F.linear + activation with autocast still on, which applies autocast's own casts and cache --
exactly the plain model's call. The tuned kernels are not used under autocast: their weight
would be re-cast every call (autocast's cache belongs to aten::linear), which in a decode loop
costs more than the GEMM; cast the model to fp16/bf16 for tuned kernels. The eager entry points
(ops.gemm / ops.gemm_act) send a call made under autocast through the dispatcher, which reaches
this kernel; under torch.compile the trace sees the aten ops, as it would for the plain model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

# autocast's dispatch keys of the devices tunedb serves (CUDA) or runs a patched model on (CPU)
AUTOCAST_KEYS = ("AutocastCPU", "AutocastCUDA")


def register(lib: Any, acts: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> None:
    """Register both ops' Autocast kernels on `lib` (ops.py's Library); `acts` maps act names to
    the activation the torch arm applies."""

    def gemm(_keyset: Any, x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> torch.Tensor:
        return F.linear(x, weight)

    def gemm_act(_keyset: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 act: str, tiers: str = "") -> torch.Tensor:
        if act not in acts:  # the op's own error (ops._check), not a KeyError
            from tunedb.errors import SignatureError

            raise SignatureError(f"unknown activation act={act!r}; allowed: {', '.join(acts)}")
        return acts[act](F.linear(x, weight, bias))

    for key in AUTOCAST_KEYS:
        lib.impl("gemm", gemm, key, with_keyset=True)
        lib.impl("gemm_act", gemm_act, key, with_keyset=True)
