"""Give one model code objects of its own, so that two models of the same classes compiled in one
process do not share Dynamo's caches.

Dynamo keeps its compiled entries on the code object of each frame it starts on (a model's forward,
the resume functions after a graph break). Two copies of one transformers model share those code
objects, so in a paired bench the second model compiled adds a second entry beside the first's, and
every call of either first fails the other's guards (a recompile logged as "___check_type_id" on
a swapped submodule): a cost no user with one model pays. `private_code(module)` re-classes every
submodule into a subclass whose methods are copies of the originals with fresh code objects (and
copies of the functions their closures hold, so a decorated forward's inner function is fresh too).
Bench-only: behaviour is unchanged (isinstance, super(), state_dict), only the code identities."""
from __future__ import annotations

import types
from typing import Any


def _fresh(fn: types.FunctionType, memo: dict) -> types.FunctionType:
    if fn in memo:
        return memo[fn]
    olds = fn.__closure__ or ()
    cells = tuple(types.CellType() for _ in olds)
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              cells if fn.__closure__ is not None else None)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__dict__.update(fn.__dict__)
    memo[fn] = copy  # before the closure: a function its own closure holds (a recursive helper)
    for old, cell in zip(olds, cells):
        try:
            value = old.cell_contents
        except ValueError:  # an empty cell stays empty
            continue
        cell.cell_contents = _fresh(value, memo) if isinstance(value, types.FunctionType) else value
    return copy


def _private_class(cls: type, memo: dict) -> type:
    import torch

    namespace: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base in (object, torch.nn.Module):
            continue
        for name, value in vars(base).items():
            if isinstance(value, types.FunctionType):
                namespace[name] = _fresh(value, memo)
            elif isinstance(value, (staticmethod, classmethod)) and isinstance(value.__func__, types.FunctionType):
                namespace[name] = type(value)(_fresh(value.__func__, memo))
    namespace["__module__"] = cls.__module__
    namespace["__qualname__"] = cls.__qualname__
    return type(cls.__name__, (cls,), namespace)


def private_code(module: Any) -> Any:
    """Re-class module and every submodule in place (see the module docstring); returns module."""
    memo: dict = {}
    classes: dict[type, type] = {}
    for sub in module.modules():
        cls = type(sub)
        if cls not in classes:
            classes[cls] = _private_class(cls, memo)
        sub.__class__ = classes[cls]
    return module
