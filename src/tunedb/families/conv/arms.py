"""The conv family's torch arms, its fp32 reference and its problem factory (imports torch).

torch arms: F.conv1d / F.conv2d with cuDNN's autotuner off (`torch`, the fallback) or on
(`cudnn_bench`: cuDNN benchmarks its algorithms on a shape's first call and caches the pick, so
the arm is timed after its own warm-up, as it runs in a model), each also on channels-last
input (`cudnn_cl*`: conv1d runs as a conv2d of height 1 in NHWC). The flag is set around the
call and restored: other code in the process keeps its own setting.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from tunedb.families.conv import keys
from tunedb.records import Signature

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16}


def torch_dtype(dt: str) -> torch.dtype:
    return _DTYPES[dt]


@contextlib.contextmanager
def cudnn_benchmark(on: bool) -> Iterator[None]:
    """cuDNN's autotuner on or off for the enclosed calls; the process's setting restored after."""
    flags = torch.backends.cudnn
    old = flags.benchmark
    flags.benchmark = on
    try:
        yield
    finally:
        flags.benchmark = old


def activate(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == "relu":
        return torch.relu_(y)
    if act == "silu":
        return F.silu(y, inplace=True)
    return y


def conv_args(sig: Signature) -> dict[str, Any]:
    g = keys.geometry(sig)
    return dict(stride=g["s"], padding=g["p"], dilation=g["d"], groups=sig.get("g"))


# Channels-last copies of weights, keyed by the weight's storage and version: a model converts
# its weights once, not per call.
_CL_WEIGHTS: dict[tuple[int, tuple[int, ...], int], torch.Tensor] = {}


def _cl_weight(weight: torch.Tensor, conv1d: bool) -> torch.Tensor:
    key = (weight.data_ptr(), tuple(weight.shape), weight._version)
    found = _CL_WEIGHTS.get(key)
    if found is None:
        w = weight.unsqueeze(2) if conv1d else weight
        found = w.contiguous(memory_format=torch.channels_last)
        if len(_CL_WEIGHTS) > 256:
            _CL_WEIGHTS.clear()
        _CL_WEIGHTS[key] = found
    return found


def torch_conv(sig: Signature, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               benchmark: bool = False, channels_last: bool = False) -> torch.Tensor:
    """The op through torch (cuDNN on CUDA): the `torch` and `cudnn_*` arms."""
    a = conv_args(sig)
    with cudnn_benchmark(benchmark):
        if not channels_last:
            conv = F.conv1d if sig.op == "conv1d" else F.conv2d
            y = conv(x, weight, bias, **a)
        elif sig.op == "conv1d":
            x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            y = F.conv2d(x4, _cl_weight(weight, True), bias, stride=(1, a["stride"][0]),
                         padding=(0, a["padding"][0]), dilation=(1, a["dilation"][0]), groups=a["groups"]).squeeze(2)
        else:
            y = F.conv2d(x.contiguous(memory_format=torch.channels_last), _cl_weight(weight, False), bias, **a)
    return activate(y, sig.get("act", "none"))


def reference(sig: Signature, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              *_: Any, **__: Any) -> torch.Tensor:
    """The op in fp32 on upcast inputs (TF32 off: the reference must be more precise than the arms)."""
    a = conv_args(sig)
    conv = F.conv1d if sig.op == "conv1d" else F.conv2d
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        y = conv(x.float(), weight.float(), None if bias is None else bias.float(), **a)
    finally:
        torch.backends.cudnn.allow_tf32 = old
    act = sig.get("act", "none")
    return torch.relu(y) if act == "relu" else F.silu(y) if act == "silu" else y


def make_inputs(sig: Signature, m: int, device: Any, seed: int, batch: int | None = None,
                length: int | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random inputs (never zeros) for `sig` at size m, in the key's layout: (x, weight, bias,
    stride, padding, dilation, groups, act). B = 1 and the shortest input reaching M >= m
    (keys.shape_for) unless batch and length are given."""
    if batch is None or length is None:
        batch, length = keys.shape_for(sig, m)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = torch_dtype(sig.dt)
    cin, cout, groups = sig.get("Cin"), sig.get("Cout"), sig.get("g")
    g = keys.geometry(sig)
    spatial = (length,) if sig.op == "conv1d" else (length, sig.get("W"))
    lay = sig.get("lay")
    if lay in ("ntc", "nhwc"):  # channels fastest: the tensor is a permuted view of [B, *spatial, C]
        base = torch.randn((batch, *spatial, cin), generator=gen)
        x = base.movedim(-1, 1)
    else:
        x = torch.randn((batch, cin, *spatial), generator=gen)
    fan_in = (cin // groups) * int(torch.tensor(g["k"]).prod())
    weight = torch.randn((cout, cin // groups, *g["k"]), generator=gen) / fan_in ** 0.5
    bias = torch.randn((cout,), generator=gen) * 0.1 if sig.get("bias") else None
    x = x.to(device=device, dtype=dtype)
    weight = weight.to(device=device, dtype=dtype)
    bias = None if bias is None else bias.to(device=device, dtype=dtype)
    a = conv_args(sig)
    return (x, weight, bias, a["stride"], a["padding"], a["dilation"], a["groups"], sig.get("act", "none")), {}
