"""The tuned ops' torch forms in torch._decomp's global decomposition table.

`torch.onnx.export(model, args, dynamo=True)` exports through torch.export and then decomposes
every op it has no ONNX function for through that table: without an entry there an optimized
model failed to export ("No ONNX function found for tunedb.gemm_act", session 57). Each family
registers the form its gradients already use (grad_form.register; the GEMM ops their own
ops_autograd.torch_form). torch.export's own `run_decompositions()` and Inductor read other tables
(the GEMM family's compile decompositions: ops_compile), so an exported program and compiled code
keep the tuned ops. The TorchScript exporter (`dynamo=False`) is not served: it has no such table.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def register(op: Any, form: Callable[..., Any]) -> None:
    """Add `form` as `op`'s entry (an OpOverload) unless one is there; never raises: export to ONNX
    is optional, and a torch without this table keeps the ops opaque there."""
    try:
        from torch import _decomp

        if op not in _decomp.decomposition_table:
            # a plain function: the decorator reads annotations a functools.partial lacks
            _decomp.register_decomposition(op)(lambda *args, **kwargs: form(*args, **kwargs))
    except Exception:  # noqa: BLE001 - a private table changed shape: the ops stay opaque to ONNX
        return
