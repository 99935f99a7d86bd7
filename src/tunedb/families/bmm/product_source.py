"""Whether a model's code can make a product the bmm family's ProductMode serves, read from the
source files of its module classes (Python AST, no tracing): optimize() installs the mode's
hooks only on such a model.

The hooks cost every eager forward a few microseconds even while backed off (session 30: 10-30 us
on the H200's host, a 1-layer decoder's forward 250-285 us), and a model whose attention is SDPA
makes no product for them to serve. A product the mode takes is torch.matmul / torch.bmm /
Tensor.matmul / Tensor.bmm / `a @ b` called from the model's Python: a file holding none of those
(as a call or an attribute or a name imported as matmul or bmm, or the @ operator) cannot make
one from its own code. The scan also reads the user's own modules a class's file imports (files
outside the Python installation and its site-packages, one level of imports per file, followed
transitively), where an attention helper may live.

Counted as making products without a scan, since this cannot see their code: a module whose
forward was replaced on the instance, a torch.fx GraphModule (generated code), a module carrying
forward hooks of its own (a user's hook runs code from anywhere), a class whose source cannot be
read (a REPL, a compiled extension). torch.nn's own classes are not scanned: their attention
(nn.MultiheadAttention, the Transformer layers) makes its products inside
torch.nn.functional.multi_head_attention_forward, a torch function the mode sees whole and does
not enter, so the mode never serves them.
"""
from __future__ import annotations

import ast
import functools
import inspect
import sys
import sysconfig
from typing import Any

_NAMES = frozenset({"matmul", "bmm", "__matmul__"})


def makes_products(model: Any) -> bool:
    """Whether any module of `model` may call a product the mode serves."""
    seen: set[type] = set()
    for module in model.modules():
        hooks = (*module._forward_hooks.values(), *module._forward_pre_hooks.values())
        if "forward" in module.__dict__ or any(not getattr(h, "tunedb_own_hook", False) for h in hooks):
            return True
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        for klass in cls.__mro__:  # a subclass may inherit its forward from a user base class
            if klass is object or klass.__module__.startswith("torch.nn.modules"):
                continue
            if klass.__module__.startswith("torch.fx"):
                return True
            if _file_has_products(_source_file(klass)):
                return True
    return False


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    """The Python installation's and its site-packages' directories: third-party and standard
    modules, which the scan does not follow (numpy's files name matmul, and no model's
    attention hides there that its own modeling file does not show)."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(r for r in roots if r))


def _local_file(module_name: str) -> str | None:
    """The source file of an imported user module (not under the installation's roots), or None."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or path.startswith(_installed_roots()):
        return None
    return path


def _absolute(module: str | None, level: int, path: str) -> str | None:
    """The absolute name `from <level dots><module> import ...` in the file at `path` refers to
    (its package from the loaded module whose file that is), or None where it cannot tell."""
    if not level:
        return module
    package = next((getattr(m, "__package__", None) for m in list(sys.modules.values())
                    if getattr(m, "__file__", None) == path), None)
    if not package:
        return None
    parts = package.split(".")
    if level - 1 > len(parts) - 1:
        return None
    head = ".".join(parts[:len(parts) - (level - 1)])
    return f"{head}.{module}" if module else head


@functools.lru_cache(maxsize=512)
def _file_has_products(path: str | None, _depth: int = 0) -> bool:
    if path is None:
        return True
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            return True
        if isinstance(node, ast.Name) and node.id in _NAMES:
            return True
        if isinstance(node, ast.ImportFrom):
            if any(alias.name in _NAMES for alias in node.names):
                return True  # `from torch import matmul as mm`
            base = _absolute(node.module, node.level, path)
            if base:
                imported.append(base)
                imported += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    if _depth >= 8:  # a deep chain of local imports: assume the worst rather than walk on
        return True
    for name in imported:
        local = _local_file(name)
        if local is not None and local != path and _file_has_products(local, _depth + 1):
            return True
    return False
