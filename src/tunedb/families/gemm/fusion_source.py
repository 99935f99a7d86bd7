"""Which Linear of a module class feeds only one activation, read from the class's own source
(Python AST, no tracing): optimize()'s fusion rule 2 (families/gemm/patching.py's docstring).
`class_calls(cls)` gives the (activation attribute, linear attribute) pairs it can prove;
`outside_reads(cls)` the attribute names a class's code reads off anything but `self` (an outer
module calling `self.block.fc(x)` would get the fused activation too); `self_values(cls)` the
attributes of `self` its code uses other than by calling them (`self.mlp[0](x)`, `for layer in
self.body`: a Sequential's children run one by one, where a fused pair would change the result:
rule 1's check)."""
from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap

from torch import nn

from tunedb.families.gemm.child_runs import (
    REACH,
    WALKED_ANY,
    child_runs,
    runs_own_children,
    walks_deep,
)


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


def _closures(tree: ast.AST) -> list[ast.AST]:
    """The outermost lambdas and nested functions inside __init__'s source `tree`: code made
    there that runs later, as methods do (`self.f = lambda x: self.fc(x)`)."""
    init = tree.body[0] if isinstance(tree, ast.Module) and tree.body else tree
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(init))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _function(attr: object) -> object:
    """The function behind a class attribute: a property's getter, a cached_property's,
    a staticmethod's or classmethod's; else the attribute itself."""
    if isinstance(attr, property):
        return attr.fget
    if isinstance(attr, functools.cached_property):
        return attr.func
    if isinstance(attr, (staticmethod, classmethod)):
        return attr.__func__
    return attr


# Bases whose code is the library's, not a model's: they never name a model's submodules (and
# reading transformers' PreTrainedModel costs 0.3-0.5 s of ast.parse, see fusion_plan._may_fuse).
_LIBRARY_MODULES = ("torch.", "transformers.modeling_utils", "transformers.modeling_layers", "transformers.distributed",
                    "transformers.generation",
                    "transformers.integrations", "transformers.utils", "transformers.configuration_utils")


def _method_trees(cls: type, skip_library: bool = False) -> list[tuple[str, ast.AST]] | None:
    """(name, parsed source) of every function, property and cached_property that cls and its
    bases define (with skip_library, not the bases in _LIBRARY_MODULES); None when a source
    cannot be read (then nothing is proven)."""
    out = []
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or (skip_library and klass.__module__.startswith(_LIBRARY_MODULES)):
            continue  # mixins after nn.Module (HF's PreTrainedModel has several) are scanned too
        for name, fn in vars(klass).items():
            fn = _function(fn)
            if not inspect.isfunction(fn):
                continue
            try:
                out.append((name, ast.parse(textwrap.dedent(inspect.getsource(fn)))))
            except (OSError, TypeError, SyntaxError):
                return None
    return out


def code_trees(cls: type) -> tuple[list[ast.AST], dict[str, int]] | None:
    """(the trees of cls's code that run after construction: methods, properties and the
    closures __init__ makes; how many times each `self.<attr>` is named in them), or None when a
    source cannot be read."""
    methods = _method_trees(cls)
    if methods is None:
        return None
    trees: list[ast.AST] = []
    for name, tree in methods:
        trees.extend(_closures(tree) if name == "__init__" else (tree,))
    uses: dict[str, int] = {}
    for tree in trees:
        for node in ast.walk(tree):
            name = _self_attr(node)
            if name is not None:
                uses[name] = uses.get(name, 0) + 1
    return trees, uses


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _self_escapes(tree: ast.AST) -> bool:
    """Whether `tree` reaches self's children other than by `self.<name>`, where no rule here can
    tell which child runs or who receives its output: `self` handed to other code
    (`functools.reduce(getattr, path, self)`, `attrgetter("fc")(self)`, `vars(self)`, `helper(self, x)`),
    or its children taken whole (`self.__dict__`, `self.named_children()`, `self._modules` not run
    on the spot). Probe of session 52: each of these gave the class's second use of a fused Linear
    the activation's output."""
    looked = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and node.attr not in REACH and node.attr != "__dict__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SELF_LOOKS:
            name = node.args[1] if len(node.args) > 1 else None
            if (node.func.id == "getattr" and isinstance(name, ast.Constant)
                    and (name.value in REACH or name.value == "__dict__") and _is_self(node.args[0])):
                return True  # getattr(self, "_modules")["fc"](x): the children taken whole, by name
            looked.update(id(a) for a in node.args)
        elif isinstance(node, ast.Compare):
            looked.update(id(a) for a in (node.left, *node.comparators))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "self" and isinstance(node.ctx, ast.Load) and id(node) not in looked:
            return True
    return False


