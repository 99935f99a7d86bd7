"""optimize() for the conv family: nn.Conv1d / nn.Conv2d modules call tunedb::conv1d / conv2d.

A served module (zeros padding, numeric padding, not transposed) changes class in place to
TunedConv1d / TunedConv2d: the parameters, hooks and state dict stay as they are. Inside an
nn.Sequential, a Conv2d followed by nn.ReLU (or nn.SiLU) becomes one call with the activation
fused (the Conformer's Conv2dSubsampling: conv2d(3x3, stride 2) + ReLU, twice) and the
activation module becomes nn.Identity. The op itself runs plain torch on CPU / fp32 inputs, so a
patched model stays correct anywhere.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

PATCH_RULES = ("nn.Conv1d -> TunedConv1d (tunedb::conv1d)",
               "nn.Conv2d -> TunedConv2d (tunedb::conv2d)",
               "nn.Sequential(Conv2d, ReLU|SiLU) -> TunedConv2d(act=relu|silu), Identity")


class TunedConv1d(nn.Conv1d):
    tunedb_act = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from tunedb.families.conv import ops

        return ops.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                          self.tunedb_act)


class TunedConv2d(nn.Conv2d):
    tunedb_act = "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from tunedb.families.conv import ops

        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                          self.tunedb_act)


_TUNED = {nn.Conv1d: TunedConv1d, nn.Conv2d: TunedConv2d}
_ACTS = {nn.ReLU: "relu", nn.SiLU: "silu"}


def served(module: Any) -> bool:
    return (type(module) in _TUNED and module.padding_mode == "zeros" and not isinstance(module.padding, str)
            and not module.transposed)


def optimize(model: Any, approximate: bool = False) -> Any:
    """The model with its served convolutions swapped (in place); returns it."""
    from tunedb.families.conv import ops  # noqa: F401 -- registers the ops

    for parent in list(model.modules()):
        if isinstance(parent, nn.Sequential):
            names = list(parent._modules)
            for here, after in zip(names, names[1:]):
                conv, act = parent._modules[here], parent._modules[after]
                if type(conv) is nn.Conv2d and served(conv) and type(act) in _ACTS:
                    conv.__class__ = TunedConv2d
                    conv.tunedb_act = _ACTS[type(act)]
                    parent._modules[after] = nn.Identity()
    for module in list(model.modules()):
        if served(module):
            module.__class__ = _TUNED[type(module)]
    return model
