"""The tuned batched product as a torch.library op, registered on first use:

    tunedb::bmm(Tensor a, Tensor b) -> Tensor      a [B, M, K] @ b [B, K, N] -> [B, M, N] (or 2-D)

The Python entry point bmm() also takes [..., M, K] x [..., K, N] with equal leading dimensions.

Any strides (a transposed or expanded operand runs in place). A CUDA call resolves its config
through the generic run-time path (runtime/dispatch.py: autotune()'s overrides, then the
selector's user > system > default chain; unmeasured keys run torch.bmm) once per (dtype, shapes,
strides) and epoch: later calls are one dict lookup, so a CUDA graph captured after an eager call
replays what eager ran. A config that fails its first launch is replaced by torch.bmm for the
epoch (launch_table.first_call). Other devices compute torch.matmul. The fake kernel lets
torch.compile trace the op (it stays opaque). An empty product returns torch.matmul's result. No
autograd formula of its own: where a gradient is wanted torch.matmul runs (runtime.grad_form).
"""
from __future__ import annotations

import threading
from typing import Any

from tunedb.families.bmm import configs, keys
from tunedb.records import Config
from tunedb.runtime import batch_dims, fx_nodes, grad_form, launch_table

_lib: list[Any] = []
_lock = threading.Lock()
_bound: dict[tuple[Any, ...], Any] = {}  # (dtype, shapes, strides) -> launch_table.Bound
_overrides = launch_table._overrides  # autotune()'s override stack, shared, never rebound


def _clear() -> None:
    _bound.clear()


def call_key(a: Any, b: Any) -> tuple[Any, ...]:
    return (a.dtype, tuple(a.shape), tuple(b.shape), a.stride(), b.stride(), a.device.index)


def bound_for(a: Any, b: Any) -> Any:
    """The bound resolution of a CUDA call (config, tier, launcher, counter), counted as a call."""
    key = call_key(a, b)
    hit = None if _overrides else _bound.get(key)
    if hit is not None:
        hit.counter.calls += 1
        return hit
    from tunedb.database import tiers
    from tunedb.runtime import dispatch

    tiers.on_reload(_clear)  # (once) a new epoch drops every bound launcher
    got = dispatch.bound(configs.FAMILY, "bmm", a, b)
    if not _overrides:
        with _lock:
            _bound[key] = got
    return got


def run(a: Any, b: Any) -> Any:
    """The op's implementation (every backend of tunedb::bmm runs this)."""
    import torch

    try:
        off = a.device.type != "cuda" or a.numel() == 0 or b.numel() == 0 or b.device != a.device
    except AttributeError:  # a None or a number where a tensor belongs: named (nothing paid on a good call)
        from tunedb.families.key_rules import check_tensors

        check_tensors("bmm", a=a, b=b)
        raise
    if off:
        # an empty product has no key; the memo keys a's device only (check_call names a mix)
        keys.check_call("bmm", a, b)  # the errors a CUDA call raises when it is first keyed
        return torch.matmul(a, b)
    bound = bound_for(a, b)  # a new (dtype, shapes, strides) is keyed, and checked, by dispatch
    if bound.launched:
        return bound.call(a, b)
    return launch_table.first_call(bound, a, b)


def _fake(a: Any, b: Any) -> Any:
    keys.check_call("bmm", a, b)
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def _grad_form(a: Any, b: Any) -> Any:
    import torch

    keys.check_call("bmm", a, b)
    return torch.matmul(a, b)


def register() -> None:
    """Define tunedb::bmm (once per process)."""
    if _lib:
        return
    with _lock:
        if _lib:
            return
        import torch

        lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive in _lib
        lib.define("bmm(Tensor a, Tensor b) -> Tensor")
        lib.impl("bmm", run, "CompositeExplicitAutograd")
        torch.library.register_fake("tunedb::bmm", _fake, lib=lib)
        grad_form.register(lib, "bmm", _grad_form)
        torch.library.register_vmap("tunedb::bmm", _vmap, lib=lib)
        _lib.append(lib)


def _vmap(info: Any, in_dims: tuple, a: Any, b: Any) -> Any:
    """torch.vmap's rule for tunedb::bmm: the vmapped dimension joins the product's batch (an
    operand not vmapped is expanded to it); one product, not one per vmapped slice."""
    a, b = batch_dims.vmapped_front((a, b), in_dims, info.batch_size)
    return bmm(a, b), 0


def bmm(a: Any, b: Any) -> Any:
    """a @ b per batch through the tuned op: [B, M, K] x [B, K, N] -> [B, M, N] (or 2-D), and
    [..., M, K] x [..., K, N] with equal leading dimensions (attention's [B, H, T, D] products:
    flattened into one batch dimension, which keeps a transposed operand a view, and restored).
    Plain eager inference on CUDA runs the implementation without the dispatcher hop
    (runtime.grad_form.direct)."""
    import torch

    # torch's product serves a dtype the family has no kernel for (fp64, integers) and a call autocast
    # would cast (a bf16 activation may meet an fp32 one: the op would not cast, and refused the mix);
    # operands that do not fit are named below, as without autocast
    if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and ((str(a.dtype) not in keys.SERVED_DTYPES and b.dtype == a.dtype) or _autocast_casts(a, b))
            and a.ndim == b.ndim >= 2 and a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2]):
        from tunedb.families.key_rules import check_one_device

        check_one_device("bmm", a=a, b=b)  # torch.matmul of cpu and meta operands returns a meta tensor
        return torch.matmul(a, b)
    if type(a) is not torch.Tensor or type(b) is not torch.Tensor:
        node = fx_nodes.recorded(bmm, (a, b))  # symbolic_trace: one node, this function
        if node is not None:
            return node
        from tunedb.families.key_rules import check_operands

        check_operands("bmm", a=a, b=b)
    if getattr(a, "ndim", 3) > 3 and getattr(b, "ndim", 0) == a.ndim and a.shape[:-2] == b.shape[:-2]:
        if a.shape[-1] != b.shape[-2]:
            from tunedb.errors import OperandMismatchError  # (a RuntimeError too, as torch's)

            raise OperandMismatchError(f"bmm needs a [..., M, K] and b [..., K, N]: a's K={a.shape[-1]} but "
                                       f"b's K={b.shape[-2]}; got a {list(a.shape)}, b {list(b.shape)}")
        (a3, b3), lead = batch_dims.fold((a, b), (2, 2), "bmm")
        return batch_dims.unfold(bmm(a3, b3), lead)
    if grad_form.direct((a, b)):
        return run(a, b)
    register()
    return torch.ops.tunedb.bmm(a, b)


def _autocast_casts(a: Any, b: Any) -> bool:
    """Autocast is on for a's device and would cast a or b (one C call when no autocast is on)."""
    import torch

    if not torch._C._is_any_autocast_enabled():
        return False
    from tunedb.runtime import autocast_rule

    return autocast_rule.casts(a.device.type, a, b)


def serves_torch(bound: Any) -> bool:
    return bound.config.id in configs.FAMILY_SENTINELS or bound.config == Config.sentinel("torch")


def report() -> list[tuple[str, int, str, str, int]]:
    """(signature, M, config, tier, calls) of every key resolved this epoch."""
    return [(b.signature.format(), b.m, b.config.id, b.tier, b.calls) for b in _bound.values()]


# Registered at import, not on an op's first call: a first call inside torch.compile would run
# register() under Dynamo, which cannot enter its lock (fullgraph=True raised "Unsupported
# context manager"; linalg's ops had the same fix). Importing this module imports torch;
# importing the family package still does not.
register()
