"""The GEMM launch path: one cached closure per (config, signature), so a call does no parsing,
and one launch site per kernel in it (triton_launch.Site), so a call does no argument binding.

An inherently torch module (imported lazily by the family). Every Triton lane writes a
contiguous [M, N] output; x is made contiguous when it is not (as a view of [M, K]).
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable

import torch

from tunedb.families.gemm import arms, configs
from tunedb.families.gemm.kernel_specs import grid_of, specs
from tunedb.families.gemm.kernels_common import ACT_CODES
from tunedb.families.gemm.triton_launch import Site
from tunedb.records import Config, Signature

# Point Triton at tunedb's cache (what `tunedb prebuild` fills) unless the user chose one.
if not os.environ.get("TRITON_CACHE_DIR"):
    from tunedb import settings as _settings

    os.environ["TRITON_CACHE_DIR"] = str(_settings.triton_cache_dir())

Launcher = Callable[[Any, Any, Any, Any], Any]
_LAUNCHERS: dict[tuple[str, Signature], Launcher] = {}
_SMS: dict[int, int] = {}


def launch(config: Config, sig: Signature, x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """y = act(x @ weight.T + bias) with `config`, into `out` when given (contiguous [..., N])."""
    fn = _LAUNCHERS.get((config.id, sig))
    if fn is None:
        fn = _LAUNCHERS.setdefault((config.id, sig), _build(config, sig))
    return fn(x, weight, bias, out)


def launcher(config: Config, sig: Signature) -> Launcher:
    """The cached closure `fn(x, weight, bias, out)` for (config, sig): for callers that hold it."""
    key = (config.id, sig)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = _build(config, sig)
    return _LAUNCHERS[key]


def _build(config: Config, sig: Signature) -> Launcher:
    if config.id == "default":
        return _build(configs.default_config(sig), sig)
    if config.id == "torch":
        run = arms.torch_arm(sig)
        if sig.get("act", "none") == "none":  # what run(x, weight, bias, None) computes, minus its frame
            run.direct = torch.nn.functional.linear  # type: ignore[attr-defined]
        return run
    if config.id == "fused":
        return arms.fused_arm(sig)
    if config.is_sentinel:
        raise ValueError(f"the GEMM family has no {config.id!r} arm; sentinels: {', '.join(configs.GEMM_SENTINELS)}")
    why = configs.sig_reason(sig)
    if why:
        raise ValueError(f"cannot launch {sig.format()!r}: {why}")
    build = {"triton_mma": _tiled, "triton_tma": _tiled, "triton_splitk": _splitk,
             "triton_decode": _decode}[config.lane]
    return build(config, sig)


def _prologue(sig: Signature):
    n, k = sig.get("N"), sig.get("K")
    has_bias = int(sig.get("bias", 0) == 1)
    act = ACT_CODES[sig.get("act", "none")]

    def prep(x, weight, bias, out):
        x2 = x.view(-1, k) if x.is_contiguous() else x.reshape(-1, k).contiguous()
        if not weight.is_contiguous():
            weight = weight.contiguous()
        if (bias is not None) != bool(has_bias):
            raise ValueError(f"{sig.format()} {'needs' if has_bias else 'takes no'} bias")
        if has_bias and not bias.is_contiguous():  # the epilogue reads it at stride 1 (ops copy it first too)
            bias = bias.contiguous()
        if out is None:
            out = x.new_empty((*x.shape[:-1], n))
        elif not out.is_contiguous() or out.dtype != x.dtype or out.numel() != x2.shape[0] * n:
            raise ValueError(f"out must be a contiguous {x.dtype} tensor of {x2.shape[0] * n} elements, "
                             f"got {out.dtype} {list(out.shape)} contiguous={out.is_contiguous()}")
        return x2, weight, (bias if has_bias else x2), out

    return prep, n, k, has_bias, act


def _tiled(config: Config, sig: Signature) -> Launcher:
    """One kernel over output tiles: the triton_mma and triton_tma lanes."""
    (spec,) = specs(config)
    prep, n, k, has_bias, act = _prologue(sig)
    site = Site(spec.kernel, (n, k, has_bias, act), spec.kwargs())
    grid = grid_of(spec, n)
    if not spec.persistent:
        def run(x, weight, bias, out):
            x2, w, b, y = prep(x, weight, bias, out)
            m = x2.shape[0]
            if m:
                site(grid(m, 0), x2, w, y, b, m)
            return y

        return run

    # Device-side tensor descriptors: 16-byte-aligned bases and Triton's scratch allocator.
    scratch = _scratch_allocator()

    def run_tma(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m:
            if x2.data_ptr() % 16:
                x2 = x2.clone()
            if w.data_ptr() % 16:
                w = w.clone()
            scratch()
            site(grid(m, _num_sms(x.get_device()) if x.is_cuda else 4), x2, w, y, b, m)
        return y

    return run_tma


_DECODE_SCRATCH: dict[tuple[str, Signature], dict[Any, tuple[Any, Any]]] = {}


def decode_scratch(config: Config, sig: Signature) -> dict[Any, tuple[Any, Any]]:
    """The per-device split-K buffers of a decode config, shared with its `_pdl` twin (the same
    sizes; runtime/capture_chain.switch runs one of the two per call). Without the sharing, a twin
    first run inside a capture made its own buffers there: two fill kernels between the GEMM it
    follows and itself, so it no longer followed ours (and paid them at every replay)."""
    return _DECODE_SCRATCH.setdefault((plain_decode_id(config.id), sig), {})


def plain_decode_id(config_id: str) -> str:
    """A decode config's id without PDL: `_pdl` dropped, and `_pfw` (dependents launched after
    the wait, which exists only with PDL) made the same prefetch without it (`_pf`)."""
    return re.sub(r"(_pfn?)w(\d+)", r"\1\2", config_id.removesuffix("_pdl"))


def splitk_scratch(scratch: dict[Any, tuple[Any, Any]], x: Any, ws_elems: int,
                   counters: int) -> tuple[Any, Any]:
    """A zeroed split-K workspace and counters on x's device for a decode launcher, kept in
    `scratch` under x.get_device() (the kernels leave both zero after each call; an index, not
    x.device, which builds a torch.device per call). Buffers made inside a graph capture
    are zeroed only when the graph replays: they stay that graph's, and the next eager call makes
    (and keeps) its own."""
    bufs = (torch.zeros(ws_elems, dtype=torch.float32, device=x.device),
            torch.zeros(counters, dtype=torch.int32, device=x.device))
    if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        scratch[x.get_device()] = bufs
    return bufs


def _scratch_allocator() -> Callable[[], None]:
    """`ensure()`: makes Triton's allocator (a context variable, so a thread that never set one sees
    the null allocator) ours where it is missing; one ContextVar read per call after the first."""
    import triton

    try:
        from triton.runtime._allocation import _NULL_ALLOCATOR, _allocator
    except ImportError:  # another Triton's layout: set it on every call (it may be per thread)
        return lambda: triton.set_allocator(_scratch)

    def ensure() -> None:
        if _allocator.get() is _NULL_ALLOCATOR:
            triton.set_allocator(_scratch)

    return ensure


def _scratch(size: int, alignment: int, stream: Any) -> Any:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _num_sms(index: int) -> int:
    """The SM count of CUDA device `index` (x.get_device() of a CUDA tensor), looked up once."""
    sms = _SMS.get(index)
    if sms is None:
        sms = _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return sms


def _splitk(config: Config, sig: Signature) -> Launcher:
    partial, reduce = specs(config)
    split = config.param("split_k")
    prep, n, k, has_bias, act = _prologue(sig)
    partial_site = Site(partial.kernel, (n, k), partial.kwargs())
    reduce_site = Site(reduce.kernel, (n, has_bias, act), reduce.kwargs())
    partial_grid, reduce_grid = grid_of(partial, n), grid_of(reduce, n)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m:
            ws = x2.new_empty((split, m, n), dtype=torch.float32)
            partial_site(partial_grid(m, 0), x2, w, ws, m)
            reduce_site(reduce_grid(m, 0), ws, y, b, m)
        return y

    return run


def _decode(config: Config, sig: Signature) -> Launcher:
    """The triton_decode lane: one kernel, M <= 16, its workspace and counters allocated once per
    device (the kernel leaves them zero). One closure serves one stream at a time: two streams
    running the same (config, signature) concurrently would share the counters."""
    from tunedb.families.gemm import configs_gemv, kernels_decode

    if configs_gemv.is_gemv(config):  # the GEMV kernel (`gv`): its own launcher, same scratch
        from tunedb.families.gemm.launch_gemv import launcher as gemv_launcher

        return gemv_launcher(config, sig)
    spec = kernels_decode.spec(config)
    prep, n, k, has_bias, act = _prologue(sig)
    site = Site(spec.kernel, (n, k, has_bias, act), spec.kwargs(interpret=_interpreting()))
    grid = kernels_decode.grid_of(spec, n, k)
    ws_elems, counters = kernels_decode.workspace_sizes(spec, n, k)
    scratch = decode_scratch(config, sig)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m > kernels_decode.BM_PAD:  # the validity predicate refuses it; so does the launch
            raise ValueError(f"{config.id} (triton_decode) serves M <= {kernels_decode.BM_PAD}, got M={m}")
        if m:
            bufs = scratch.get(x2.get_device()) or splitk_scratch(scratch, x2, ws_elems, counters)
            site(grid(m, 0), x2, w, y, b, bufs[0], bufs[1], m)
        return y

    return run


def _interpreting() -> bool:
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # an older Triton: its env var
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
