"""A swapped module as torch.jit.script should compile it: its plain nn class again (as_plain).

TorchScript cannot compile the tuned forwards (imports inside, the selector's calls), so each
family's module answers `__prepare_scriptable__` with this copy; torch.jit.script also puts it in
the eager model's slot, where it runs as the plain module did."""
from __future__ import annotations

import copy

from torch import nn


def as_plain(module: nn.Module, cls: type) -> nn.Module:
    """`module` as torch.jit.script should compile it: a shallow copy of class `cls` (the nn class it
    replaced: the same Parameters, buffers and attributes), no fusion. TorchScript cannot compile
    the tuned forwards (imports inside, the selector's calls); torch.jit.script puts this copy in
    the eager model's slot too, where it runs as the plain module did (the fused slots beside it
    then apply their own modules)."""
    plain = copy.copy(module)
    plain.__class__ = cls
    for key in ("_tunedb_fused", "_tunedb_fusion", "_tunedb_flat", "_tunedb_kind"):
        plain.__dict__.pop(key, None)
    return plain
