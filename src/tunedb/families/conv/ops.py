"""The tuned convolutions as torch.library ops (importing this module registers them):

    tunedb::conv1d(x, weight, bias, stride, padding, dilation, groups, act='none') -> y
    tunedb::conv2d(x, weight, bias, stride, padding, dilation, groups, act='none') -> y

A CUDA call in fp16 / bf16 keys itself (keys.signature_of), resolves once per (epoch, shape)
through runtime.dispatch (user tier, system tier, then the default: torch) and launches the
chosen arm; anything else (CPU, fp32, meta) runs F.conv1d / F.conv2d plus the activation. No host
synchronisation per call: CUDA graphs capture the launches. The fake kernels give torch.compile
the output shape. Where a gradient is wanted (training an optimize()d model) the torch form runs
(runtime.grad_form): a served arm has no backward.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.nn.functional as F

from tunedb.errors import ArgumentTypeError, SignatureError
from tunedb.families.conv import keys
from tunedb.families.key_rules import check_one_device, check_tensors
from tunedb.runtime import autocast_rule, dispatch, fx_nodes, grad_form, launch_table

_lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive for the process
for _op in keys.OPS:
    _lib.define(f"{_op}(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
                f"int groups, str act='none') -> Tensor")

_SERVED = (torch.float16, torch.bfloat16)


def activate(y, act: str):
    """The op's activation (keys.ACTS) in torch's own form."""
    return torch.relu(y) if act == "relu" else F.silu(y) if act == "silu" else y


def _plain(op: str, x, weight, bias, stride, padding, dilation, groups, act):
    conv = F.conv1d if op == "conv1d" else F.conv2d
    return activate(conv(x, weight, bias, stride, padding, dilation, groups), act)


def _record(op: str, x, weight, bias, stride, padding, dilation, groups, act) -> bool:
    """A fused census (tunedb census --fused) records the call as the run time keys it."""
    if not launch_table.recording_active() or x.dtype not in _SERVED:
        return False
    sig, m = keys.signature_of(op, x, weight, bias, stride, padding, dilation, groups, act)
    launch_table.record_key(keys.FAMILY, sig, m)
    return True


def _serve(op: str, x, weight, bias, stride, padding, dilation, groups, act):
    check_tensors(op, ("bias",), x=x, weight=weight, bias=bias)
    check_one_device(op, x=x, weight=weight, bias=bias)  # torch's conv returns garbage for cpu x with a meta weight
    keys.check_act(act)
    if _record(op, x, weight, bias, stride, padding, dilation, groups, act):
        with launch_table.recorded_call():
            return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)
    # an empty batch has no key, nor has an unbatched input ([C, L] / [C, H, W]: torch's form
    # takes it); under autocast torch's conv casts its operands (the op would not)
    if (not x.is_cuda or x.dtype not in _SERVED or x.numel() == 0 or x.dim() != weight.dim()
            or autocast_rule.casts("cuda", x, weight, bias)):
        return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)
    args = (x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups, act)
    try:
        bound = dispatch.bound("conv", op, *args)
    except SignatureError:
        # operands that do not fit together (x's channels vs weight and groups, x and weight of
        # two dtypes, an input shorter than the dilated kernel) have no key: torch's conv raises
        # its own RuntimeError for them, as the module replaced did (the key's was a ValueError)
        return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)
    if not grid_fits(bound.config, x):
        return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)
    y = bound.call(*args)
    cfg = bound.config
    if cfg.is_sentinel or (cfg.lane == "cudnn" and not cfg.param("channels_last", 0)):
        return y  # F.conv itself: its output layout is the fake's
    return _as_torch_lays_out(y, x)


def _as_torch_lays_out(y, x):
    """A Triton or channels-last arm's result in the layout F.conv gives for x (the fake kernel's,
    which torch.compile's Inductor asserts on the real output): channels-last for a channels-last
    4-D input, else contiguous. A copy only where the arm's layout differs."""
    fmt = (torch.channels_last if x.dim() == 4 and not x.is_contiguous()
           and x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)
    return y if y.is_contiguous(memory_format=fmt) else y.contiguous(memory_format=fmt)


