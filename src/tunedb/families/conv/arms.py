"""The conv family's torch arms, its fp32 reference and its problem factory (imports torch).

torch arms: F.conv1d / F.conv2d as torch runs them in this process (`torch`, the fallback: the
cuDNN flags untouched, so a process running cudnn.benchmark=True keeps its autotuner) or with
cuDNN's autotuner on (`cudnn_bench`: cuDNN benchmarks its algorithms on a shape's first call and
caches the pick, so the arm is timed after its own warm-up, as it runs in a model), each also on
channels-last input (`cudnn_cl*`: conv1d runs as a conv2d of height 1 in NHWC).

The autotuner's flag is process-global: a bench arm sets it around its call under a lock and
restores it (other code keeps its own setting; another thread's convolution running in that
window may see it on: its pick may change, its results stay within cuDNN's tolerance). Its first
call of a cuDNN key benchmarks, which a CUDA graph capture cannot hold (timing needs
synchronisation), so a bench arm benchmarks only outside a capture; a key first met inside one
runs with the autotuner off. cuDNN caches the plan per thread and per key *without* the flag
(PyTorch's benchmark_cache): whichever mode meets a key first in a thread decides the plan of
both, so measuring the two modes side by side needs a fresh thread each (bench/conv.py).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from tunedb.families.conv import keys
from tunedb.records import Signature

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16}
_FLAG_LOCK = threading.RLock()
_WARM = threading.local()  # .keys: the cuDNN keys this thread has benchmarked (its plan cache's)


def torch_dtype(dt: str) -> torch.dtype:
    return _DTYPES[dt]


@contextlib.contextmanager
def cudnn_benchmark(on: bool) -> Iterator[None]:
    """cuDNN's autotuner on or off for the enclosed calls; the process's setting restored after
    (under a lock, so that two threads toggling it cannot leave it flipped; not written when it
    already holds `on`)."""
    flags = torch.backends.cudnn
    with _FLAG_LOCK:
        old = flags.benchmark
        if old == on:
            yield
            return
        flags.benchmark = on
        try:
            yield
        finally:
            flags.benchmark = old


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _cudnn_key(x: torch.Tensor, w: torch.Tensor, kw: dict[str, Any]) -> tuple:
    """What PyTorch keys its cuDNN plan cache by (shapes, strides, dtype, device, alignment,
    geometry, the deterministic and TF32 flags): a bench arm benchmarks each once per thread."""
    flags = torch.backends.cudnn
    return (tuple(x.shape), x.stride(), tuple(w.shape), w.stride(), x.dtype, x.device, x.data_ptr() % 16,
            w.data_ptr() % 16, tuple(sorted((k, str(v)) for k, v in kw.items())), flags.deterministic,
            flags.allow_tf32)


def _call(conv: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
          benchmark: bool, kw: dict[str, Any]) -> torch.Tensor:
    """One convolution: as the process runs it (benchmark False), or with the autotuner on
    outside a capture (and inside one for a key this thread already benchmarked)."""
    if not benchmark:
        return conv(x, w, bias, **kw)
    key = _cudnn_key(x, w, kw)
    warm = getattr(_WARM, "keys", None)
    if warm is None:
        warm = _WARM.keys = set()
    if key not in warm and _capturing():
        with cudnn_benchmark(False):  # never benchmark inside a capture
            return conv(x, w, bias, **kw)
    with cudnn_benchmark(True):
        y = conv(x, w, bias, **kw)
    if len(warm) > 4096:
        warm.clear()
    warm.add(key)
    return y


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
    """The op through torch (cuDNN on CUDA): the `torch` and `cudnn_*` arms; benchmark=False
    leaves the process's cuDNN flags as they are."""
    a = conv_args(sig)
    if not channels_last:
        y = _call(F.conv1d if sig.op == "conv1d" else F.conv2d, x, weight, bias, benchmark, a)
    elif sig.op == "conv1d":
        x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        kw = dict(stride=(1, a["stride"][0]), padding=(0, a["padding"][0]), dilation=(1, a["dilation"][0]),
                  groups=a["groups"])
        y = _call(F.conv2d, x4, _cl_weight(weight, True), bias, benchmark, kw).squeeze(2)
    else:
        y = _call(F.conv2d, x.contiguous(memory_format=torch.channels_last), _cl_weight(weight, False), bias,
                  benchmark, a)
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
