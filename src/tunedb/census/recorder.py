"""The GEMM shape recorder: a TorchDispatchMode that counts every aten matrix product a model runs.

Why the dispatch level and not ``__torch_function__``: F.linear, torch.matmul and nn.Linear are
CompositeImplicit ops that reach the dispatcher as aten.mm / aten.addmm / aten.bmm, and so do the
GEMMs that C++ runs on the model's behalf (nn.MultiheadAttention's packed projections, the
native fast paths), the LM head, and einsum. A function mode would see only the Python calls.
The dispatch level works the same on meta tensors (a census of an 8B model allocates nothing)
and on a real device.

What the dispatcher loses is *which operand is a weight*; the recorder restores it: a tensor is
weight-like when it is an nn.Parameter, or was produced from a weight-like tensor by a view (t,
transpose, split, expand, ...) or a copy-like op (a dtype cast under autocast, clone, detach).
Recorded keys (the gemm family's signature format):

- mm/addmm with a weight-like second operand: ``gemm|op=gemm|dt=..|N=<out>|K=<in>``, M = rows;
  bmm/baddbmm with an expanded weight as second operand: op=gemm with M = batch * rows.
- aten._addmm_activation (a linear with its activation fused, e.g. torch's own fused paths): the one
  place the recorder sees an activation: ``gemm|op=gemm_act|dt=..|N=..|K=..|act=relu/gelu_tanh|bias=1``.
- every other product (attention scores, attention @ V): ``gemm|op=bmm|dt=..|B=..|N=..|K=..``,
  M = rows, B = batch (1 for mm). Visible in the census, skipped by the build.

dt is ``half`` for fp16 and bf16 (one key serves both), ``fp32``, ``int8`` or ``fp8``.
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunedb.records import Signature
from tunedb.runtime.launch_table import inside_recorded_call

aten = torch.ops.aten

_GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._addmm_activation}
# Ops whose single tensor output is a copy of their first input: a weight stays a weight.
_COPIES = {aten._to_copy, aten.clone, aten.detach, aten.alias, aten.lift_fresh, aten._conj}


def dt_of(dtype: torch.dtype) -> str | None:
    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    if dtype == torch.float32:
        return "fp32"
    if dtype == torch.int8:
        return "int8"
    if "float8" in str(dtype):
        return "fp8"
    return None


_VIEWS: dict[Any, bool] = {}


def _is_view(func: Any) -> bool:
    """Whether an aten overload returns an alias of an input (cached: schemas never change)."""
    known = _VIEWS.get(func)
    if known is None:
        known = _VIEWS[func] = any(r.alias_info is not None and not r.alias_info.is_write
                                   for r in func._schema.returns)
    return known


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    return []


class GemmRecorder(TorchDispatchMode):
    """Counts (Signature, M) of every GEMM dispatched while active: ``with GemmRecorder() as rec:``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[Signature, int]] = Counter()
        self._weights: dict[int, weakref.ref] = {}

    def is_weight(self, t: Any) -> bool:
        if isinstance(t, torch.nn.Parameter):
            return True
        ref = self._weights.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, outputs: Any) -> None:
        for t in _tensors(outputs):
            self._weights[id(t)] = weakref.ref(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if packet in _GEMMS:
            if not inside_recorded_call():  # a tuned op's own fallback: recorded as that op
                self._record(packet, args, kwargs)
        elif args and self.is_weight(args[0]) and (packet in _COPIES or _is_view(func)):
            self._mark(out)
        return out

    def _record(self, packet: Any, args: tuple, kwargs: dict) -> None:
        biased = packet in (aten.addmm, aten.baddbmm, aten._addmm_activation)
        a, b = (args[1], args[2]) if biased else (args[0], args[1])
        dt = dt_of(a.dtype)
        if dt is None:
            return
        if a.dim() == 2:
            rows, k = a.shape
            batch, n = 1, b.shape[-1]
        else:
            batch, rows, k = a.shape
            n = b.shape[-1]
        rows, k, n, batch = int(rows), int(k), int(n), int(batch)
        if rows < 1 or n < 1 or k < 1 or batch < 1:
            return
        if packet is aten._addmm_activation and self.is_weight(b):
            use_gelu = args[5] if len(args) > 5 else kwargs.get("use_gelu", False)
            sig = Signature.make("gemm", "gemm_act", dt, N=n, K=k, act="gelu_tanh" if use_gelu else "relu", bias=1)
            self.calls[(sig, rows)] += 1
        elif self.is_weight(b) and (b.dim() == 2 or b.shape[0] == 1 or b.stride(0) == 0):
            # One weight shared by the batch (a Linear on 3-D input lowers to a bmm of an
            # expanded weight); a stack of distinct weights (MoE experts) is batch separate GEMMs.
            sig = Signature.make("gemm", "gemm", dt, N=n, K=k)
            self.calls[(sig, rows * batch)] += 1
        else:
            sig = Signature.make("gemm", "bmm", dt, B=batch, N=n, K=k)
            self.calls[(sig, rows)] += 1


def record(fn: Callable[[], Any]) -> Counter[tuple[Signature, int]]:
    """Run fn() under the recorder and no_grad; the (Signature, M) -> calls it dispatched."""
    with torch.no_grad(), GemmRecorder() as rec:
        fn()
    return rec.calls