# CUDA's limit on a launch grid's y and z dimensions. The direct depthwise kernel (launch.py, a
# hashed source) launches one z program per batch row (and one y program per channel block), so a batch above this fails to launch
# ("invalid argument"): such a call runs the torch form. The key (M = B * T_out) cannot tell,
# since the same M comes from a small batch of long inputs; the check is per call, on x's shape.
GRID_YZ_MAX = 65535


def grid_fits(config: Any, x: Any) -> bool:
    """Whether `config`'s launch grid stays within CUDA's limits for input x."""
    if config.lane != "triton_dw":
        return True  # the implicit GEMM's grid is (M blocks, Cout blocks): x's limit is 2**31 - 1
    _bt, bc = config.param("block")
    return int(x.shape[0]) <= GRID_YZ_MAX and -(-int(x.shape[1]) // bc) <= GRID_YZ_MAX


def _conv1d_impl(x, weight, bias, stride, padding, dilation, groups, act="none"):
    return _serve("conv1d", x, weight, bias, stride, padding, dilation, groups, act)


def _conv2d_impl(x, weight, bias, stride, padding, dilation, groups, act="none"):
    return _serve("conv2d", x, weight, bias, stride, padding, dilation, groups, act)


_lib.impl("conv1d", _conv1d_impl, "CompositeExplicitAutograd")
_lib.impl("conv2d", _conv2d_impl, "CompositeExplicitAutograd")


def _grad_form(op: str, x, weight, bias, stride, padding, dilation, groups, act="none"):
    """Where a gradient is wanted (runtime.grad_form): F.conv plus the activation, which torch
    differentiates (a Triton or cuDNN arm's result has no backward here); a census still keys it."""
    keys.check_act(act)
    _record(op, x, weight, bias, stride, padding, dilation, groups, act)
    return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)


grad_form.register(_lib, "conv1d", functools.partial(_grad_form, "conv1d"))
grad_form.register(_lib, "conv2d", functools.partial(_grad_form, "conv2d"))


def _fake(op, x, weight, bias, stride, padding, dilation, groups, act):
    keys.check_act(act)
    check_one_device(op, x=x, weight=weight, bias=bias)  # a meta operand beside CPU ones dispatches here
    _record(op, x, weight, bias, stride, padding, dilation, groups, act)  # a census on meta tensors runs this
    # torch's own conv on the fake tensors: its shape, unbatched inputs and its output layout
    # (channels-last in, channels-last out), which the served arms keep (_as_torch_lays_out)
    return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)


@torch.library.register_fake("tunedb::conv1d", lib=_lib)
def _conv1d_fake(x, weight, bias, stride, padding, dilation, groups, act="none"):
    return _fake("conv1d", x, weight, bias, stride, padding, dilation, groups, act)


@torch.library.register_fake("tunedb::conv2d", lib=_lib)
def _conv2d_fake(x, weight, bias, stride, padding, dilation, groups, act="none"):
    return _fake("conv2d", x, weight, bias, stride, padding, dilation, groups, act)


def _transformed(op: str, x, weight, bias, stride, padding, dilation, groups, act):
    """The call under a torch.func / forward-AD transform (grad_form.transformed): the ops have no
    vmap rule, so vmap ran them once per vmapped slice (a batch-1 conv each: other low bits than
    the batched F.conv, and V launches); torch's own conv folds the vmapped dimension into its batch."""
    check_one_device(op, x=x, weight=weight, bias=bias)
    keys.check_act(act)
    return _plain(op, x, weight, bias, stride, padding, dilation, groups, act)


def _far_pad(x: Any, extra: list[int]) -> Any:
    """x padded with zeros by extra[i] after spatial axis i (F.pad lists the last axis first)."""
    pads: list[int] = []
    for e in reversed(extra):
        pads += [0, e]
    return torch.nn.functional.pad(x, pads)


