"""Which submodules of a module class are siblings: called on the same tensor in one straight run
of statements, read from the class's own source (Python AST, no tracing), so that optimize() can
run sibling projections as one launch (families/gemm/siblings.py).

`sibling_calls(cls)` gives groups of attribute names A, B[, C] for which the class's code holds
`self.A(v)`, `self.B(v)` (`self.C(v)`) with the same local name v, each call unconditional
(not inside `x if c else y`, `and` / `or`, a lambda or a comprehension), in consecutive plain
statements (assignments, expressions, `return`) of one block, v not rebound between the first
and the last of them nor used there other than by those calls and reads such as `v.shape` (not
passed on, aliased, indexed or given a method call: `v.mul_(2)`), and each attribute named exactly once in all of the class's methods,
properties and the closures its __init__ makes. Hugging Face's LlamaAttention (`self.q_proj(
hidden_states)`, then k_proj, then v_proj) and LlamaMLP (`self.act_fn(self.gate_proj(x)) *
self.up_proj(x)`) match; a cross-attention's `self.q_proj(hidden_states)` and
`self.k_proj(key_value_states)` do not. The run time still checks each call's tensor: a group
found here only lets the first call compute its siblings' outputs for that same tensor.
"""
from __future__ import annotations

import ast
import functools

from tunedb.families.gemm.fusion_source import _call_of, code_trees

# statements that run every expression in them once, in order, and fall through to the next
_PLAIN = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return)
# expressions whose parts may not run (or run later, or many times)
_CONDITIONAL = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                ast.Await, ast.Yield, ast.YieldFrom)


def _calls(stmt: ast.AST) -> list[tuple[str, str]]:
    """(attr, name) of every `self.attr(name)` in `stmt` that runs whenever `stmt` runs."""
    out = []
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, _CONDITIONAL):
            continue
        attr, args = _call_of(node)
        if attr is not None and len(args) == 1 and isinstance(args[0], ast.Name):
            out.append((attr, args[0].id))
        stack.extend(ast.iter_child_nodes(node))
    return out


# reads of a tensor that cannot change it
_LOOKS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "size", "dim", "numel", "requires_grad"})


def _other_uses(stmt: ast.AST) -> set[str]:
    """Names `stmt` uses other than as the one argument of a `self.attr(name)` call or by a read in
    _LOOKS (`v.shape`): passed on, aliased, indexed, or a method called on them (`v.mul_(2)`)."""
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(stmt):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    out = set()
    for node in ast.walk(stmt):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
            continue
        up = parents.get(id(node))
        if isinstance(up, ast.Attribute) and up.attr in _LOOKS:
            continue
        if isinstance(up, ast.Call) and node in up.args and _call_of(up)[0] is not None and len(up.args) == 1:
            continue
        out.add(node.id)
    return out


def _bound(stmt: ast.AST) -> set[str]:
    """Names `stmt` binds or deletes (targets, walrus)."""
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def _groups(tree: ast.AST) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            runs: dict[str, list[str]] = {}  # name -> attrs called on it since it was last bound

            def close(name: str) -> None:
                attrs = runs.pop(name, None)
                if attrs and len(attrs) > 1:
                    out.append(tuple(attrs))

            for stmt in body:
                if not isinstance(stmt, _PLAIN):
                    for name in list(runs):
                        close(name)
                    continue
                other = _other_uses(stmt)
                for name in other:  # v may change here (in place, through an alias): the run ends before
                    close(name)
                for attr, name in _calls(stmt):
                    if name not in other:
                        runs.setdefault(name, []).append(attr)
                for name in _bound(stmt):
                    close(name)
            for name in list(runs):
                close(name)
    return out


@functools.lru_cache(maxsize=None)
def sibling_calls(cls: type) -> tuple[tuple[str, ...], ...]:
    """The sibling groups of cls (see the module docstring); () when its source cannot be read."""
    code = code_trees(cls)
    if code is None:
        return ()
    trees, uses = code
    found = dict.fromkeys(g for tree in trees for g in _groups(tree))
    return tuple(g for g in found if len(set(g)) == len(g) and all(uses.get(a) == 1 for a in g))
