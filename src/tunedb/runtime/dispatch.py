"""The run-time call path for any kernel family: key the call, resolve it once per (epoch,
shape), launch the bound config.

    from tunedb.runtime import dispatch
    y = dispatch.call("linalg", "potrf", a)      # a family's op entry point calls this

The family's `call_key(op, *args, **kwargs)` hook (default: signature_of) gives (Signature,
size); resolution asks the active overrides (autotune()'s cache) and then the selector's chain
(user > system > cost model > default), exactly as the launch table does for GEMM's ops, and
the bound launch is `family.launch(config, sig, *args, out=None, **kwargs)`; where the family's
`eager_fallback` hook names a sentinel (runtime/host_bound.py), that sentinel serves the calls
made outside CUDA-graph capture, as for GEMM's ops. A family registers
its torch.library ops in its `register_ops` hook and has them call this. Resolution never
synchronises with the device; the memo is cleared when the database epoch moves on.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from tunedb import families
from tunedb.families.contract import hook
from tunedb.records import Config, Signature
from tunedb.runtime import launch_table

_lock = threading.Lock()
_bound: dict[tuple[str, Signature, int], launch_table.Bound] = {}
_epoch: list[Any] = [None]
_registered: set[str] = set()


def ensure_ops(family: str) -> None:
    """Run the family's register_ops hook once per process (its torch.library ops)."""
    if family not in _registered:
        with _lock:
            if family not in _registered:
                hook(families.get(family), "register_ops")()
                _registered.add(family)


def register_all() -> tuple[str, ...]:
    """tunedb.register_ops(): every family's torch.library ops registered now (each once per
    process), so that a program saved from an optimized model (torch.export.save) loads in a
    fresh process: torch.export.load resolves torch.ops.tunedb.* by name, and importing tunedb
    registers nothing (it touches neither torch nor the disk). Returns the families' names."""
    names = tuple(families.names())
    for name in names:
        ensure_ops(name)
    return names


def bound(family: str, op: str, *args: Any, **kwargs: Any) -> launch_table.Bound:
    """The resolution and launcher serving this call's shape (counted as one call)."""
    fam = families.get(family)
    families.check_op(fam, op)
    sig, size = hook(fam, "call_key")(op, *args, **kwargs)
    epoch = launch_table._selector_epoch()
    if _epoch[0] != epoch or launch_table._overrides:
        _bound.clear()
        _epoch[0] = epoch
    key = (family, sig, size)
    found = _bound.get(key)
    if found is None:
        found = launch_table.bind(fam, sig, size, _launcher)
        if not launch_table._overrides:
            _bound[key] = found
    found.counter.calls += 1
    return found


def call(family: str, op: str, *args: Any, **kwargs: Any) -> Any:
    """Run one call of `family`'s op through the selection; the family's launch's result."""
    b = bound(family, op, *args, **kwargs)
    return b.call(*args, **kwargs)


def _launcher(fam: Any, config: Config, sig: Signature) -> Callable[..., Any]:
    return functools.partial(fam.launch, config, sig)


def clear() -> None:
    _bound.clear()
    _epoch[0] = None
