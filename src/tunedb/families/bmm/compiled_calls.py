"""How the product mode's hooks (serving.py) meet torch.compile: whether a compiled call runs now,
the hooks' frames marked for Dynamo to run as Python, and a function run outside Dynamo.

torch.compile(model) runs a module's hooks outside its compiled forward ("invoke hooks outside of
dynamo", its OptimizedModule), where Dynamo compiled each hook as a frame of its own and ran that
on every call: the hooks served nothing there (the compiler takes the products) yet cost each
compiled forward host time (session 48: 23 us a call on this CPU; Llama-3-8B's compiled forward
0.94x of compile alone on the H100). With the frames skipped, the pre-hook runs as Python, sees
the compiled call and takes the hooks off.

Reads torch's private Dynamo state (`get_eval_frame_callback`, `skip_code`) through getattr: a torch without one of them answers "no compiled call" or leaves
the hooks traced, as before. Imports nothing until asked.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any


def compiled_call() -> bool:
    """Whether a compiled call runs now on this thread: a torch.compile'd module's (its hooks run
    as Python inside the call) or any compiled function's that runs this code as Python after a
    graph break. Dynamo's frame callback, per thread, is set for the call's whole length (None
    outside one and under torch.compiler.disable); torch's process-wide `_is_in_optimized_module`
    flag is not read: another thread's compiled call would take an eager model's hooks off.
    Dynamo not loaded: no such call."""
    if "torch._dynamo.eval_frame" not in sys.modules:
        return False
    callback = _callback()
    return callback is not None and callback() is not None


@functools.lru_cache(maxsize=1)
def _callback() -> Callable[[], Any] | None:
    dynamo = getattr(sys.modules.get("torch._C"), "_dynamo", None)
    return getattr(getattr(dynamo, "eval_frame", None), "get_eval_frame_callback", None)


@functools.cache
def skip_frames(*fns: Callable[..., Any]) -> None:
    """Mark each function's own frame for Dynamo to run as Python, never to compile as a frame of
    its own (its non-recursive skip: a trace that reaches it from a compiled caller, as
    module.compile()'s, still inlines it, so no graph break and fullgraph=True holds)."""
    import torch._dynamo.eval_frame as frames  # optimize() has loaded Dynamo already: a lookup

    skip = getattr(frames, "skip_code", None)
    if skip is not None:
        for fn in fns:
            skip(fn.__code__)


@functools.cache
def outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, run with Dynamo off for its whole call (what a skipped frame calls would otherwise be
    compiled as frames of their own: serving._retire's lock fails fullgraph=True)."""
    dynamo = sys.modules.get("torch._dynamo")
    disable = getattr(dynamo, "disable", None)
    return fn if disable is None else disable(fn)  # (no reason=: torch before 2.8 takes none)
