"""The Autograd kernel of tunedb's forward-only ops (linalg_*, bmm, conv1d/conv2d,
gemm_log_softmax, scaled_mm_*): where a gradient is wanted, the op's differentiable torch form runs.

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
    """Grad mode is on and a tensor among `args` requires grad, or a tensor among them carries a
    forward-mode tangent (forward_ad's dual tensors, torch.func.jvp / jacfwd): those set no
    requires_grad, and below autograd the served arm would drop the tangent silently."""
    import torch

    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
        return True
    return _has_tangent(args)


def _has_tangent(args: tuple[Any, ...]) -> bool:
    import torch
    from torch.autograd import forward_ad

    level = forward_ad._current_level  # -1 outside every dual level: the common case, one read
    if level < 0 or not torch._C._is_fwd_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and torch._unpack_dual(t, lv).tangent is not None
               for t in args for lv in range(level + 1))


def register(lib: Any, name: str, torch_form: Callable[..., Any]) -> None:
    """Register tunedb::`name`'s Autograd kernel on `lib` (the Library that defined it):
    torch_form(*args) where a gradient is wanted, else the op below autograd."""
    import torch

    bind()
    op = getattr(torch.ops.tunedb, name).default

    def autograd_kernel(*args: Any, **kwargs: Any) -> Any:
        if wants_grad(args) or wants_grad(tuple(kwargs.values())):
            return torch_form(*args, **kwargs)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    lib.impl(name, autograd_kernel, "Autograd")
    from tunedb.runtime import export_forms

    export_forms.register(op, torch_form)  # the same form for torch.onnx.export (dynamo=True)


def direct(args: tuple[Any, ...]) -> bool:
    """Whether an eager call may run the op's implementation directly, skipping the dispatcher
    and this Autograd kernel (8-31 us a call on the H200's host, bench/op_host_cost.py): plain
    CUDA tensors, no compiler tracing, no dispatch mode (a census recorder; a function mode, as
    the bmm family's ProductMode around a whole forward, does not stop it: a mode sees the torch
    functions the model calls, which the entry points are called from), no functorch or
    forward-AD transform, and no gradient wanted. The op's entry point asks; every other call
    goes through torch.ops.tunedb, whose kernels handle it. Asked on every eager call of a small
    op, so it reads each tensor once and binds torch's checks once (it cost 1.2-1.6 us on this
    CPU as written first, 0.4-0.5 us now)."""
    names = _names or _bind()
    tensor, parameter, grad_enabled, compiling, modes, transforms, forward_ad, torch_c = names
    x = args[0]
    if type(x) is not tensor or not x.is_cuda:
        return False
    grad = grad_enabled()
    for t in args:
        kind = type(t)
        if kind is not tensor and kind is not parameter:
            # a tensor subclass (FakeTensor, a quantized wrapper) is the dispatcher's to route; a
            # Parameter is a plain tensor to every kernel (its torch function is disabled)
            if isinstance(t, tensor):
                return False
            continue
        if grad and t.requires_grad:
            return False
    # torch.jit.trace records dispatched ops only (a kernel run directly would be a constant)
    return not (compiling() or modes() or transforms() or forward_ad._current_level >= 0
                or torch_c._get_tracing_state() is not None)


_names: list[Any] = []


def transformed() -> bool:
    """A functorch transform (torch.func.vmap, grad, jvp, jacrev) active or a forward-AD dual
    level open: a call then runs its op's torch form, which every transform knows (the tuned ops
    have no functorch rule and no jvp: vmap ran them once per slice, a tangent was dropped).
    ~50 ns with torch's checks bound once (the GEMM entry points ask it on every call)."""
    names = _names or _bind()
    return names[6]._current_level >= 0 or names[5]()


def bind() -> list[Any]:
    """Bind the checks' names now (the op modules call it at import). Bound lazily on a first call
    inside a torch.compile'd frame instead, the binding's import and list write ran between
    Dynamo's two passes over that frame, and the second took the other branch: the compile failed
    with SpeculationLogDivergence where the frame graph-broke later."""
    return _names or _bind()


def _bind() -> list[Any]:
    import torch
    from torch.autograd import forward_ad

    _names[:] = [torch.Tensor, torch.nn.Parameter, torch.is_grad_enabled, torch.compiler.is_compiling,
                 torch._C._len_torch_dispatch_stack, torch._C._are_functorch_transforms_active, forward_ad,
                 torch._C]
    return _names
