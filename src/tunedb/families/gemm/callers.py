"""Who called a module: the code of a fused pair's parent class (its methods and the functions
nested in them) and the frame walk that asks whether the parent's own code made a call
(run_by), so that a caller of its own (`head[0](h)`, a loop over a Sequential's children) gets
the module's own output, not the fused one. fused_pair and the conv family's fusion ask it."""
from __future__ import annotations

import re
import sys
import types
from typing import Any

from torch import nn


def _module_calls() -> frozenset[int]:
    """The code of nn.Module's call machinery (the frames between a parent's forward and a child's)."""
    ids = set()
    for name in ("__call__", "_wrapped_call_impl", "_call_impl", "_slow_forward"):
        code = getattr(getattr(nn.Module, name, None), "__code__", None)
        if code is not None:
            ids.add(id(code))
    return frozenset(ids)


_MODULE_CALLS = _module_calls()
# a class's method code ids, with the code objects (kept: their ids stay theirs); a class here stays alive
_CLASS_CODES: dict[type, tuple[frozenset[int], tuple[Any, ...]]] = {}


def _functions(value: Any) -> list[Any]:
    """The functions a class attribute holds (a method, a static / class method, a property's
    accessors, each decorator layer down to what it wraps)."""
    found, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (staticmethod, classmethod)):
            todo.append(v.__func__)
        elif isinstance(v, property):
            todo.extend(f for f in (v.fget, v.fset, v.fdel) if f is not None)
        elif isinstance(v, types.FunctionType) and v not in found:
            found.append(v)
            wrapped = getattr(v, "__wrapped__", None)
            if wrapped is not None:
                todo.append(wrapped)
    return found


def class_codes(cls: type) -> frozenset[int]:
    """The ids of the code objects of `cls`'s own methods and of its bases' short of nn.Module,
    with every function nested in them: the code that may call a fused pair's modules."""
    hit = _CLASS_CODES.get(cls)
    if hit is not None:
        return hit[0]
    keep: dict[int, Any] = {}
    todo = [f.__code__ for k in cls.__mro__ if k not in (nn.Module, object) for v in vars(k).values()
            for f in _functions(v)]
    while todo:
        code = todo.pop()
        if id(code) not in keep:
            keep[id(code)] = code
            todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    _CLASS_CODES[cls] = hit = (frozenset(keep), tuple(keep.values()))
    return hit[0]


def run_by(parent: Any, depth: int) -> bool:
    """Whether the module whose forward is `depth` frames above this call was called by code of
    `parent`'s class (its forward or another of its methods: what optimize()'s fusion rules read),
    not by a caller of its own (`head[0](h)`, a loop over a Sequential's children collecting each
    output), which must get the module's own output, not the fused one. Eager calls only: a
    compiler's trace (its graph is the parent's forward) does not ask (`_compiling()` first)."""
    f = sys._getframe(depth + 1)
    while f is not None and id(f.f_code) in _MODULE_CALLS:
        f = f.f_back
    if f is None or parent is None:
        return False
    hit = _CLASS_CODES.get(type(parent))
    if id(f.f_code) in (hit[0] if hit is not None else class_codes(type(parent))):
        return True
    # the rest of the parent's forward after a graph break, run eagerly by Dynamo (its code is
    # made from the forward's): the Linear before the break was traced fused
    return f.f_code.co_name.startswith("torch_dynamo_resume_in_") and resumes(f.f_code, type(parent))


_RESUME = re.compile(r"torch_dynamo_resume_in_(.+)_at_(\d+)")


def resumes(code: types.CodeType, cls: type) -> bool:
    """Whether `code`, a Dynamo resume function, continues one of `cls`'s methods after a graph
    break (its name gives the method's and the break's line; its file is the method's): an
    outer module's forward resumed after its own break is not the parent's code (session 53)."""
    m = _RESUME.fullmatch(code.co_name)
    if m is None:
        return False
    name, line = m.group(1), int(m.group(2))
    while (inner := _RESUME.fullmatch(name)) is not None:  # a resume of a resume
        name = inner.group(1)
    class_codes(cls)
    for c in _CLASS_CODES[cls][1]:
        if c.co_name == name and c.co_filename == code.co_filename:
            lines = [ln for *_, ln in c.co_lines() if ln is not None]
            if lines and min(lines) <= line <= max(lines):
                return True
    return False


_OWN_DIR = __file__.rsplit("/families/", 1)[0]  # tunedb's package directory: its frames are no caller


def _dynamo_tx() -> Any:
    """The Dynamo translator tracing the call of the constant function this runs in (its
    invoke_and_store_as_constant frame's `tx`), or None outside such a call."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "invoke_and_store_as_constant":
            return f.f_locals.get("tx")
        f = f.f_back
    return None


def traced_by(cls: type | None) -> bool:
    """run_by for a compiler's trace: whether the code the trace inlined the module's call from
    is `cls`'s (what optimize()'s fusion rules read) or the rest of it after a graph break.
    Called from a function Dynamo runs as a constant at trace time (its translators' chain
    stands for the frames: each inlined function's code, its caller's translator as `parent`).
    Unknown (no translator found, an internal Dynamo changed): False, the unfused form."""
    tx = _dynamo_tx() if cls is not None else None
    if tx is None:
        return False
    codes = class_codes(cls)  # type: ignore[arg-type]
    while tx is not None:
        code = getattr(tx, "f_code", None)
        if code is None:
            return False
        if id(code) not in _MODULE_CALLS and not code.co_filename.startswith(_OWN_DIR):
            return id(code) in codes or resumes(code, cls)  # type: ignore[arg-type]
        tx = getattr(tx, "parent", None)
    return False
