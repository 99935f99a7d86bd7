"""Which GEMM-making modules optimize() leaves to torch, and why (the report's "seen, not
patched" line; census_rules keys the same calls UNPATCHED, so neither a plan nor a build claims
a gain for them): a Linear with hooks or more state than weight and bias, a tensor-subclass
weight, nn.MultiheadAttention's packed in-projection, a Conv1D [in, out] weight, and the
feed-forward of an nn.TransformerEncoderLayer whose inference takes torch's fused fast path.
"""
from __future__ import annotations

import torch
from torch import nn

from tunedb.families.module_rules import hooked as _hooked

LINEAR_ATTRS = frozenset(vars(nn.Linear(1, 1, device="meta")))  # what every nn.Linear holds
# TunedLinear's own attributes beside nn.Linear's: a Linear whose user set one of these names keeps
# it only unswapped (the swap overwrote the value, and writing it back broke the forward)
TUNED_ATTRS = frozenset({"act", "approximate"})


def carried(value: object) -> bool:
    """Whether a plain attribute a user (or a library: transformers' _is_hf_initialized) set on a
    Linear is one the TunedLinear replacing it copies: a value, not a tensor, module or callable."""
    return not isinstance(value, (nn.Module, torch.Tensor)) and not callable(value)


def kept(linear: nn.Module) -> bool:
    """A Linear optimize() leaves as it is: one a user's hooks watch (they must keep firing; a
    forward set on the instance counts), or one carrying more state than weight and bias (a
    buffer, another parameter, a child module, an attribute holding a tensor or a callable that
    its forward's callers may read), which a TunedLinear would drop from the model and its
    state_dict, or an attribute of a name the TunedLinear itself holds (TUNED_ATTRS)."""
    return (_hooked(linear) or bool(linear._buffers) or bool(linear._modules)
            or any(name not in ("weight", "bias") for name in linear._parameters)
            or any(name not in LINEAR_ATTRS and (name in TUNED_ATTRS or not carried(value))
                   for name, value in vars(linear).items()))


def subclass_weight(linear: nn.Module) -> bool:
    """A weight that is a tensor subclass (a torchao quantized tensor, say) is not a dense GEMM
    operand: the Linear is left to the family that serves it (scaled_mm for torchao W8A8)."""
    w = linear.weight
    return isinstance(w, torch.Tensor) and type(w) not in (torch.Tensor, nn.Parameter)


# Why a GEMM-making module is not swapped, as the report words it (census_rules.UNPATCHED keys
# the same calls in a census, so neither the plan nor a build claims a gain for them).
UNPATCHED_KINDS = {
    "conv1d": "Conv1D with an [in, out] weight (the kernels read [out, in]: a copy per call)",
    "in_proj": "nn.MultiheadAttention packed in-projection (torch's attention reads the weight itself)",
    "encoder": "nn.TransformerEncoderLayer feed-forward (torch's fused encoder fast path reads the weights itself)",
    "hooked": "hooked nn.Linear, or one with more state than weight and bias (kept as it is)",
    "subclass": "nn.Linear subclass or tensor-subclass weight",
}


ENCODER_FF = ("linear1", "linear2")


def encoder_fast_path(module: nn.Module) -> bool:
    """An nn.TransformerEncoderLayer whose inference calls take torch's fused fast path
    (torch._transformer_encoder_layer_fwd: batch_first, a ReLU/GELU feed-forward, its own
    forward): its feed-forward Linears are never called there, so swapping them serves nothing
    and the census would count them (its recorder turns the fast path off)."""
    return (isinstance(module, nn.TransformerEncoderLayer)
            and type(module).forward is nn.TransformerEncoderLayer.forward
            and bool(getattr(getattr(module, "self_attn", None), "batch_first", False))
            and bool(getattr(module, "activation_relu_or_gelu", False)))


def unpatched_modules(model: nn.Module) -> dict[str, int]:
    """kind -> how many modules of `model` make GEMMs that optimize() leaves to torch (see
    UNPATCHED_KINDS). F.linear calls in a forward have no module: the census keys them."""
    counts: dict[str, int] = {}
    inside_mha = {id(m.out_proj) for m in model.modules()
                  if isinstance(m, nn.MultiheadAttention) and isinstance(getattr(m, "out_proj", None), nn.Module)}
    in_fast = {id(getattr(m, a)) for m in model.modules() if encoder_fast_path(m) for a in ENCODER_FF
               if isinstance(getattr(m, a, None), nn.Linear)}
    for m in model.modules():
        kind = None
        if isinstance(m, nn.MultiheadAttention):
            kind = "in_proj"
        elif id(m) in in_fast and type(m) is nn.Linear:
            kind = "encoder"
        elif type(m).__name__ == "Conv1D" and getattr(getattr(m, "weight", None), "dim", lambda: 0)() == 2:
            kind = "conv1d"
        elif isinstance(m, nn.Linear) and id(m) not in inside_mha:
            if type(m) is not nn.Linear or subclass_weight(m):
                kind = "subclass"
            elif kept(m):
                kind = "hooked"
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    return counts