@functools.lru_cache(maxsize=None)
def class_calls(cls: type) -> tuple[tuple[str, str], ...]:
    """(act attr, linear attr) pairs of cls whose linear output provably feeds only the act,
    each attr named exactly once in the methods (and properties) of cls and its bases, and in
    the closures their __init__ makes (__init__'s own statements only build the module)."""
    code = code_trees(cls)
    if code is None:
        return ()  # source unavailable: we cannot prove safety
    trees, uses = code
    if any(runs_own_children(tree) for tree in trees):  # `for m in self.children(): x = m(x)`
        return ()
    own = _method_trees(cls, skip_library=True) or []  # the library's code runs the module, never a child
    if any(_self_escapes(part) for name, tree in own for part in (_closures(tree) if name == "__init__" else (tree,))):
        return ()
    pairs = dict.fromkeys(p for tree in trees for p in _pairs(tree))
    return tuple((act, lin) for act, lin in pairs
                 if act != lin and uses.get(act) == 1 and uses.get(lin) == 1)


# Builtins that look at a module without running it: `type(model.fc)`, `isinstance(m.fc, ...)`
_INSPECT = frozenset({"type", "isinstance", "id", "print", "repr", "str", "vars", "dir", "hasattr", "callable"})
# What `self` itself may be handed to and still have its children reached only as `self.<name>`:
# a look (not vars() or dir(): they hand over its children), or getattr's named attribute
_SELF_LOOKS = (_INSPECT - {"vars", "dir"}) | {"hash", "super", "getattr", "setattr", "delattr"}


def _looks(tree: ast.AST) -> set[int]:
    """ids of the expressions in `tree` that only look at a module, never run it: one read further
    (`x.fc.weight`, but not a read that reaches its children: REACH), handed to an inspecting
    builtin (`type(x.fc)`), or compared (`m.fc is lin`)."""
    looked = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr not in REACH}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _INSPECT:
            looked.update(id(a) for a in node.args)
        elif isinstance(node, ast.Compare):
            looked.update(id(a) for a in (node.left, *node.comparators))
    return looked


def _foreign_reads(tree: ast.AST) -> set[str]:
    """Attribute names taken off anything but `self` in `tree` and used as a value (called,
    assigned, passed: `self.block.fc(x)`, `f = layer.fc`), and the literal names of
    getattr(x, "fc") used so. An access read further (`model.fc.weight`, `block.fc.act`), handed
    to an inspecting builtin (`type(model.fc)`) or compared (`m.fc is lin`) looks at the module,
    never at its output, so it does not count."""
    looked = _looks(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in looked:
            continue
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            names.add(node.args[1].value)
    names.update(_literal_children(tree))
    return names


def _literal_children(tree: ast.AST) -> set[str]:
    """The names in `blk.get_submodule("mlp.fc")` and `m._modules["fc"]` (on self too: another use
    than a pair's), each part of a dotted path, where the child reached is used as a module is
    run: called, bound to a name, passed to a function other than an inspecting builtin, or
    returned. Read further (`.weight`, an index) or inspected, it is only looked at."""
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names: set[str] = set()
    for node in ast.walk(tree):
        literal = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_submodule"
                and node.args and isinstance(node.args[0], ast.Constant)):
            literal = node.args[0].value
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "_modules" and isinstance(node.slice, ast.Constant)):
            literal = node.slice.value
        if not isinstance(literal, str):
            continue
        parent = parents.get(id(node))
        used = (isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Return, ast.Yield, ast.NamedExpr))
                and getattr(parent, "value", None) is node
                or isinstance(parent, ast.Call) and (parent.func is node or (
                    node in parent.args and not (isinstance(parent.func, ast.Name) and parent.func.id in _INSPECT))))
        if used:
            names.update(literal.split("."))
    return names


