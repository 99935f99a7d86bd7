"""A Linear and the activation optimize() fused into it, and the module left in the activation's
slot: the pair runs fused only while both still sit in the slots they were found in and nothing
watches either (module surgery after optimize(): a LoRA or quantization wrapper set in the
Linear's slot, a new activation set in its own, a hook added on either). Otherwise the Linear
runs as nn.Linear and the slot's module applies the activation the model wrote, so every module
gives what it gave before optimize(). The conv family's _Fusion (families/conv/patching.py)
holds the same rule for conv, norm and activation."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

# torch's process-wide hooks (register_module_forward_hook): dicts mutated in place, bound once
_GLOBAL = tuple(getattr(_nn_module, name, {}) for name in (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
    "_global_backward_pre_hooks"))



class FusedPair:
    """Where optimize() fused `linear` (held as `parent.<lin_attr>`) with the activation module
    `act_module` (held as `parent.<act_attr>`, replaced there by `blank`). A reference kept in
    both modules' __dict__, not a submodule: the module tree and state dict stay as they were."""

    def __init__(self, parent: nn.Module | None, lin_attr: str, act_attr: str, linear: nn.Module | None,
                 blank: nn.Module | None, act_module: Any) -> None:
        self.parent, self.lin_attr, self.act_attr = parent, lin_attr, act_attr
        self.linear, self.blank, self.act_module = linear, blank, act_module

    def intact(self) -> bool:
        # on every fused call's host path (0.2-0.3 us), so written out: no helper frames
        parent = self.parent
        if parent is None:
            return False
        slots = parent._modules
        linear, blank = self.linear, self.blank
        if slots.get(self.lin_attr) is not linear or slots.get(self.act_attr) is not blank:
            return False
        if (linear._forward_hooks or linear._forward_pre_hooks or linear._backward_hooks or linear._backward_pre_hooks
                or blank._forward_hooks or blank._forward_pre_hooks or blank._backward_hooks
                or blank._backward_pre_hooks):
            return False
        g0, g1, g2, g3 = _GLOBAL
        return not (g0 or g1 or g2 or g3)

    def __deepcopy__(self, memo: dict[int, Any]) -> "FusedPair":
        if id(self.parent) not in memo:  # one module copied alone: no slot holds the copy, unfused
            return FusedPair(None, self.lin_attr, self.act_attr, None, None, copy.deepcopy(self.act_module, memo))
        return FusedPair(memo[id(self.parent)], self.lin_attr, self.act_attr,
                         *(copy.deepcopy(m, memo) for m in (self.linear, self.blank, self.act_module)))


def pair_of(module: nn.Module) -> FusedPair | None:
    """The module's fusion, or None when it was never fused (a TunedLinear pickled before the
    fusion was recorded runs fused as it did then)."""
    return module.__dict__.get("_tunedb_fused")


class FusedActivation(nn.Identity):
    """The activation's slot after optimize() fused it into the Linear before it: passes its input
    through while the pair is intact, and runs the activation the model wrote (its child
    `activation`, which holds no state: the state dict is unchanged) once it is not."""

    def forward(self, input: Any) -> Any:
        pair = self.__dict__.get("_tunedb_fused")
        if pair is None or pair.intact():
            return input
        return self._modules["activation"](input)

    def __prepare_scriptable__(self) -> "FusedActivation":
        """torch.jit.script compiles _script_forward with the pair's state now (returns self:
        what this returns replaces the module in the eager model's slot)."""
        pair = self.__dict__.get("_tunedb_fused")
        self.__dict__["_script_apply"] = pair is not None and not pair.intact()
        return self


def _script_forward(self: Any, input: torch.Tensor) -> torch.Tensor:
    """FusedActivation.forward as torch.jit.script compiles it (inspect follows __wrapped__)."""
    if self._script_apply:
        return self.activation(input)
    return input


FusedActivation.forward.__wrapped__ = _script_forward  # type: ignore[attr-defined]


def record(parent: nn.Module, lin_attr: str, act_attr: str, linear: nn.Module, act_module: Any) -> FusedActivation:
    """The module for the activation's slot, with the pair recorded in it and in `linear`."""
    blank = FusedActivation()
    blank.train(getattr(act_module, "training", linear.training))
    if isinstance(act_module, nn.Module):
        blank.activation = act_module
    pair = FusedPair(parent, lin_attr, act_attr, linear, blank, act_module)
    linear.__dict__["_tunedb_fused"] = pair
    blank.__dict__["_tunedb_fused"] = pair
    return blank
