"""What the census can see of gemm_log_softmax, and optimize()'s swap.

The dispatch-level recorder (census/recorder.py) cannot see this op: the dispatcher shows an
aten addmm (the linear) and an aten _log_softmax, with nothing tying one's output to the other's
input (the recorder never sees outputs of ops without rules). So the family has no aten census
rule; instead:

- `record(fn)`: a TorchFunctionMode over fn() that remembers the outputs of F.linear (nn.Linear)
  and counts a `gemm_log_softmax` key when one of them is the input of log_softmax over its last
  dimension (F.log_softmax, torch.log_softmax, Tensor.log_softmax, nn.LogSoftmax). Works on meta
  tensors. It misses heads written as `x @ W.T + b`, a linear whose output is touched (scaled,
  cast) before the log_softmax, and log_softmax with an implicit dim; one asked for another dtype
  (dtype=torch.float32: fp32 log-probabilities, not the op's x-dtype output) is not counted.
- `find_heads(model)`: the module pattern optimize() swaps: an nn.Sequential holding an nn.Linear
  (or the gemm family's TunedLinear without activation) immediately followed by
  nn.LogSoftmax(dim=-1) (a model's `ctc_head`, say). A head whose forward calls log_softmax in
  code is counted by record() but not swapped: its module must call
  `tunedb.families.gemm_log_softmax.ops.gemm_log_softmax` itself.
"""
from __future__ import annotations

import weakref
from collections import Counter
from typing import Any, Callable, Iterator

from tunedb.records import Point, ShapeSet, Signature


def _log_softmax_funcs() -> set[Any]:
    import torch

    return {torch.nn.functional.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
            torch.special.log_softmax}


def _dim_arg(args: tuple, kwargs: dict) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("dim")


def record(fn: Callable[[], Any]) -> Counter[tuple[Signature, int]]:
    """Run fn() under no_grad; (Signature, M) -> calls of every linear -> log_softmax pair."""
    import torch
    from torch.overrides import TorchFunctionMode

    from tunedb.errors import SignatureError
    from tunedb.families.gemm_log_softmax.keys import signature_of

    lsm = _log_softmax_funcs()
    linear = torch.nn.functional.linear

    class _Mode(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: Counter[tuple[Signature, int]] = Counter()
            self.logits: dict[int, tuple[weakref.ref, Signature, int]] = {}

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is linear:
                x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
                b = args[2] if len(args) > 2 else kwargs.get("bias")
                try:
                    key = signature_of("gemm_log_softmax", x, w, b)
                except SignatureError:  # fp32 heads and odd shapes are not served
                    key = None
                if key is not None and isinstance(out, torch.Tensor):
                    self.logits[id(out)] = (weakref.ref(out), *key)
            elif func in lsm and args and isinstance(args[0], torch.Tensor):
                seen = self.logits.get(id(args[0]))
                dim = _dim_arg(args, kwargs)
                cast = args[2] if len(args) > 2 else kwargs.get("dtype")  # log_softmax(.., dtype=fp32): not the op's form
                if seen is not None and seen[0]() is args[0] and dim is not None \
                        and dim in (-1, args[0].dim() - 1) and cast in (None, args[0].dtype):
                    self.calls[(seen[1], seen[2])] += 1
            return out

    with torch.no_grad(), _Mode() as mode:
        fn()
    return mode.calls


def to_shapeset(calls: Counter[tuple[Signature, int]], workload: str = "gemm_log_softmax") -> ShapeSet:
    """A census (points weighted by their share of calls) for `tunedb build --census`."""
    total = sum(calls.values()) or 1
    return ShapeSet(tuple(Point(sig, m, weight=c / total, calls=c, must_tune=True)
                          for (sig, m), c in sorted(calls.items())), workload=workload)


def _is_plain_linear(mod: Any) -> bool:
    """nn.Linear, or the gemm family's swap of one without an activation (optimize() runs the
    families in registry order: gemm's TunedLinear may already stand where the Linear was)."""
    import torch

    if type(mod) is torch.nn.Linear:
        return True
    return type(mod).__name__ == "TunedLinear" and getattr(mod, "act", None) == "none" \
        and getattr(getattr(mod, "weight", None), "dim", lambda: 0)() == 2


def find_heads(model: Any) -> Iterator[tuple[str, int]]:
    """(qualified name of an nn.Sequential, index of its linear layer) for every nn.Linear (or
    gemm's TunedLinear without activation) followed by nn.LogSoftmax over the last dimension,
    neither watched by a user's hook (the fused module produces neither's own output)."""
    import torch

    from tunedb.families.gemm.fusion_source import called_whole
    from tunedb.families.module_rules import holders, hooked

    whole = called_whole(model)
    held = holders(model)  # a Linear shared with another path stays
    for name, mod in model.named_modules():
        # the exact class, called whole: a subclass's forward, or code calling `self.head[0](x)`,
        # would get log-probabilities where it wanted logits (the gemm rule's, fusion_source.py)
        if type(mod) is not torch.nn.Sequential or id(mod) not in whole:
            continue
        items = list(mod)
        for i in range(len(items) - 1):
            lin, lsm = items[i], items[i + 1]
            if _is_plain_linear(lin) and type(lsm) is torch.nn.LogSoftmax and lsm.dim == -1 \
                    and not (hooked(lin) or hooked(lsm)) and held.get(id(lin)) == 1 and held.get(id(lsm)) == 1:
                yield name, i


def fused_head_class() -> type:
    """TunedLinearLogSoftmax (families/gemm_log_softmax/module.py, which imports torch)."""
    from tunedb.families.gemm_log_softmax.module import TunedLinearLogSoftmax

    return TunedLinearLogSoftmax


def optimize(model: Any) -> Any:
    """Swap every find_heads() pair in place: the Linear becomes one fused module, the
    LogSoftmax's slot an nn.Identity (gemm's fused_pair.FusedActivation, holding the LogSoftmax:
    indices and state_dict keys of the Linear are kept). As a GEMM + activation pair (session 41):
    module surgery after optimize() (a new Linear or module in either slot, the LogSoftmax
    swapped or hooked where a walk of named_modules() finds it) unfuses the head, the Linear then
    giving its logits and the slot applying its module."""
    from tunedb.families.gemm import fused_pair
    from tunedb.runtime import report

    cls = fused_head_class()
    for name, i in list(find_heads(model)):
        seq = model.get_submodule(name) if name else model
        lin_attr, lsm_attr = list(seq._modules)[i:i + 2]
        head = cls(seq[i])
        report.drop_left(seq[i])  # the GEMM family may have left this Linear as written: served now
        report.drop_left(head)
        seq._modules[lsm_attr] = fused_pair.record(seq, lin_attr, lsm_attr, head, seq[i + 1])
        seq._modules[lin_attr] = head
    return model
