"""The autograd formula of the tuned GEMM ops (tunedb::gemm, tunedb::gemm_act): an
autograd.Function whose forward redispatches below autograd to the op itself and whose backward
recomputes the pre-activation rather than keep it alive. ops.py registers it as the ops'
Autograd kernel when a gradient is needed or the tensors are not plain.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


def _act_backward(grad: torch.Tensor, pre: torch.Tensor, act: str) -> torch.Tensor:
    if act == "none":
        return grad
    if act == "gelu":
        return torch.ops.aten.gelu_backward(grad, pre)
    if act == "gelu_tanh":
        return torch.ops.aten.gelu_backward(grad, pre, approximate="tanh")
    if act == "relu":  # aten's own rule: where pre is NaN the gradient passes, as F.relu's does
        return torch.ops.aten.threshold_backward(grad, pre, 0)
    if torch.is_grad_enabled():  # a double backward (create_graph): aten's silu_backward has no derivative
        s = torch.sigmoid(pre)
        return grad * s * (1 + pre * (1 - s))
    return torch.ops.aten.silu_backward(grad, pre)


def torch_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None) -> torch.Tensor:
    """What the ops compute, in torch's own differentiable ops: served under functorch transforms
    and forward-mode AD, which know torch's ops and not this autograd.Function (no jvp, and
    applied inside a Library kernel it has no functorch rule)."""
    from tunedb.families.gemm.arms import act_fn
    from tunedb.families.gemm.configs import ACTS

    if act is not None and act not in ACTS:  # as ops._check names it (act_fn raised a bare KeyError)
        from tunedb.errors import SignatureError

        allowed = ("none", *sorted(a for a in ACTS if a != "none"))
        raise SignatureError(f"unknown activation act={act!r}; allowed: {', '.join(allowed)}")
    out = F.linear(x, weight, bias)
    fn = act_fn(act or "none")
    return out if fn is None else fn(out)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, bias, act, _tiers = inputs
    ctx.act = act or "none"
    ctx.has_bias = bias is not None
    ctx.x_shape, ctx.w_shape = x.shape, weight.shape
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if ctx.act != "none":  # the backward recomputes the pre-activation: every operand
        ctx.save_for_backward(x, weight, bias)
    else:
        # what torch's linear keeps, no more: x only for the weight's gradient, the weight only
        # for x's, nothing for the bias's alone. A frozen layer's input may then be written in
        # place after the call (`h += fc(h)`), or be an inference tensor (BitFit on cached features),
        # as with nn.Linear, and a frozen layer keeps no activation alive
        ctx.save_for_backward(x if need_w else None, weight if need_x else None, None)
    # torch's mm backward takes mat2 = W^T's layout: a row-major W (W^T column-major) as (g^T x),
    # any other as (x^T g)^T, which a BLAS sums in another order
    ctx.w_row_major = need_w and weight.stride(1) == 1 and weight.stride(0) == x.shape[-1]
    # y = x W^T is holomorphic: autograd wants grad times the conjugates
    ctx.conj = weight.is_complex() or x.is_complex()
    # F.linear folds x into one addmm where x is 2-D or contiguous (its bias gradient: the folded
    # gradient summed over rows), else runs matmul then adds the bias (summed over the leading
    # dims of the unfolded gradient, which a non-contiguous gradient sums in another order): the
    # same sums, so that a CPU model's gradients are bitwise its plain model's
    ctx.x_flat = x.dim() <= 2 or x.is_contiguous()


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, bias = ctx.saved_tensors
    if ctx.act != "none":  # recompute the pre-activation rather than keep it alive
        grad = _act_backward(grad, F.linear(x, weight, bias), ctx.act)
    k, n = ctx.x_shape[-1], ctx.w_shape[0]
    rows = math.prod(ctx.x_shape[:-1])  # not reshape(-1, ...): K = 0 or N = 0 leaves -1 undefined
    g2 = grad.reshape(rows, n)
    grad_x = grad_w = grad_b = None
    # mm, not @, as torch's addmm / mm backward call it: under vmap (a vectorized jacobian's
    # batched backward) matmul's batching rule sums in another order
    if ctx.needs_input_grad[0]:
        grad_x = g2.mm(weight.conj() if ctx.conj else weight).view(ctx.x_shape)
    if ctx.needs_input_grad[1]:
        x2 = (x.conj() if ctx.conj else x).reshape(rows, k)
        grad_w = g2.t().mm(x2) if ctx.w_row_major else x2.t().mm(g2).t()
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g2.sum(0) if ctx.x_flat else grad.sum(tuple(range(grad.dim() - 1)))
    return grad_x, grad_w, grad_b, None, None


class _TunedGemm(torch.autograd.Function):
    """Autograd of both ops (act None: gemm): forward below autograd (the op itself)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                act: str | None, tiers: str) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            if act is None:
                out = torch.ops.tunedb.gemm.default(x, weight, tiers)
            else:
                out = torch.ops.tunedb.gemm_act.default(x, weight, bias, act, tiers)
        # the torch arm's F.linear of a 3-D x with a bias returns a view of its 2-D addmm: an
        # autograd.Function's output that is a view may not be modified in place ("created
        # inside a custom Function"), which transformers' Longformer (`q /= sqrt(d)`) and DeBERTa
        # (on a permute of it) do in training, where plain F.linear's output allows it. aten's own
        # linear reshapes with _unsafe_view for this reason: the same storage, not a tracked view
        return torch.ops.aten._unsafe_view(out, out.shape) if out._is_view() else out

    setup_context = staticmethod(_setup)
    backward = staticmethod(_backward)
