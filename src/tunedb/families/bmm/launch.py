"""The batched product's launch path: one cached closure per (config, signature).

`run(a, b, out=None)` returns c [B, M, N] (2-D operands: [M, N]) in the operands' dtype; `out`
(any strides, the right shape and dtype) is written in place. Arms: `torch` / `default`
(torch.bmm, cuBLAS) and the Triton tiles. No host synchronisation and no copies of strided
operands: CUDA graphs capture the launches. An inherently torch module (imported lazily).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tunedb.families.bmm import configs
from tunedb.records import Config, Signature

Launcher = Callable[..., Any]
_LAUNCHERS: dict[tuple[str, Signature], Launcher] = {}
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def launcher(config: Config, sig: Signature) -> Launcher:
    key = (config.id, sig)
    fn = _LAUNCHERS.get(key)
    if fn is None:
        fn = _LAUNCHERS.setdefault(key, _build(config, sig))
    return fn


def launch(config: Config, sig: Signature, a: Any, b: Any, out: Any = None) -> Any:
    return launcher(config, sig)(a, b, out)


def _as3(a: Any, b: Any) -> tuple[Any, Any, bool]:
    if a.dim() == 2:
        return a.unsqueeze(0), b.unsqueeze(0), True
    return a, b, False


def _out(a3: Any, b3: Any, out: Any, flat: bool) -> Any:
    shape = (a3.shape[0], a3.shape[1], b3.shape[2])
    if out is None:
        return torch.empty(shape, dtype=a3.dtype, device=a3.device)
    o3 = out.unsqueeze(0) if flat else out
    if tuple(o3.shape) != shape or o3.dtype != a3.dtype:
        raise ValueError(f"out must be a {a3.dtype} tensor of shape {list(shape[1:] if flat else shape)}, "
                         f"got {out.dtype} {list(out.shape)}")
    return o3


def _build(config: Config, sig: Signature) -> Launcher:
    why = configs.sig_reason(sig)
    if why:
        raise ValueError(f"cannot launch {sig.format()!r}: {why}")
    if config.id in configs.FAMILY_SENTINELS:
        return _torch
    if config.is_sentinel:
        raise ValueError(f"the bmm family has no {config.id!r} arm; sentinels: {', '.join(configs.FAMILY_SENTINELS)}")
    return _triton(config)


def _torch(a: Any, b: Any, out: Any = None) -> Any:
    a3, b3, flat = _as3(a, b)
    if out is None:
        c = torch.bmm(a3, b3)
    else:
        c = _out(a3, b3, out, flat)
        if c.is_contiguous():
            torch.bmm(a3, b3, out=c)
        else:
            c.copy_(torch.bmm(a3, b3))
    return c.squeeze(0) if flat else c


def _triton(config: Config) -> Launcher:
    from tunedb.families.bmm.kernels import bmm_kernel

    bm, bn, bk = configs.blocks(config)
    kw = dict(BM=bm, BN=bn, BK=bk, GROUP_M=config.param("group_m"), num_warps=config.param("warps"),
              num_stages=config.param("stages"))

    def run(a, b, out=None):
        if a.dtype != b.dtype:
            raise ValueError(f"bmm operands must share a dtype, got a {a.dtype}, b {b.dtype}")
        a3, b3, flat = _as3(a, b)
        c = _out(a3, b3, out, flat)
        batch, m, k = a3.shape
        n = b3.shape[2]
        if batch and m and n:
            grid = (-(-m // bm) * -(-n // bn), batch)
            bmm_kernel[grid](a3, b3, c, m, n, k, *a3.stride(), *b3.stride(), *c.stride(),
                             IEEE=a3.dtype == torch.float32, **kw)
        return c.squeeze(0) if flat else c

    return run


def reference(sig: Signature, a: Any, b: Any, dtype: Any = None) -> Any:
    """The product on upcast operands, in that dtype: fp32 for 16-bit keys, fp64 for fp32 keys
    (an fp32 reference would be torch's own fp32 kernel, with no error to compare against)."""
    dtype = dtype or (torch.float64 if sig.dt == "fp32" else torch.float32)
    return torch.matmul(a.to(dtype), b.to(dtype))


def make_inputs(sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """((a [B, M, K], b [B, K, N]), {}) in the key's layout (a 't' operand is a transposed view
    of a contiguous tensor, as attention's k^T): random, never zeros, outputs of order one."""
    dt = TORCH_DTYPES.get(sig.dt, torch.bfloat16)
    bt, n, k = sig.get("B"), sig.get("N"), sig.get("K")
    lay = sig.get("lay", "nn")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    if lay[0] == "t":
        a = torch.randn((bt, k, m), generator=gen, device=device).to(dt).transpose(1, 2)
    else:
        a = torch.randn((bt, m, k), generator=gen, device=device).to(dt)
    scale = k ** -0.5
    if lay[1] == "t":
        b = (torch.randn((bt, n, k), generator=gen, device=device) * scale).to(dt).transpose(1, 2)
    else:
        b = (torch.randn((bt, k, n), generator=gen, device=device) * scale).to(dt)
    return (a, b), {}
