"""Launching the bf16/fp16 GEMV kernel (kernels_gemv.py, `gv` configs) as the GEMM family launches
its lanes: `launcher(config, sig)` -> fn(x, weight, bias, out), one cached closure per (config,
signature), one launch site per MP (the kernel's padded rows: 1, 2, 4 on the FMA path, 16 on the
tensor-core path), its split-K workspace and counters allocated once per device (the kernel
leaves them zero). Torch module (imported lazily). The family's launch path (launch._decode)
sends `gv` configs here, so a table entry serving one runs through this closure, captured or not
(splitk_scratch keeps buffers made inside a capture to that graph).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tunedb.families.gemm import configs_gemv
from tunedb.families.gemm.kernels_gemv import spec
from tunedb.families.gemm.launch import _interpreting, _prologue, decode_scratch, plain_decode_id, splitk_scratch
from tunedb.families.gemm.triton_launch import Site
from tunedb.records import Config, Signature

_LAUNCHERS: dict[tuple[str, Signature], Callable[..., Any]] = {}
_HALF = (torch.bfloat16, torch.float16)


def pdl_pair(config: Config) -> tuple[Config, Config, Callable[..., bool]] | None:
    """(the config without PDL, its `_pdl` twin, static_weight) for a decode-lane config (`gv`,
    `dk`, `ds`) where this Triton and GPU launch PDL, else None (runtime/capture_chain.switch
    launches the twin where a captured call follows one of ours).

    A `_pdl` kernel loads weight tiles before gdc_wait, i.e. possibly before the kernel ahead of
    it has finished: right only when that kernel did not write the weight. After one of our GEMMs
    (capture_chain) that holds unless that GEMM computed the weight, so the weight must also be a
    module's nn.Parameter (a weight computed in the forward, by a parametrization or a GEMM, is a
    plain tensor)."""
    if config.lane != configs_gemv.LANE or config.is_sentinel or not _pdl_here():
        return None
    from tunedb.errors import ConfigError
    from tunedb.families.gemm import config_ids

    try:
        if config.param("pdl"):
            return config_ids.parse(plain_decode_id(config.id)), config, static_weight
        return config, config_ids.parse(config.id + "_pdl"), static_weight
    except ConfigError:  # an id whose grammar has no PDL twin
        return None


def _pdl_here() -> bool:
    from tunedb.families.gemm.configs_decode import pdl_supported

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) and pdl_supported()


def static_weight(x: Any, weight: Any, *rest: Any) -> bool:
    """Whether this call may read `weight` before the previous kernel finishes (pdl_pair)."""
    # a non-contiguous Parameter is copied by the launcher right before the kernel: that copy
    # would be the kernel the twin's early weight reads overlap
    return isinstance(weight, torch.nn.Parameter) and weight.is_contiguous()


def launcher(config: Config | str, sig: Signature) -> Callable[..., Any]:
    """fn(x, weight, bias, out) -> y = act(x @ weight.T + bias) with the `gv` config, into `out`
    when given; ValueError naming the bad value for an M, dtype or split the config cannot serve."""
    cfg = configs_gemv.parse_gemv(config) if isinstance(config, str) else config
    key = (cfg.id, sig)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = _build(cfg, sig)
    return _LAUNCHERS[key]


def _build(cfg: Config, sig: Signature) -> Callable[..., Any]:
    sp = spec(cfg)
    prep, n, k, has_bias, act = _prologue(sig)
    interpret = _interpreting()
    why = configs_gemv.gemv_reason(cfg, n, k, 1, sig.dt)
    if why:
        raise ValueError(f"{cfg.id} cannot serve {sig.format()}: {why}")
    dot = bool(cfg.param("dot"))
    top = configs_gemv.max_m(cfg)  # the per-call check: one comparison (the rules are monotone in M)
    pads = [configs_gemv.rows_padded(m, dot) for m in range(top + 1)]  # MP by M, looked up per call
    sites: dict[int, Site] = {}
    grid = sp.grid(n)
    ws_elems, counters = sp.workspace_sizes(n)
    scratch = decode_scratch(cfg, sig)

    def run(x, weight, bias, out):
        x2, w, b, y = prep(x, weight, bias, out)
        m = x2.shape[0]
        if not m:
            return y
        if m > top:
            raise ValueError(f"{cfg.id} cannot serve M={m}: {configs_gemv.gemv_reason(cfg, n, k, m, sig.dt)}")
        dt = x2.dtype
        if dt is not w.dtype or dt not in _HALF:
            raise ValueError(f"{cfg.id} takes bf16 or fp16 x and weight of one dtype, got {x2.dtype}, {w.dtype}")
        mp = pads[m]
        site = sites.get(mp)
        if site is None:
            site = sites[mp] = Site(sp.kernel, (n, k, has_bias, act), sp.kwargs(mp, interpret))
        bufs = scratch.get(x2.get_device()) or splitk_scratch(scratch, x2, ws_elems, counters)
        site(grid, x2, w, y, b, bufs[0], bufs[1], m)
        return y

    return run
