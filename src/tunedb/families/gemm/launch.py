"""The GEMM launch path: one cached closure per (config, signature), so a call does no parsing,
and one launch site per kernel in it (triton_launch.Site), so a call does no argument binding.

An inherently torch module (imported lazily by the family). Every Triton lane writes a
contiguous [M, N] output; x is made contiguous when it is not (as a view of [M, K]).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from tunedb.families.gemm import arms, configs
from tunedb.families.gemm.kernel_specs import REDUCE_BM, REDUCE_BN, specs
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
        return arms.torch_arm(sig)
    if config.id == "fused":
        return arms.fused_arm(sig)
    if config.is_sentinel:
        raise ValueError(f"the GEMM family has no {config.id!r} arm; sentinels: {', '.join(configs.GEMM_SENTINELS)}")
    why = configs.sig_reason(sig)
    if why:
        raise ValueError(f"cannot launch {sig.format()!r}: {why}")
    build = {"triton_mma": _mma, "triton_tma": _tma, "triton_splitk": _splitk}[config.lane]
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
        if out is None:
            out = x.new_empty((*x.shape[:-1], n))
        elif not out.is_contiguous() or out.dtype != x.dtype or out.numel() != x2.shape[0] * n:
            raise ValueError(f"out must be a contiguous {x.dtype} tensor of {x2.shape[0] * n} elements, "
                             f"got {out.dtype} {list(out.shape)} contiguous={out.is_contiguous()}")
        return x2, weight, (bias if has_bias else x2), out

    return prep, n, k, has_bias, act


def _mma(config: Config, sig: Signature) -> Launcher:
    (spec,) = specs(config)
    bm, bn, _ = configs.blocks(config)
    prep, n, k, has_bias, act = _prologue(sig)
    site = Site(spec.kernel, (n, k, has_bias, act), spec.kwargs())
    tiles_n = -(-n // bn)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m:
            site((-(-m // bm) * tiles_n,), x2, w, y, b, m)
        return y

    return run


def _set_allocator() -> None:
    """Device-side tensor descriptors need scratch memory; Triton's allocator is a context variable,
    so a thread that never set one sees the null allocator: set it where it is missing."""
    import triton

    try:
        from triton.runtime._allocation import _NULL_ALLOCATOR, _allocator

        if _allocator.get() is not _NULL_ALLOCATOR:
            return
    except ImportError:
        pass
    triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream: Any) -> Any:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _num_sms(device: Any) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _tma(config: Config, sig: Signature) -> Launcher:
    (spec,) = specs(config)
    bm, bn, _ = configs.blocks(config)
    prep, n, k, has_bias, act = _prologue(sig)
    site = Site(spec.kernel, (n, k, has_bias, act), spec.kwargs())
    tiles_n = -(-n // bn)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m:
            if x2.data_ptr() % 16:  # a tensor descriptor's base must be 16-byte aligned
                x2 = x2.clone()
            if w.data_ptr() % 16:
                w = w.clone()
            _set_allocator()
            sms = _num_sms(x.device) if x.is_cuda else 4
            site((min(sms, -(-m // bm) * tiles_n),), x2, w, y, b, m)
        return y

    return run


def _splitk(config: Config, sig: Signature) -> Launcher:
    partial, reduce = specs(config)
    bm, bn, _ = configs.blocks(config)
    split = config.param("split_k")
    prep, n, k, has_bias, act = _prologue(sig)
    partial_site = Site(partial.kernel, (n, k), partial.kwargs())
    reduce_site = Site(reduce.kernel, (n, has_bias, act), reduce.kwargs())
    tiles_n = -(-n // bn)
    red_n = -(-n // REDUCE_BN)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if m:
            ws = x2.new_empty((split, m, n), dtype=torch.float32)
            partial_site((-(-m // bm) * tiles_n, split), x2, w, ws, m)
            reduce_site((-(-m // REDUCE_BM), red_n), ws, y, b, m)
        return y

    return run