def _groups(op: str, groups: Any) -> int:
    """groups as an int (an integer-like value torch takes: numpy's, a 0-d integer tensor), else an
    ArgumentTypeError naming it (None or 2.0 reached the op's schema, which refused it in its own
    words). A value below 1 is torch's to refuse, in its own RuntimeError."""
    if type(groups) is int:
        return groups
    try:
        return operator.index(groups)
    except TypeError:
        raise ArgumentTypeError(f"{op}'s groups must be an int, got {type(groups).__name__} {groups!r}") from None


def _check_weight_rank(op: str, weight: Any, rank: int, shape: str) -> None:
    """Named before the padding rules read the kernel size off weight.shape[2:] (a weight of the
    wrong rank was blamed on a 'kernel' argument the op does not have)."""
    if weight.dim() != rank:
        raise SignatureError(f"{op}'s weight must be {rank}-D {shape}, got shape {list(weight.shape)}")


def conv1d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, act: str = "none") -> Any:
    """F.conv1d(x, weight, bias, ...) then the activation, through the tuned selection."""
    if type(x) is not torch.Tensor:  # symbolic_trace: one node, this function
        node = fx_nodes.recorded(conv1d, (x, weight, bias, stride, padding, dilation, groups, act))
        if node is not None:
            return node
    check_tensors("conv1d", ("bias",), x=x, weight=weight, bias=bias)
    if act not in keys.ACTS:  # before the op's schema refuses a non-string in its own words
        raise SignatureError(f"conv1d act={act!r} is not fused; allowed: {', '.join(keys.ACTS)}")
    _check_weight_rank("conv1d", weight, 3, "[C_out, C_in / groups, kW]")
    p = lambda name, v: list(keys._pair(name, v, 1))  # noqa: E731
    extra = keys.same_extra("conv1d", padding, weight.shape[2:], dilation)
    padding = keys.padding_ints("conv1d", padding, weight.shape[2:], stride, dilation)
    groups = _groups("conv1d", groups)
    if extra and x.dim() in (2, 3):  # 'same' with an even kernel: torch pads the far side one more
        x = _far_pad(x, extra)  # (an x of another rank: the op names it, at the size it was given)
    args = (x, weight, bias, p("stride", stride), p("padding", padding), p("dilation", dilation), groups, act)
    if grad_form.direct((x, weight, bias)):  # plain eager inference: no dispatcher hop
        return _conv1d_impl(*args)
    if grad_form.transformed():
        return _transformed("conv1d", *args)
    return torch.ops.tunedb.conv1d(*args)


def conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1, act: str = "none") -> Any:
    if type(x) is not torch.Tensor:  # symbolic_trace: one node, this function
        node = fx_nodes.recorded(conv2d, (x, weight, bias, stride, padding, dilation, groups, act))
        if node is not None:
            return node
    check_tensors("conv2d", ("bias",), x=x, weight=weight, bias=bias)
    if act not in keys.ACTS:  # before the op's schema refuses a non-string in its own words
        raise SignatureError(f"conv2d act={act!r} is not fused; allowed: {', '.join(keys.ACTS)}")
    _check_weight_rank("conv2d", weight, 4, "[C_out, C_in / groups, kH, kW]")
    p = lambda name, v: list(keys._pair(name, v, 2))  # noqa: E731
    extra = keys.same_extra("conv2d", padding, weight.shape[2:], dilation)
    padding = keys.padding_ints("conv2d", padding, weight.shape[2:], stride, dilation)
    groups = _groups("conv2d", groups)
    if extra and x.dim() in (3, 4):  # 'same' with an even kernel: torch pads the far side one more
        x = _far_pad(x, extra)  # (an x of another rank: the op names it, at the size it was given)
    args = (x, weight, bias, p("stride", stride), p("padding", padding), p("dilation", dilation), groups, act)
    if grad_form.direct((x, weight, bias)):
        return _conv2d_impl(*args)
    if grad_form.transformed():
        return _transformed("conv2d", *args)
    return torch.ops.tunedb.conv2d(*args)