def _reached(tree: ast.AST) -> set[str]:
    """Attribute names whose module `tree` reaches into (`self.block.children()`,
    `model.block.get_submodule("fc")`): its children may then run one by one; WALKED_ANY when it
    runs the children of a module held by a plain name (`for m in layer.children(): x = m(x)`,
    `blk.get_submodule("fc")(x)`), which may be any module."""
    names = {node.value.attr for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in REACH and isinstance(node.value, ast.Attribute)}
    # a run through `self.X` (a recursive walk's too: `dict(self.X.named_modules())[k](x)`) names
    # X; `self`'s own is class_calls'
    for r in child_runs(tree):
        if isinstance(r, ast.Attribute):
            names.add(r.attr)
        elif not (isinstance(r, ast.Name) and r.id == "self"):
            names.add(WALKED_ANY)
    if walks_deep(tree):  # a module found by a recursive walk and run: any descendant, however deep
        names.add(WALKED_ANY)
    return names


@functools.lru_cache(maxsize=None)
def _module_reads(module_name: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """(_foreign_reads, _reached) over the whole source file of a module (its classes, and the
    helper functions a model's forward may hand a submodule to), or None when it cannot be read."""
    module = sys.modules.get(module_name)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError, SyntaxError):
        return None
    return None if tree is None else (frozenset(_foreign_reads(tree)), frozenset(_reached(tree)))


@functools.lru_cache(maxsize=None)
def outside_reads(cls: type) -> frozenset[str] | None:
    """The attribute names taken off an expression other than `self` and used as a value in the
    source files of cls and its model-specific bases (their methods and module-level helpers:
    `self.block.fc(x)`, `def raw(block, x): return block.fc(x)`, `getattr(self.block, "fc")(x)`;
    not `model.fc.weight`: _foreign_reads), or None when some of that
    source cannot be read (then nothing is proven). A Linear of such a name may be called from
    outside the module that owns it, where a fused activation would change the result. A
    getattr with a computed name is not seen."""
    got = _class_reads(cls)
    return None if got is None else got[0]


@functools.lru_cache(maxsize=None)
def reached_reads(cls: type) -> frozenset[str] | None:
    """The attribute names whose module the source files of cls and its model-specific bases
    reach into (_reached: `self.block.children()`), or None when some of that source cannot be
    read. A module of such a name may have its children run one by one, so fusing two of them
    (rule 2) would hand the first one's caller the second one's output."""
    got = _class_reads(cls)
    return None if got is None else got[1]


def _class_reads(cls: type) -> tuple[frozenset[str], frozenset[str]] | None:
    """(outside reads, reached names) over cls's and its model-specific bases' source files."""
    names: set[str] = set()
    reached: set[str] = set()
    for klass in cls.__mro__:
        if klass in (nn.Module, object) or klass.__module__.startswith(_LIBRARY_MODULES):
            continue
        got = _module_reads(klass.__module__)
        if got is None:  # no file (a class made in exec or a notebook cell): its own methods
            methods = _method_trees(klass, skip_library=True)
            if methods is None:
                return None
            got = (frozenset(n for _name, tree in methods for n in _foreign_reads(tree)),
                   frozenset(n for _name, tree in methods for n in _reached(tree)))
        names |= got[0]
        reached |= got[1]
    return frozenset(names), frozenset(reached)


