"""The census recorder: a TorchDispatchMode that counts every aten call some kernel family's census
rules map to a signature (families.contract.CensusRule; GEMM's are families/gemm/census_rules.py).

Why the dispatch level and not ``__torch_function__``: F.linear, torch.matmul and nn.Linear are
CompositeImplicit ops that reach the dispatcher as aten.mm / aten.addmm / aten.bmm, and so do the
GEMMs that C++ runs on the model's behalf (nn.MultiheadAttention's packed projections, the
native fast paths), the LM head, and einsum. A function mode would see only the Python calls.
The dispatch level works the same on meta tensors (a census of an 8B model allocates nothing)
and on a real device.

What the dispatcher loses is *which operand is a weight*; the recorder restores it for every
family's rules: a tensor is weight-like when it is an nn.Parameter, or was produced from a
weight-like tensor by a view (t, transpose, split, expand, ...) or a copy-like op (a dtype cast
under autocast, clone, detach). The rules come from the registry when recording starts.
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tunedb import families
from tunedb.families.contract import CensusRule, hook
from tunedb.records import Signature
from tunedb.runtime.launch_table import inside_recorded_call, recorded_call

aten = torch.ops.aten

# Ops whose single tensor output is a copy of their first input: a weight stays a weight.
_COPIES = {aten._to_copy, aten.clone, aten.detach, aten.alias, aten.lift_fresh, aten._conj}


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


def census_rules(names: tuple[str, ...] | None = None) -> dict[Any, list[CensusRule]]:
    """aten overload packet -> the census rules of every registered family (or of `names`) for it."""
    out: dict[Any, list[CensusRule]] = {}
    for name in names if names is not None else families.names():
        for rule in hook(families.get(name), "census_rules")():
            for op in rule.aten:
                packet = getattr(aten, op, None)
                if packet is not None:
                    out.setdefault(packet, []).append(rule)
    return out


class _FusedCalls(TorchFunctionMode):
    """Calls that run as fused kernels on a GPU are not recorded as the products torch decomposes
    them into elsewhere; they are skipped as a tuned op's own fallback is (recorded_call):

    - F.scaled_dot_product_attention: one kernel on a GPU (flash, memory-efficient, cuDNN); on
      meta tensors, the census's default device, torch runs its math path instead, two bmm per
      call upcast to fp32 for half inputs, so a transformers model (SDPA is its default
      attention) got fp32 bmm keys for every sequence length that no GPU run makes. Where a GPU
      does take the math path, its products are issued from C++, out of the bmm family's reach.
    - nn.LSTM / nn.GRU / nn.RNN (torch._VF): cuDNN on a GPU; on meta and CPU one addmm per time
      step and layer, which the GEMM rules counted as linear layers of the recurrent weights
      (thousands of calls at M = batch that tunedb never serves). The rnn family keys these
      modules itself (families/rnn/census.py). On meta the call runs one time step and returns
      outputs of the full length: the meta decomposition costs milliseconds per step, so a
      census of a two-layer bidirectional LSTM took minutes at the synthetic token lengths.
    """

    def __init__(self, recorder: Any = None) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _MHA and self.recorder is not None:
            # nn.MultiheadAttention's attention is SDPA called inside this function, where this
            # mode no longer sees calls (a mode is off inside its own handler): its meta math
            # path's fp32 products were recorded as bmm keys, one per sequence length. With
            # need_weights=True it runs torch.bmm, which the bmm family's product mode (a
            # function mode too) never reaches in there either. So no bmm key is recorded
            # inside; its projections (mm/addmm) are, by the GEMM rule.
            self.recorder.in_attention += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.recorder.in_attention -= 1
        if func is _SDPA:
            with recorded_call():
                return func(*args, **kwargs)
        if func in _RECURRENT:
            with recorded_call():
                return _recurrent(func, args, kwargs)
        return func(*args, **kwargs)


_SDPA = torch.nn.functional.scaled_dot_product_attention
_MHA = torch.nn.functional.multi_head_attention_forward
_RECURRENT = (torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu)


def _recurrent(func: Any, args: tuple, kwargs: dict) -> Any:
    """func(*args) for a torch._VF recurrent call; on meta, of a padded (not packed) input, run at
    one time step with the outputs widened to the input's length (states have no time axis)."""
    x = args[0] if args else None
    # padded: (input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first)
    padded = len(args) == 9 and isinstance(args[3], bool) and not kwargs
    if not (padded and isinstance(x, torch.Tensor) and x.device.type == "meta" and x.dim() in (2, 3)):
        return func(*args, **kwargs)
    time = 1 if (args[8] and x.dim() == 3) else 0
    if x.shape[time] <= 1:
        return func(*args, **kwargs)
    out, *states = func(x.narrow(time, 0, 1), *args[1:])
    shape = list(out.shape)
    shape[time] = x.shape[time]
    return (out.new_empty(shape), *states)


class Recorder(TorchDispatchMode):
    """Counts (Signature, size) of every call a family's census rule maps while active:
    ``with Recorder() as rec:``; `families` limits the rules to those families."""

    def __init__(self, families: tuple[str, ...] | None = None, patched: bool = False) -> None:
        super().__init__()
        # the model ran as tunedb.optimize() patched it: a rule may key the calls the patch left
        # (GEMM: products outside a TunedLinear are seen, not served; census_rules.UNPATCHED)
        self.patched = patched
        self.in_attention = 0  # inside nn.MultiheadAttention's fused attention (_FusedCalls)
        self.calls: Counter[tuple[Signature, int]] = Counter()
        self._weights: dict[int, weakref.ref] = {}
        self._rules = census_rules(families)

    def __enter__(self) -> "Recorder":
        self._fused = _FusedCalls(self)
        self._fused.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._fused.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self._fused.__exit__(*exc)

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
        packet = func.overloadpacket
        rules = self._rules.get(packet)
        # an in-place op's shapes are read before it runs (they do not change, but its inputs do)
        if rules and not inside_recorded_call():  # a tuned op's own fallback: recorded as that op
            for rule in rules:
                for sig, size in rule.record(self, packet, args, kwargs):
                    self.calls[(sig, size)] += 1
        out = func(*args, **kwargs)
        if not rules and args and self.is_weight(args[0]) and (packet in _COPIES or _is_view(func)):
            self._mark(out)
        return out


def record(fn: Callable[[], Any], patched: bool = False) -> Counter[tuple[Signature, int]]:
    """Run fn() under the recorder and no_grad; the (Signature, size) -> calls it dispatched.
    patched: fn runs the model tunedb.optimize() patched (Recorder.patched)."""
    with torch.no_grad(), Recorder(patched=patched) as rec:
        fn()
    return rec.calls
