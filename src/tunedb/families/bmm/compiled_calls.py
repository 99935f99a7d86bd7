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


def frame_callback() -> Callable[[], Any]:
    """The getter of Dynamo's frame callback (torch's C function: no Python frame per call). Its
    answer is not None while a compiled call runs on this thread: a torch.compile'd module's, whose
    hooks run as Python inside it, or any compiled function's that runs the caller as Python after
    a graph break (None outside one, under torch.compiler.disable, and before Dynamo is first
    used). It is per thread, unlike torch's process-wide `_is_in_optimized_module` flag, which
    another thread's compiled call sets. A torch without it: never a compiled call."""
    dynamo = getattr(sys.modules.get("torch._C"), "_dynamo", None)
    getter = getattr(getattr(dynamo, "eval_frame", None), "get_eval_frame_callback", None)
    return getter if getter is not None else (lambda: None)


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
