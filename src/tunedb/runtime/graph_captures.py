"""How many CUDA-graph captures torch's CUDAGraph has begun and not yet ended in this process: an
answer to "is a capture under way?" that costs a list read, for a caller for which either answer
is correct and only the cost differs.

Why: a sibling left as written (families/gemm/siblings.py) asks at every eager call whether a
capture is under way, since only in a capture does its group's one launch pay. The driver's own
answer (cudaStreamIsCapturing on the current stream, behind torch.cuda.is_current_stream_capturing)
cost 1-2 us a call on the H200's host (session 41: bench/linear_host_cost.py, a left-as-written
member 2.1 us over nn.Linear's 26 us), ten calls a forward of a decoder no table names.

How: watch() wraps torch.cuda.graphs.CUDAGraph.capture_begin / capture_end once, counting. Every
capture torch makes goes through them (torch.cuda.graph, make_graphed_callables, torch.compile's
CUDA-graph trees). A capture begun elsewhere (the C++ API) is not counted: active() then says no,
and the caller must be one for which that is still correct (a sibling runs alone, as written).
A capture in another thread is counted too: a caller then takes the capture's path eagerly, which
is correct, only slower. Nothing happens at import: the first watch() call wraps.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

_begun = [0]  # captures begun and not ended, every thread
_lock = threading.Lock()
_watching: list[bool] = []  # [True] once wrapped, [False] where torch has no such methods


def watch() -> bool:
    """Wrap torch's CUDAGraph capture methods once; whether the count is kept."""
    if _watching:
        return _watching[0]
    with _lock:
        if _watching:
            return _watching[0]
        try:
            import torch.cuda.graphs as graphs

            cls = graphs.CUDAGraph
            begin, end = cls.capture_begin, cls.capture_end
        except (ImportError, AttributeError):
            _watching.append(False)
            return False
        if not getattr(begin, "__tunedb_counted__", False):  # wrapped already (this module reloaded)
            cls.capture_begin = _counted_begin(begin)
            cls.capture_end = _counted_end(end)
        _watching.append(True)
        return True


def active() -> bool | None:
    """Whether a capture torch began is under way (in any thread); None when not watching."""
    if not _watching or not _watching[0]:
        return None
    return _begun[0] > 0


def _counted_begin(begin: Any) -> Any:
    @functools.wraps(begin)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _lock:
            _begun[0] += 1  # before: work the capture issues must see it
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            with _lock:
                _begun[0] -= 1
            raise
    capture_begin.__tunedb_counted__ = True  # type: ignore[attr-defined]
    return capture_begin


def _counted_end(end: Any) -> Any:
    @functools.wraps(end)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            with _lock:
                _begun[0] = max(_begun[0] - 1, 0)
    capture_end.__tunedb_counted__ = True  # type: ignore[attr-defined]
    return capture_end
