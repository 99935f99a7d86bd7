"""What the census sees of recurrent layers, and optimize()'s swap.

The dispatch-level recorder cannot key nn.LSTM / nn.GRU: aten::lstm and aten::gru are
CompositeImplicit ops, decomposed before a dispatch mode sees them (into _cudnn_rnn on a GPU,
and into per-step addmm calls on meta tensors, which the GEMM family's rules would count as
linear layers). So `record(fn)` keys the modules instead: a global forward pre-hook sees every
nn.LSTM / nn.GRU call with its input and reads the key from the module's attributes (on meta
tensors too). It misses functional calls (torch._VF.lstm, nn.LSTMCell loops) and
PackedSequence inputs (their batch changes per step; not served).

`optimize(model)` swaps every nn.LSTM / nn.GRU to TunedLSTM / TunedGRU, which ask the selector which arm
serves the call's key and runs the original module under that arm's flags (cuDNN, its weights
flattened into one buffer once, bf16 included: weights.py; or cuDNN off),
or the Triton persistent kernel on the module's own weights (returning output and states as
nn.LSTM does); state_dict keys stay the module's own (under `.rnn`).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from tunedb.families.rnn.configs import FAMILY, module_signature
from tunedb.records import Signature


def record(fn: Callable[[], Any]) -> Counter[tuple[Signature, int]]:
    """Run fn() under no_grad; (Signature, T) -> calls of every served nn.LSTM / nn.GRU call."""
    import torch

    calls: Counter[tuple[Signature, int]] = Counter()

    def hook(module: Any, args: tuple) -> None:
        if isinstance(module, (torch.nn.LSTM, torch.nn.GRU)) and args:
            key = module_signature(module, args[0])
            if key is not None:
                calls[key] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            fn()
    finally:
        handle.remove()
    return calls


SERVED_DEVICE = "cuda"  # where TunedLSTM / TunedGRU ask the selector (elsewhere the module runs as it is)


def _kernel_may_serve(rnn: Any, x: Any, hx: Any) -> bool:
    """The persistent kernel computes this call as the module would: no gradient wanted (it has
    no backward: a training step would leave the weights without gradient), no inter-layer
    dropout in training mode (it applies none) and no autocast cast (the module's call would be
    cast; a model already in autocast's dtype is not)."""
    from tunedb.runtime import autocast_rule, grad_form

    states = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
    if (rnn.training and rnn.dropout > 0 and rnn.num_layers > 1) \
            or autocast_rule.casts(x.device.type, x, *states, *rnn._flat_weights):
        return False
    return not grad_form.wants_grad((x, *states, *rnn._flat_weights))


def tuned_classes() -> dict[type, type]:
    """nn.LSTM -> TunedLSTM, nn.GRU -> TunedGRU (families/rnn/module.py, which imports torch)."""
    from tunedb.families.rnn.module import TUNED

    return TUNED


def optimize(model: Any) -> Any:
    """Swap the class of every nn.LSTM / nn.GRU in the model (a bare one too) to its tuned class,
    in place; the model is returned. Only the exact torch classes: a user's subclass may override
    forward, which the swap would drop. A hooked module stays: the persistent kernel runs without
    calling it, so its hooks would not fire."""
    from tunedb.families.module_rules import hooked

    tuned = tuned_classes()
    for module in list(model.modules()):
        if type(module) in tuned and not hooked(module):
            module.__class__ = tuned[type(module)]
    return model
