"""Where model code runs a module's children one by one (Python AST): a reached child called, a loop
or comprehension over a module's children that calls what it binds, a lambda handed them that
calls its parameter. Fusion rule 2 (fusion_source.py) fuses no pair whose block is walked so: the
walk would hand the Linear's caller the activation's output."""
from __future__ import annotations

import ast

# Reads off a module that reach its children, to run them one by one (`self.head.children()`,
# `m.body.get_submodule("0")`, `seq._modules["0"]`): a use of the module, not a look at it. Not the
# recursive walks (modules(), named_modules(), apply()): models use them to initialise weights
# (`for m in self.mlp.modules(): nn.init...`), and a forward that runs every module of a tree
# would run the tree twice
REACH = frozenset({"children", "named_children", "_modules", "get_submodule", "__getitem__", "__iter__",
                   "__getattr__"})
# ... and what child_runs follows, where only a call of what they yield counts: a layer fetched by
# name from a recursive walk and run (`dict(self.named_modules())[name](x)`) is a run
_RUN_REACH = REACH | {"modules", "named_modules"}


WALKED_ANY = "*"  # _reached's mark: code runs the children of a module it holds by a plain name


def _reach_receiver(node: ast.AST, reach: frozenset[str] = _RUN_REACH) -> ast.AST | None:
    """R for an expression that reaches R's children: `R.children()`, `R.named_children()`,
    `R.get_submodule(...)`, `R.__getitem__(...)`, `R.__iter__()`, `R._modules` (and an index,
    `.values()` or `.items()` of it); else None."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ("values", "items") and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "_modules" and "_modules" in reach:
            return node.func.value.value
        if node.func.attr in reach and node.func.attr != "_modules":
            return node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "_modules" and "_modules" in reach:
        return node.value
    return None


def _dynamic_getattr(node: ast.AST) -> ast.AST | None:
    """R for `getattr(R, name)` with a computed name and R `self` or an attribute chain on it (a
    child by a name the AST cannot read; a constant name is `self.fc`), else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant) and _of_self(node.args[0])):
        return node.args[0]
    return None


def _child_of(node: ast.AST, reach: frozenset[str]) -> ast.AST | None:
    """R for an expression whose value is one of R's children: `next(iter(R.children()))`,
    `list(R.children())[0]`, `R._modules["fc"]`, `R.get_submodule("fc")`, `getattr(self, name)`;
    not an expression that only looks at them (`type(next(m for m in R.modules()))`)."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
              and node.func.id in ("next", "iter", "list", "tuple")):
            node = node.args[0]
        else:
            break
    r = _dynamic_getattr(node) if reach is _RUN_REACH else None  # (not a recursive walk's: walks_deep)
    return r if r is not None else _reach_receiver(node, reach)


def _of_self(node: ast.AST) -> bool:
    """`self` or an attribute chain on it (`self.block`, `self.a.b`)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _reaches_in(node: ast.AST, loop: bool = False, reach: frozenset[str] = _RUN_REACH) -> list[ast.AST]:
    """The receivers of every reach anywhere inside the expression `node`
    (`enumerate(R.children())`, `list(R.children())[0]`, `next(iter(R.children()))`); with `loop`,
    also `self` iterated itself (a Sequential or ModuleList subclass's `for m in self: x = m(x)`)."""
    if loop and isinstance(node, ast.Name) and node.id == "self":
        return [node]
    found = [_reach_receiver(n, reach) for n in ast.walk(node)]
    return [r for r in found if r is not None]


def _bound_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _calls_a_name(nodes: list[ast.AST], names: set[str]) -> bool:
    """Whether `nodes` call a module bound to one of `names`: `m(x)`, `m.forward(x)`,
    `m.__call__(x)`, `getattr(R, name)(x)` (a named_children loop's name)."""
    for node in nodes:
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Name) and f.id in names:
                return True
            if (isinstance(f, ast.Attribute) and f.attr in ("forward", "__call__")
                    and isinstance(f.value, ast.Name) and f.value.id in names):
                return True
            if (isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "getattr"
                    and len(f.args) >= 2 and isinstance(f.args[1], ast.Name) and f.args[1].id in names):
                return True
    return False


def _lambda_runs(node: ast.AST) -> bool:
    """A lambda that calls its own parameter (`map(lambda m: m(x), R.children())`)."""
    return isinstance(node, ast.Lambda) and _calls_a_name([node.body], {a.arg for a in node.args.args})


def child_runs(tree: ast.AST, reach: frozenset[str] = _RUN_REACH) -> list[ast.AST]:
    """The receivers R whose children `tree` runs one by one: a reached child called
    (`blk.get_submodule("fc")(x)`, `self._modules["fc"](x)`, `list(R.children())[0](x)`), a loop
    or comprehension over R's children (however wrapped: `enumerate`, `zip`, `list`) that calls
    what it binds (`for i, m in enumerate(self.children()): x = m(x)`, `m.forward(x)`), or a call
    handing R's children to a lambda that calls its parameter (`map(lambda m: m(x), ...)`). A
    reach that only looks (`len(list(m.children()))`, `m._modules[name] = new`) is not a run."""
    out: list[ast.AST] = []
    bound: dict[str, list[ast.AST]] = {}  # a name bound to a reached child (`first = next(iter(self.children()))`)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            child = _child_of(node.value, reach)
            receivers = [] if child is None else [child]
            for name in (n for t in targets for n in _bound_names(t)) if receivers else ():
                bound.setdefault(name, []).extend(receivers)
        if isinstance(node, ast.Call):
            f = node.func.value if isinstance(node.func, ast.Attribute) and node.func.attr in ("forward", "__call__") \
                else node.func
            if reach is _RUN_REACH and _dynamic_getattr(f) is not None:  # getattr(self, name)(x): that child run
                out.append(f.args[0])
            if not isinstance(node.func, ast.Name):  # a called reach (a plain name is no reach)
                out.extend(_reaches_in(node.func, reach=reach))
            if any(_lambda_runs(a) for a in node.args):
                out.extend(r for a in node.args for r in _reaches_in(a, reach=reach))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            if _calls_a_name(node.body, _bound_names(node.target)):
                out.extend(_reaches_in(node.iter, loop=reach is _RUN_REACH, reach=reach))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for gen in node.generators:
                if _calls_a_name(elts + gen.ifs, _bound_names(gen.target)):
                    out.extend(_reaches_in(gen.iter, loop=reach is _RUN_REACH, reach=reach))
    for name, receivers in bound.items():
        if _calls_a_name([tree], {name}):  # ... and then called
            out.extend(receivers)
    return out


RECURSIVE = frozenset({"modules", "named_modules"})


def walks_deep(tree: ast.AST) -> bool:
    """Whether `tree` runs modules it finds by a recursive walk (`dict(self.named_modules())[k](x)`,
    `for _, m in self.named_modules(): m(x)`): any descendant may then run alone, however deep."""
    return bool(child_runs(tree, RECURSIVE))


def runs_own_children(tree: ast.AST) -> bool:
    return any(isinstance(r, ast.Name) and r.id == "self" for r in child_runs(tree))
