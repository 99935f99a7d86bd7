"""Whether a model's code can make a product the bmm family's ProductMode serves, read from the
source files of its module classes (Python AST, no tracing): optimize() installs the mode's
hooks only on such a model.

The hooks cost every eager forward a few microseconds even while backed off (session 30: 10-30 us
on the H200's host, a 1-layer decoder's forward 250-285 us), and a model whose attention is SDPA
makes no product for them to serve. A product the mode takes is torch.matmul / torch.bmm /
Tensor.matmul / Tensor.bmm / `a @ b`: a file holding none of those (as a call or an attribute
named matmul or bmm, or the @ operator) cannot make one from its own code. torch.nn's attention
modules make theirs inside torch.nn.functional (multi_head_attention_forward's bmm), so they count
by name. A class whose source cannot be read (defined in a REPL, a compiled extension) counts as
making products: the hooks are kept where this cannot prove there are none.
"""
from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

# torch.nn modules whose forward reaches torch.bmm in torch.nn.functional (their slow path)
_TORCH_NN_PRODUCTS = frozenset({"MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
                                "TransformerEncoderLayer", "TransformerDecoderLayer"})
_NAMES = frozenset({"matmul", "bmm", "__matmul__"})


def makes_products(model: Any) -> bool:
    """Whether any module class of `model` may call a product the mode serves."""
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        for klass in cls.__mro__:  # a subclass may inherit its forward from a user base class
            if klass.__module__.startswith("torch.nn"):
                if klass.__name__ in _TORCH_NN_PRODUCTS:
                    return True
                continue
            if klass is object:
                continue
            if _file_has_products(_source_file(klass)):
                return True
    return False


def _source_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


@functools.lru_cache(maxsize=256)
def _file_has_products(path: str | None) -> bool:
    if path is None:
        return True
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            return True
        if isinstance(node, ast.Name) and node.id in _NAMES:
            return True
        if isinstance(node, ast.ImportFrom) and any(alias.name in _NAMES for alias in node.names):
            return True  # `from torch import matmul as mm`
    return False
