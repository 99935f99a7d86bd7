"""Sibling members left as written, called eagerly at nn.Linear's own host cost.

optimize() swaps a Linear no table names for a TunedLinear marked `_as_written` only so that its
sibling group (siblings.py) can run the members as one launch inside a CUDA-graph capture. A group
whose launch never pays eagerly (SiblingGroup.eager_one_row() false: every group of members left
as written, and groups under EAGER_MIN_BYTES) declines every eager call, yet TunedLinear.forward
still asked per call whether this call might be one to take: +0.50 us a call over nn.Linear in a
loop of its own and about +0.9 us in place (sessions 43-44, H100), 3-5% of an eager decode step of
a model no table names (ten members in a two-layer decoder, 24 in a tensor-parallel shard).

So once such a member's call was declined eagerly on a default stream (its group primed for that
row count where it could launch at all: more rows than TUNEDB_SIBLING_ROWS never launch, an
encoder's whole sequence), the member answers its eager calls with a forward of its
own (in its instance __dict__, which nn.Module.__call__ reads before the class's) that is F.linear
of its registered weight and bias and nothing else: what nn.Linear.forward computes, without its
two Module.__getattr__ frames. While any CUDA graph is being captured (torch.cuda.CUDAGraph's
capture_begin to capture_end, wrapped once here: torch.cuda.graph, make_graphed_callables and
Inductor's CUDA-graph trees all begin and end through them) those forwards are set aside, so the
capture sees TunedLinear.forward and the group's launch; capture_end puts the same objects back
(a compiled model's guard on a module's forward sees what it saw before). A quiet member is left
by its group's refresh() (a member is served now), a pickle or copy (TunedLinear.__getstate__), a
weight no longer registered (a parametrization: the call falls back to TunedLinear.forward), or
TUNEDB_SIBLINGS=0 at optimize() (no group at all). A capture begun through torch._C._CUDAGraph
directly is not seen: there the members run F.linear, a correct result without the group's gain.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
import torch.nn.functional as F

_captures = [0]  # CUDA-graph captures begun and not yet ended, in every thread
_QUIET: "weakref.WeakSet[Any]" = weakref.WeakSet()  # members whose quiet forward is installed
_SET_ASIDE: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # during captures
_wrapped = [False]
MARK = "_tunedb_quiet"  # an attribute of every quiet forward: TunedLinear.__getstate__ drops them


def enter(member: Any) -> bool:
    """Install `member`'s quiet forward (the caller saw its group decline an eager call on a
    default stream after priming, and that the group never launches eagerly); False where it
    cannot be: inside a capture, a weight or bias not registered as a Parameter slot, a forward
    already in the instance (torch.jit.trace's), or no capture hook."""
    d = member.__dict__
    params = member._parameters
    if _captures[0] or "forward" in d or "weight" not in params or not _wrap_captures():
        return False
    if "bias" in params:
        fn = _with_bias(member, params)
    elif "bias" in d and d["bias"] is None:
        fn = _without_bias(member, params)
    else:
        return False
    setattr(fn, MARK, True)
    d["forward"] = fn
    _QUIET.add(member)
    return True


def leave(members: Any) -> None:
    """Take the quiet forward off each of `members` (their group changed: refresh())."""
    for m in members:
        _SET_ASIDE.pop(m, None)
        _QUIET.discard(m)
        if is_quiet(m.__dict__.get("forward")):
            del m.__dict__["forward"]


def is_quiet(fn: Any) -> bool:
    return getattr(fn, MARK, False) is True


def _with_bias(member: Any, params: dict[str, Any]) -> Any:
    linear = F.linear

    def forward(input: Any) -> Any:
        try:
            w, b = params["weight"], params["bias"]
        except KeyError:  # a parametrization took the weight out of its slot: the layer's own forward
            return _fall_back(member, input)
        return linear(input, w, b)
    return forward


def _without_bias(member: Any, params: dict[str, Any]) -> Any:
    linear = F.linear

    def forward(input: Any) -> Any:
        try:
            w = params["weight"]
        except KeyError:
            return _fall_back(member, input)
        return linear(input, w)
    return forward


def _fall_back(member: Any, input: Any) -> Any:
    leave((member,))
    return member.forward(input)


def _wrap_captures() -> bool:
    """Wrap torch.cuda.CUDAGraph's capture_begin and capture_end once (True when wrapped)."""
    if _wrapped[0]:
        return True
    graphs = getattr(torch.cuda, "graphs", None)
    cls = getattr(graphs, "CUDAGraph", None)
    begin, end = getattr(cls, "capture_begin", None), getattr(cls, "capture_end", None)
    if not callable(begin) or not callable(end):
        return False

    @functools.wraps(begin)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        _begun()
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            _ended()
            raise

    @functools.wraps(end)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            _ended()

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    _wrapped[0] = True
    return True


def _begun() -> None:
    _captures[0] += 1
    for m in list(_QUIET):
        fn = m.__dict__.get("forward")
        if is_quiet(fn):
            del m.__dict__["forward"]
            _SET_ASIDE[m] = fn


def _ended() -> None:
    _captures[0] = max(0, _captures[0] - 1)
    if _captures[0]:
        return
    for m, fn in list(_SET_ASIDE.items()):
        if "forward" not in m.__dict__ and m in _QUIET:
            m.__dict__["forward"] = fn
    _SET_ASIDE.clear()
