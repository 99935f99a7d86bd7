"""Sibling members left as written, called eagerly at nn.Linear's own host cost.

optimize() swaps a Linear no table names for a TunedLinear marked `_as_written` only so that its
sibling group (siblings.py) can run the members as one launch inside a CUDA-graph capture. A group
whose launch never pays eagerly (SiblingGroup.eager_one_row() false: every group of members left
as written, and groups whose weights stream in less than TUNEDB_EAGER_KERNEL_US) declines every eager call, yet TunedLinear.forward
still asked per call whether this call might be one to take: +0.50 us a call over nn.Linear in a
loop of its own and about +0.9 us in place (sessions 43-44, H100), 3-5% of an eager decode step of
a model no table names (ten members in a two-layer decoder, 24 in a tensor-parallel shard).

So once such a member's call was declined eagerly on a default stream (its group primed for that
row count where it could launch at all: more rows than TUNEDB_SIBLING_ROWS never launch, an
encoder's whole sequence), the member answers its eager calls with a forward of its
own (in its instance __dict__, which nn.Module.__call__ reads before the class's): F.linear of its
registered weight and bias for a CUDA tensor on a default stream (or a CPU tensor, or a
compiler's trace), TunedLinear.forward for anything else (a compiler's trace with
TUNEDB_COMPILED_SIBLINGS=1 too: the group's traced form, siblings_compile.py) (a side stream: torch's recommended
warm-up before a capture, which primes the group there). That is what nn.Linear.forward computes,
without its two Module.__getattr__ frames.

A capture runs on a side stream, where the quiet forward hands the call to TunedLinear.forward
and the group launches; the forward stays in place (Dynamo guards on a module's instance forward:
setting it aside for a capture made a model compiled while its members were quiet recompile inside
the capture, which invalidated it -- session 46, Llama-3-8B compiled then captured). Before a
capture begins (torch.cuda.CUDAGraph's capture_begin, wrapped once here: torch.cuda.graph,
make_graphed_callables and Inductor's CUDA-graph trees all begin through it) each quiet member's
group is primed at the row counts it has not run yet (one, a few, sixteen: the kernel's
specialisations), so no module is loaded and no workspace made inside the capture whatever rows
the capture calls with. A member going quiet after a model was compiled recompiles it once.
A quiet member is left by its group's refresh() (a member is served now), a
pickle, copy or DataParallel replica (TunedLinear's own), torch.jit.script
(TunedLinear.__prepare_scriptable__), a weight or bias no longer in its slot (a parametrization:
the call falls back to TunedLinear.forward). A capture begun past torch.cuda.CUDAGraph
(torch._C._CUDAGraph, torch.accelerator.Graph) still reaches the group (a side stream), but is
not primed before it begins: a row form the group never ran may load its module or make its
workspace inside that capture.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch
import torch.nn.functional as F

_captures = [0]  # CUDA-graph captures begun and not yet ended, in every thread
_QUIET: "weakref.WeakSet[Any]" = weakref.WeakSet()  # members whose quiet forward is installed
_LOCK = threading.Lock()  # enter / leave against a capture's begin and end in another thread
_wrapped = [False]
MARK = "_tunedb_quiet"  # an attribute of every quiet forward: TunedLinear drops them from copies
_Tensor = torch.Tensor
# the raw handle of a device's current stream (0: the legacy default stream, where torch refuses a
# capture); siblings.py reads the same getter
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def enter(member: Any) -> bool:
    """Install `member`'s quiet forward (the caller saw its group decline an eager call on a
    default stream, and that the group never launches eagerly); False where it cannot be: inside
    a capture, a weight not in its Parameter slot or a bias neither there nor None, a forward
    already in the instance (torch.jit.trace's), no stream getter or no capture hook."""
    d = member.__dict__
    params = member._parameters
    if "forward" in d or "weight" not in params or _RAW_STREAM is None:
        return False
    if "bias" not in params and not ("bias" in d and d["bias"] is None):
        return False
    with _LOCK:
        if _captures[0] or not _wrap_captures():
            return False
        fn = _forward(member, params)
        setattr(fn, MARK, True)
        d["forward"] = fn
        _QUIET.add(member)
    return True


def leave(members: Any) -> None:
    """Take the quiet forward off each of `members` (their group changed, a copy, a script)."""
    with _LOCK:
        for m in members:
            _QUIET.discard(m)
            if is_quiet(m.__dict__.get("forward")):
                del m.__dict__["forward"]


def is_quiet(fn: Any) -> bool:
    return getattr(fn, MARK, False) is True


def _forward(member: Any, params: dict[str, Any]) -> Any:
    """The quiet forward: it holds the layer's Parameter dict and a weak reference to the layer,
    never the layer or its __dict__ (which holds this function: a cycle would keep a deleted
    model's GPU memory until the cyclic collector ran)."""
    from tunedb.families.gemm.ops import _compiling as compiling  # the entry points' own check
    from tunedb.families.gemm.siblings_compile import _opted_in as grouped  # compiled groups (a trace's constant)

    linear, raw, ref = F.linear, _RAW_STREAM, weakref.ref(member)

    def forward(input: Any) -> Any:
        if type(input) is _Tensor and (not input.is_cuda or (not grouped() if compiling() else not raw(input.get_device()))):
            try:
                w = params["weight"]
                b = params["bias"] if "bias" in params else ref().__dict__["bias"]
            except KeyError:  # a parametrization took it out of its slot: the layer's own forward
                layer = ref()
                leave((layer,))
                return layer.forward(input)
            return linear(input, w, b)
        layer = ref()
        # a side stream (a warm-up: primes), a compiler's trace (siblings_compile), a subclass, a Proxy
        return type(layer).forward(layer, input)
    return forward


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
        try:
            _begun()
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
    """A capture begins: prime the quiet members' groups (outside the lock: a first prime
    compiles) on the stream about to be captured, before it captures."""
    groups: dict[int, Any] = {}
    with _LOCK:
        _captures[0] += 1
        for m in list(_QUIET):
            sib = m.__dict__.get("_siblings")
            if sib is not None and is_quiet(m.__dict__.get("forward")):
                groups[id(sib[0])] = sib[0]
    for group in groups.values():
        try:
            group.prime_forms()
        except Exception:  # noqa: BLE001 - best effort (memory for a priming input): never the capture's failure
            pass


def _ended() -> None:
    with _LOCK:
        _captures[0] = max(0, _captures[0] - 1)
