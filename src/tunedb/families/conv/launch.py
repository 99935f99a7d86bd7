"""The conv family's launch path: a config id -> the callable that runs one call (imports torch;
triton only for the Triton lanes).

Every arm takes the op's arguments (x, weight, bias, stride, padding, dilation, groups, act) and
reads the geometry from the signature (the call key already checked that they agree). A Triton
arm writes into `out` when given (contiguous [B, Cout, *spatial]), else allocates it; a call
whose tensors exceed the kernels' int32 offsets runs the torch arm instead (the validity
predicate's size rule asked with the call's real sizes).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import torch

from tunedb.errors import ConfigError
from tunedb.families.conv import arms, configs, keys
from tunedb.records import Config, Signature


def _torch_arm(sig: Signature, benchmark: bool, channels_last: bool) -> Callable[..., Any]:
    def run(x, weight, bias=None, *_, out=None, **__):
        y = arms.torch_conv(sig, x, weight, bias, benchmark, channels_last)
        if out is not None:
            out.copy_(y)
            return out
        return y
    return run


def _dw_arm(cfg: Config, sig: Signature) -> Callable[..., Any]:
    from tunedb.families.conv.kernels import ACT_CODES, dw_conv1d_kernel

    bt, bc = cfg.param("block")
    warps = cfg.param("warps")
    g = keys.geometry(sig)
    k, s, p, d = g["k"][0], g["s"][0], g["p"][0], g["d"][0]
    act = ACT_CODES[sig.get("act", "none")]
    fallback = _torch_arm(sig, False, False)

    def run(x, weight, bias=None, *_, out=None, **__):
        bsz, c, t = x.shape
        t_out = keys.out_len(t, k, s, p, d)
        if configs.size_reason(x.numel(), bsz * c * t_out):
            return fallback(x, weight, bias, out=out)
        y = out if out is not None else torch.empty((bsz, c, t_out), device=x.device, dtype=x.dtype)
        w = weight if weight.is_contiguous() else weight.contiguous()
        b = w if bias is None else bias if bias.is_contiguous() else bias.contiguous()  # read at stride 1
        grid = (triton_cdiv(t_out, bt), triton_cdiv(c, bc), bsz)
        dw_conv1d_kernel[grid](x, w, b, y, c, t, t_out,
                               *x.stride(), *y.stride(), KSIZE=k, STRIDE=s, PAD=p, DIL=d,
                               HAS_BIAS=bias is not None, ACT=act, BT=bt, BC=bc, num_warps=warps)
        return y
    return run


def _igemm_arm(cfg: Config, sig: Signature) -> Callable[..., Any]:
    from tunedb.families.conv.kernels import ACT_CODES, igemm_kernel

    bm, bn, bk = cfg.param("block")
    warps, stages = cfg.param("warps"), cfg.param("stages")
    g = keys.geometry(sig)
    conv1d = sig.op == "conv1d"
    # conv1d runs as a conv2d of height 1
    kh, kw = (1, g["k"][0]) if conv1d else g["k"]
    sh, sw = (1, g["s"][0]) if conv1d else g["s"]
    ph, pw = (0, g["p"][0]) if conv1d else g["p"]
    dh, dw = (1, g["d"][0]) if conv1d else g["d"]
    act = ACT_CODES[sig.get("act", "none")]
    cout = sig.get("Cout")
    k_total = sig.get("Cin") * kh * kw
    fallback = _torch_arm(sig, False, False)

    def run(x, weight, bias=None, *_, out=None, **__):
        if conv1d:
            bsz, _c, h_in, w_in = x.shape[0], x.shape[1], 1, x.shape[2]
            sxb, sxc, sxw = x.stride()
            sxh = 0
        else:
            bsz, _c, h_in, w_in = x.shape
            sxb, sxc, sxh, sxw = x.stride()
        h_out = keys.out_len(h_in, kh, sh, ph, dh)
        w_out = keys.out_len(w_in, kw, sw, pw, dw)
        m = bsz * h_out * w_out
        if configs.size_reason(x.numel(), m * cout):
            return fallback(x, weight, bias, out=out)
        shape = (bsz, cout, w_out) if conv1d else (bsz, cout, h_out, w_out)
        y = out if out is not None else torch.empty(shape, device=x.device, dtype=x.dtype)
        if conv1d:
            syb, syc, syw = y.stride()
            syh = 0
        else:
            syb, syc, syh, syw = y.stride()
        w = weight if weight.is_contiguous() else weight.contiguous()
        b = w if bias is None else bias if bias.is_contiguous() else bias.contiguous()  # read at stride 1
        grid = (triton_cdiv(m, bm), triton_cdiv(cout, bn))
        igemm_kernel[grid](x, w, b, y, m, cout, k_total, h_in, w_in, h_out, w_out,
                           sxb, sxc, sxh, sxw, syb, syc, syh, syw,
                           KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw,
                           HAS_BIAS=bias is not None, ACT=act, BM=bm, BN=bn, BK=bk,
                           num_warps=warps, num_stages=stages)
        return y
    return run


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=4096)
def launcher(cfg: Config, sig: Signature) -> Callable[..., Any]:
    """The callable running `sig` with `cfg`; ConfigError when the arm cannot compute this key."""
    why = configs.lane_reason(cfg, sig)
    if why:
        raise ConfigError(f"conv config {cfg.id} cannot run {sig}: {why}")
    if cfg.id in configs.FAMILY_SENTINELS:
        return _torch_arm(sig, False, False)
    if cfg.lane == "cudnn":
        return _torch_arm(sig, bool(cfg.param("benchmark")), bool(cfg.param("channels_last")))
    if cfg.lane == "triton_dw":
        return _dw_arm(cfg, sig)
    return _igemm_arm(cfg, sig)


def launch(cfg: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
    return launcher(cfg, sig)(*args, out=out)
