"""The Autograd kernel of tunedb's forward-only ops (linalg_*, bmm, conv1d/conv2d,
gemm_log_softmax): where a gradient is wanted, the op's differentiable torch form runs.

Their served arms (Triton kernels) have no backward. With no Autograd kernel, torch's fallback
runs the op below autograd and, on backward, warns and hands back no gradient for its inputs: a
training step through a Triton-served call (a conv of an optimize()d model, a posv in a loss)
silently leaves those parameters without gradient, while the same code on CPU (the torch arm)
trains. `register` gives each op one kernel: with grad mode on and a tensor input requiring
grad, the torch form computes the result (so the gradient is torch's own, on every device);
otherwise the op runs below autograd exactly as before (inference, torch.compile's inference
graphs and CUDA graphs are unchanged).
"""
from __future__ import annotations

from typing import Any, Callable


def wants_grad(args: tuple[Any, ...]) -> bool:
    """Grad mode is on and a tensor among `args` requires grad."""
    import torch

    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)


def register(lib: Any, name: str, torch_form: Callable[..., Any]) -> None:
    """Register tunedb::`name`'s Autograd kernel on `lib` (the Library that defined it):
    torch_form(*args) where a gradient is wanted, else the op below autograd."""
    import torch

    op = getattr(torch.ops.tunedb, name).default

    def autograd_kernel(*args: Any, **kwargs: Any) -> Any:
        if wants_grad(args) or wants_grad(tuple(kwargs.values())):
            return torch_form(*args, **kwargs)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    lib.impl(name, autograd_kernel, "Autograd")
