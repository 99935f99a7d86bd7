"""optimize(model): every kernel family patches the model with its own rules, in registry order.

A family's `optimize(model, approximate=False)` hook swaps the modules it serves for its tuned
ops (GEMM: nn.Linear, and a following activation where safe, for TunedLinear; see
families/gemm/patching.py); a family without the hook leaves the model as it is.
"""
from __future__ import annotations

import copy
from typing import Any

from tunedb import families
from tunedb.families.contract import hook


def optimize(model: Any, approximate: bool = False, inplace: bool = True) -> Any:
    """The model with every family's patches applied (a deep copy when inplace=False).
    approximate=True lets approximating arms serve, gate permitting (process-wide)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize() needs a torch.nn.Module, got {type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    for name in families.names():
        model = hook(families.get(name), "optimize")(model, approximate=approximate)
    return model
