"""Which Linear of a module class feeds only one activation, read from the class's own source
(Python AST, no tracing): optimize()'s fusion rule 2 (families/gemm/patching.py's docstring).
`class_calls(cls)` gives the (activation attribute, linear attribute) pairs it can prove."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from torch import nn


def _self_attr(node: ast.AST) -> str | None:
    """'x' for the expression `self.x`, else None."""
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self"):
        return node.attr
    return None


def _call_of(node: ast.AST) -> tuple[str | None, list[ast.AST]]:
    """('A', args) for a plain call `self.A(args)` (no keywords, no *args), else (None, [])."""
    if isinstance(node, ast.Call) and not node.keywords:
        name = _self_attr(node.func)
        if name is not None and not any(isinstance(a, ast.Starred) for a in node.args):
            return name, list(node.args)
    return None, []


def _pairs(tree: ast.AST) -> list[tuple[str, str]]:
    """(A, L) where L's result feeds only A: `self.A(self.L(...))`, or the statements
    `v = self.L(...)` then immediately `v = self.A(v)` (v rebound, so nothing else sees it)."""
    out = []
    for node in ast.walk(tree):
        act, args = _call_of(node)
        if act is not None and len(args) == 1:
            lin, _ = _call_of(args[0])
            if lin is not None:
                out.append((act, lin))
        for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if not isinstance(body, list):
                continue
            for first, second in zip(body, body[1:]):
                if not (isinstance(first, ast.Assign) and isinstance(second, ast.Assign)):
                    continue
                if len(first.targets) != 1 or len(second.targets) != 1:
                    continue
                v1, v2 = first.targets[0], second.targets[0]
                if not (isinstance(v1, ast.Name) and isinstance(v2, ast.Name) and v1.id == v2.id):
                    continue
                lin, _ = _call_of(first.value)
                act, args = _call_of(second.value)
                if (lin is not None and act is not None and len(args) == 1
                        and isinstance(args[0], ast.Name) and args[0].id == v1.id):
                    out.append((act, lin))
    return out


@functools.lru_cache(maxsize=None)
def class_calls(cls: type) -> tuple[tuple[str, str], ...]:
    """(act attr, linear attr) pairs of cls whose linear output provably feeds only the act,
    each attr named exactly once in the methods (and properties) of cls and its bases."""
    trees: list[ast.AST] = []
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            continue  # mixins after nn.Module (HF's PreTrainedModel has several) are scanned too
        for name, fn in vars(klass).items():
            if isinstance(fn, property):
                fn = fn.fget
            if name == "__init__" or not inspect.isfunction(fn):
                continue
            try:
                trees.append(ast.parse(textwrap.dedent(inspect.getsource(fn))))
            except (OSError, TypeError, SyntaxError):
                return ()  # source unavailable: we cannot prove safety
    uses: dict[str, int] = {}
    for tree in trees:
        for node in ast.walk(tree):
            name = _self_attr(node)
            if name is not None:
                uses[name] = uses.get(name, 0) + 1
    pairs = dict.fromkeys(p for tree in trees for p in _pairs(tree))
    return tuple((act, lin) for act, lin in pairs
                 if act != lin and uses.get(act) == 1 and uses.get(lin) == 1)
