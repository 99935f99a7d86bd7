"""The GEMM torch arms (`torch`: F.linear + activation; `fused`: torch._addmm_activation), the
fp32/fp64 reference the numerical gate compares with, and random inputs. Imports torch lazily.
"""
from __future__ import annotations

from typing import Any, Callable

from tunedb.records import Signature


def act_fn(act: str) -> Callable[[Any], Any] | None:
    """The torch function of an activation name (None for "none"): the torch arm's epilogue."""
    import torch.nn.functional as F

    return {"none": None, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]


def _inplace_act(act: str) -> Callable[[Any], Any] | None:
    """The activation applied in place (the same elementwise kernel and traffic as act(y))."""
    import torch

    aten = torch.ops.aten
    return {"none": None, "relu": aten.relu_, "gelu": aten.gelu_, "silu": aten.silu_,
            "gelu_tanh": lambda t: aten.gelu_(t, approximate="tanh")}[act]


def torch_arm(sig: Signature) -> Callable[[Any, Any, Any, Any], Any]:
    """The framework's op: F.linear (cuBLAS/cuBLASLt, bias in its epilogue), then the activation.

    Given `out` (a measurement), it runs the same kernels straight into it -- mm/addmm with out=,
    then the activation in place -- never a result copied into it: the model calls with
    out=None, and a copy would charge the arm a pass over the output the model never pays
    (+25% at whisper's 12000x1280x1280 on the H200)."""
    import torch
    import torch.nn.functional as F

    name = sig.get("act", "none")
    act, act_ = act_fn(name), _inplace_act(name)
    k, n = sig.get("K"), sig.get("N")

    def run(x, weight, bias, out):
        if out is None:
            y = F.linear(x, weight, bias)
            return y if act is None else act(y)
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {out.stride()}")
        x2, o2 = x.reshape(-1, k), out.view(-1, n)
        if bias is None:
            torch.mm(x2, weight.t(), out=o2)
        else:
            torch.addmm(bias, x2, weight.t(), out=o2)
        if act_ is not None:
            act_(o2)
        return out

    return run


def fused_arm(sig: Signature) -> Callable[[Any, Any, Any, Any], Any]:
    """torch._addmm_activation: cuBLASLt's bias+ReLU or bias+tanh-GELU epilogue in one kernel.

    For act=gelu this is an approximation (tanh GELU): the validity predicate lets it serve only
    when TUNEDB_APPROXIMATE=1, and the numerical gate still applies. Given `out`, it writes
    there (out=), as the torch arm does.
    """
    import torch

    from tunedb.families.gemm.configs import fused_reason

    act = sig.get("act", "none")
    why = fused_reason(sig, approximate=True)  # the predicate decides whether it may serve
    if why:
        raise ValueError(f"fused (torch._addmm_activation) cannot serve {sig.format()!r}: {why}")
    use_gelu = act != "relu"
    k, n = sig.get("K"), sig.get("N")

    def run(x, weight, bias, out):
        if out is None:
            y = torch._addmm_activation(bias, x.reshape(-1, k), weight.t(), use_gelu=use_gelu)
            return y.reshape(*x.shape[:-1], n)
        torch._addmm_activation(bias, x.reshape(-1, k), weight.t(), use_gelu=use_gelu, out=out.view(-1, n))
        return out

    return run


def reference(sig: Signature, x: Any, weight: Any, bias: Any = None, dtype: Any = None) -> Any:
    """The op on upcast inputs (fp32 unless dtype says fp64); the result stays in that dtype."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or torch.float32
    y = F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    act = act_fn(sig.get("act", "none"))
    return y if act is None else act(y)


def make_inputs(sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """((x [M, K], weight [N, K], bias [N] or None), {}): random, never zeros, outputs of order one."""
    import torch

    dt = torch.float16 if sig.dt == "fp16" else torch.bfloat16
    n, k = sig.get("N"), sig.get("K")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x = (torch.rand((m, k), generator=gen, device=device) * 2 - 1).to(dt)
    weight = (torch.randn((n, k), generator=gen, device=device) * k ** -0.5).to(dt)
    bias = None
    if sig.get("bias") == 1:
        bias = (torch.randn((n,), generator=gen, device=device) * 0.5).to(dt)
    return (x, weight, bias), {}
