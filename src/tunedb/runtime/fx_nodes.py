"""torch.fx symbolic tracing through tunedb's public functions: a call given an fx Proxy (by
symbolic_trace of a function or a module's forward) becomes one call_function node whose target is
the public function itself, so the GraphModule calls it at run time with real tensors (every
shape rule, tier and fallback then applies as in the code traced). Asked only on each entry
point's slow path (an argument that is not a plain tensor): the eager hot paths pay nothing."""
from __future__ import annotations

from typing import Any

import torch
from torch.fx import Proxy


def recorded(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """The node of `fn(*args, **kwargs)` when any argument is an fx Proxy, else None (always
    None while Dynamo traces: its tensors are no Proxy, and this frame stays out of its graph)."""
    if torch.compiler.is_compiling():
        return None

    for v in (*args, *(kwargs or {}).values()):
        if isinstance(v, Proxy):
            return v.tracer.create_proxy("call_function", fn, args, kwargs or {})
    return None