@functools.lru_cache(maxsize=None)
def self_values(cls: type) -> frozenset[str] | None:
    """The attributes of `self` that cls's code (its and its model-specific bases' methods and
    properties, and the closures __init__ makes) uses other than by calling them: indexed,
    sliced, iterated, passed, returned or bound to a name (`self.mlp[0](x)`, `for m in self.body`,
    `f(self.mlp)`). A call `self.mlp(x)` and a look at the module (`self.mlp.weight`, `type(...)`,
    a comparison) do not count. None when some source cannot be read (nothing is proven)."""
    methods = _method_trees(cls, skip_library=True)
    if methods is None:
        return None
    names: set[str] = set()
    for name, tree in methods:
        for part in (_closures(tree) if name == "__init__" else (tree,)):
            passive = _looks(part) | {id(node.func) for node in ast.walk(part) if isinstance(node, ast.Call)}
            for node in ast.walk(part):
                attr = _self_attr(node)
                if attr is not None and id(node) not in passive and not isinstance(getattr(node, "ctx", None), ast.Store):
                    names.add(attr)
    return frozenset(names)


def sequentials_called_whole(model: nn.Module, read_outside) -> set[int]:
    """The ids of `model`'s nn.Sequential modules that every module holding them only calls
    (self_values), whose attribute no model code reads off another module (`read_outside(name)`),
    and the model itself when it is one (its caller's code is not ours to read). A Sequential held
    by another Sequential counts as called where that one does (its forward calls its children
    whole); one held by a ModuleList or ModuleDict does not: the code walking the container may
    index into its elements (`self.layers[0][0](x)`), which no rule here reads."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in model.modules():
        for attr, child in owner._modules.items():
            if type(child) is nn.Sequential:
                owners.setdefault(id(child), []).append((owner, attr))
    whole = {id(m) for m in model.modules() if type(m) is nn.Sequential}
    inside: dict[int, list[int]] = {}  # a Sequential -> the Sequentials holding it
    for seq_id, held in owners.items():
        for owner, attr in held:
            if type(owner) is nn.Sequential:
                inside.setdefault(seq_id, []).append(id(owner))
                continue
            if type(owner) in (nn.ModuleList, nn.ModuleDict):
                whole.discard(seq_id)
                continue
            used = self_values(type(owner))
            if used is None or attr in used or read_outside(attr):
                whole.discard(seq_id)
    changed = True
    while changed:  # held by a Sequential that is not called whole: neither is it
        changed = False
        for seq_id, outer in inside.items():
            if seq_id in whole and any(o not in whole for o in outer):
                whole.discard(seq_id)
                changed = True
    return whole


def _over_classes(model: nn.Module, per_class) -> frozenset[str] | None:
    """The union of per_class(cls) over `model`'s module classes, or None when one is None."""
    names: set[str] = set()
    for cls in {type(m) for m in model.modules()}:
        if cls.__module__.startswith("tunedb.families."):
            # tunedb's own modules (a fused pair's activation slot, a tuned layer from an earlier
            # optimize() of this model or a part of it) read their pairs by design, not as a
            # model's code reaching into a child: counting them kept a re-run from fusing
            continue
        got = per_class(cls)
        if got is None:
            return None
        names |= got
    return frozenset(names)


def model_outside_reads(model: nn.Module) -> frozenset[str] | None:
    """The attribute names the source files of `model`'s module classes read off a module other
    than self (outside_reads, over every class), or None when some source cannot be read."""
    return _over_classes(model, outside_reads)


def model_reached_reads(model: nn.Module) -> frozenset[str] | None:
    """reached_reads over every module class of `model`, or None when some source cannot be read."""
    return _over_classes(model, reached_reads)


def called_whole(model: nn.Module) -> set[int]:
    """sequentials_called_whole with the model's own outside reads (nothing when unreadable)."""
    outside = model_outside_reads(model)
    return set() if outside is None else sequentials_called_whole(model, lambda name: name in outside)
