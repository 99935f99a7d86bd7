"""Inside a CUDA-graph capture: does this call directly follow a tunedb launch?

A decode-lane GEMM (M <= 16) is a weight stream of a few microseconds, and a kernel of that length
pays its ramp (launch, the first DRAM round trips) and its drain in full. Launched with
programmatic dependent launch (PDL) after a kernel that triggers its dependents early, it requests
its weight while that kernel drains (session 34, bench/gv_prefetch.py, back to back in one graph at
M=1: 4096x4096 10.5 -> 10.1 us a call, 1024x4096 6.5 -> 5.5 us; a Llama-3-8B layer with torch's
norms and attention between the GEMMs 200 -> 184 us when only the GEMMs that follow a GEMM used
PDL, 189 us when all did). After a kernel that does not trigger early (torch's), a PDL launch
gains little and can lose (the build's protocol puts a separator kernel after each call: there the
PDL twins measured up to 1.4 us slower). So a family's PDL twin serves a call only when the
capture's last node is a launch of ours: the stream's capture dependencies, read through the
driver (cuStreamGetCaptureInfo), are exactly the node our previous call added.

Off by default (TUNEDB_CHAIN_PDL=1 turns it on): in the Llama-3-8B decode model itself (session 34,
bench/chain_pdl_e2e.py, batch 1, graphs) the twins after ours made the forward slower, 1.086x ->
1.056x of plain (4 of 12 GEMM calls followed ours; every call as a twin: 1.005x), where the layer
chain above, launched straight from Python, gained; the cause is not isolated. With it off, a
measured `_pdl` config still goes through the switch, and runs without PDL.

Safety: a PDL kernel reads the weight before gdc_wait. When the node before it is one of our GEMMs
the weight was complete before that GEMM started (its own wait, or plain stream order), unless
that GEMM wrote it: the family's admits() check (an nn.Parameter weight, never a GEMM's output)
covers that. Outside capture, with several dependencies, with TUNEDB_CHAIN_PDL=0 or where the
driver query is unavailable, the config launches as measured. Nothing here runs at import.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

_query_fn: list[Any] = []  # [the driver function or None], resolved on first use
_last: dict[int, tuple[int, int]] = {}  # stream handle -> (capture id, the node our last call added)


def _driver_query() -> Any:
    if not _query_fn:
        fn = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuStreamGetCaptureInfo_v2  # (stream, status*, id*, graph*, deps**, ndeps*)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64),
                           ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)),
                           ctypes.POINTER(ctypes.c_size_t)]
        except (OSError, AttributeError):
            fn = None
        _query_fn.append(fn)
    return _query_fn[0]


def capture_info(stream: int) -> tuple[int, tuple[int, ...]] | None:
    """(capture id, the capture's current dependency nodes) of an actively capturing stream, else
    None (not capturing, or no driver query here)."""
    fn = _driver_query()
    if fn is None:
        return None
    status, cid, graph = ctypes.c_int(0), ctypes.c_uint64(0), ctypes.c_void_p(0)
    deps, ndeps = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t(0)
    if fn(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(cid), ctypes.byref(graph),
          ctypes.byref(deps), ctypes.byref(ndeps)) != 0 or status.value != 1:
        return None
    return cid.value, tuple(int(deps[i] or 0) for i in range(ndeps.value))


def follows_ours(stream: int) -> bool:
    """Whether the capture's only dependency is the node our last call on `stream` added."""
    info = capture_info(stream)
    last = _last.get(stream)
    return info is not None and last is not None and len(info[1]) == 1 and (info[0], info[1][0]) == last


def note(stream: int) -> None:
    """Record the node a call of ours just added (the capture's only dependency now)."""
    info = capture_info(stream)
    if info is not None and len(info[1]) == 1:
        _last[stream] = (info[0], info[1][0])
    else:
        _last.pop(stream, None)


def _capturing_stream() -> int | None:
    import torch

    if not torch.cuda.is_current_stream_capturing():
        return None
    return int(torch.cuda.current_stream().cuda_stream)


def pdl_switch(family: Any, config: Any, sig: Any, make: Callable[..., Callable[..., Any]]) -> Callable[..., Any] | None:
    """launch_table.bind's launcher for a config the family pairs with a PDL twin (its pdl_pair
    hook): switch(make(plain), make(twin), admits), or None to keep the config's own launcher.
    With TUNEDB_CHAIN_PDL off a plain config has nothing to switch to (the hook is not asked); a
    measured `_pdl` config is still switched: it runs its plain twin unless a call is admitted."""
    from tunedb import settings
    from tunedb.families.contract import has_hook, hook

    if config.is_sentinel or not has_hook(family, "pdl_pair"):
        return None
    if not settings.chain_pdl_enabled() and not config.param("pdl"):
        return None
    pair = hook(family, "pdl_pair")(config)
    if pair is None:
        return None
    plain, pdl, admits = pair
    return switch(make(family, plain, sig), make(family, pdl, sig), admits)


def switch(plain: Callable[..., Any], pdl: Callable[..., Any], admits: Callable[..., bool]) -> Callable[..., Any]:
    """A launcher running `pdl` for a captured call that follows one of ours and that admits(*args)
    allows, `plain` for every other call; every captured call is noted as ours."""
    from tunedb import settings

    def call(*args: Any, **kwargs: Any) -> Any:
        stream = _capturing_stream()
        if stream is None:
            return plain(*args, **kwargs)
        use = pdl if settings.chain_pdl_enabled() and follows_ours(stream) and admits(*args) else plain
        out = use(*args, **kwargs)
        note(stream)
        return out

    call.plain, call.pdl = plain, pdl  # type: ignore[attr-defined]
    return call
