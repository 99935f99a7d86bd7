"""TunedLinear's forms outside its eager fast path (patching.py keeps the fast path itself):
`traced`, what a compiler's trace runs, `general`, the tail both paths end in (a tracer's proxy
or a nested tensor as nn.Linear, the activation module fused away on the CPU, else the tuned op),
and `eager_general`, the eager tail: operands the tuned op refuses get nn.Linear's own answer."""
from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from tunedb.errors import OperandMismatchError
from tunedb.families.gemm.arms import act_fn

# functions, not `module.function`: a module the trace reaches both through this file's globals and
# through its own functions' globals is an `a is b` guard run as Python at every compiled call
from tunedb.families.gemm.fused_pair import fused_traced
from tunedb.families.gemm.ops import _Tensor, gemm, gemm_act
from tunedb.families.gemm.siblings_compile import _may_group as may_group
from tunedb.families.gemm.siblings_compile import member_call
from tunedb.runtime import launch_table


def traced(layer: Any, x: Any) -> Any:
    """TunedLinear.forward while a compiler traces, reading no more of the layer than it decides
    on (each read is a guard checked at every compiled call): the fused pair's state once
    (fused_pair.intact_kind), the sibling group's traced form (one launch in compiled graphs),
    nn.Linear's own form for a member left as written (the group's eager launch is host state
    Dynamo would break its graph on: session 46), else `general`, whose tuned op the compiler
    keeps opaque or decomposes (ops_compile.py)."""
    weight, bias = layer.weight, layer.bias  # as nn.Linear reads them (Dynamo's own guards on parameters)
    d = layer.__dict__
    act = layer.act
    pair = d.get("_tunedb_fused") if act != "none" else None
    if pair is not None and not fused_traced(pair.kind):
        return F.linear(x, weight, bias)  # surgery after optimize(): the activation's slot applies it
    # the group only where a trace may keep it (a trace constant, no guard): the membership test
    # itself made two guards a member (the tuple's type and length) at every compiled call
    if may_group() and "_siblings" in d:
        y = member_call(layer, x)
        if y is not None:
            return y
    if "_as_written" in d:
        return F.linear(x, weight, bias)
    return general(layer, x, weight, bias, act)


def eager_general(layer: Any, x: Any, weight: Any, bias: Any, act: str) -> Any:
    """`general` for an eager call. Operands the tuned op refuses (a K, dtype or device that does
    not fit, a 0-d x, a bias torch broadcasts) run as nn.Linear then the activation: torch's own
    error, word for word, for what torch refuses too (a caller matching nn.Linear's message), and
    torch's result for what it takes."""
    try:
        return general(layer, x, weight, bias, act)
    except OperandMismatchError:
        y = F.linear(x, weight, bias)  # raises torch's error where torch refuses the operands too
        act_module = layer.__dict__.get("_act_module")  # the model's own, as the CPU path applies it
        if act_module is not None:
            return act_module(y)
        return _activation(layer, act, y)


def _activation(layer: Any, act: str, y: Any) -> Any:
    act_module = layer.__dict__.get("_act_module")  # absent in a TunedLinear pickled before it existed
    # the module's forward, not its __call__: symbolic_trace would record a call of a module
    # that is not installed as a submodule
    fn = act_module.forward if act_module is not None else act_fn(act)
    return y if fn is None else fn(y)


def general(layer: Any, x: Any, weight: Any, bias: Any, act: str) -> Any:
    """The layer's output where no memo or fast path served it: torch.fx's Proxy (symbolic_trace
    records nn.Linear's own form, which FX passes know), a nested tensor or a non-tensor (nn.Linear's
    own error) as nn.Linear then the activation; on the CPU the activation module the model wrote
    (transformers' NewGELUActivation rounds apart from F.gelu in bf16) unless a census records;
    else the tuned op."""
    if not isinstance(x, _Tensor) or x.is_nested:
        return _activation(layer, act, F.linear(x, weight, bias))
    # x.is_cpu, not x.device.type: the device property builds a torch.device object per call
    if x.is_cpu and not launch_table.recording_active():
        act_module = layer.__dict__.get("_act_module")
        if act_module is not None:
            return act_module(F.linear(x, weight, bias))
    if bias is None and act == "none":
        return gemm(x, weight)
    return gemm_act(x, weight, bias, act)
