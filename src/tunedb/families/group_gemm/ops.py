"""The MoE grouped product as a torch.library op, registered on first use:

    tunedb::group_gemm(Tensor x, Tensor weight, Tensor topk_ids, Tensor? topk_weights=None) -> Tensor
        y[t, j] = x[t or (t, j)] @ weight[topk_ids[t, j]].T (* topk_weights[t, j]), [M, top_k, N]

The swapped experts' forward (moe.tuned_forward) calls it. Through the op, torch.compile sees one
opaque call with a fake kernel (the selection's Python, its locks and lazy imports, stay out of
the trace: fullgraph=True failed on them), expert ids are checked where real values exist (a
traced call's CPU ids were not), and M = 0 returns an empty [0, top_k, N] as torch's arms do. The
implementation is runtime.dispatch's call (autotune()'s overrides, then the selector's chain).
No backward of its own: where a gradient is wanted the fp32 reference runs (runtime.grad_form).
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from tunedb.runtime import grad_form

_PLAIN = (torch.Tensor, torch.nn.Parameter)  # (importing this module imports torch: register() below)

_lib: list[Any] = []
_lock = threading.Lock()
FAMILY = "group_gemm"


def _empty(x: Any, weight: Any, topk_ids: Any) -> Any:
    return x.new_empty((*topk_ids.shape, weight.shape[1]))


def _check(x: Any, weight: Any, topk_ids: Any, topk_weights: Any) -> bool:
    """Refuse bad shapes, dtypes or devices by name (keys.signature_of); False when there is no
    token (M = 0: no key, an empty result)."""
    from tunedb.families.group_gemm import keys

    _, m = keys.signature_of("group_gemm", x, weight, topk_ids, topk_weights, allow_empty=True)
    return m > 0


def _record(x: Any, weight: Any, topk_ids: Any, topk_weights: Any) -> bool:
    """A fused census (`tunedb tune` of a MoE model: the swapped experts on meta tensors) records
    the call as the run time keys it; without this the experts' GEMMs, a MoE model's largest,
    were in no census ("a GPU would measure nothing here")."""
    from tunedb.runtime import launch_table

    if not launch_table.recording_active():
        return False
    from tunedb.families.group_gemm import keys

    sig, m = keys.signature_of("group_gemm", x, weight, topk_ids, topk_weights)
    launch_table.record_key(FAMILY, sig, m)
    return True


def run(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None) -> Any:
    """The op's implementation (every backend of tunedb::group_gemm runs this)."""
    from tunedb.runtime import dispatch, launch_table

    if getattr(topk_ids, "ndim", None) == 2 and topk_ids.shape[0] == 0:
        _check(x, weight, topk_ids, topk_weights)  # no token: every other check still applies
        return _empty(x, weight, topk_ids)
    weight = _grouped_layout(weight)
    if _record(x, weight, topk_ids, topk_weights):  # a census on a device: its arm's GEMMs not again
        with launch_table.recorded_call():
            return dispatch.call(FAMILY, "group_gemm", x, weight, topk_ids, topk_weights)
    return dispatch.call(FAMILY, "group_gemm", x, weight, topk_ids, topk_weights)


def _grouped_layout(weight: Any) -> Any:
    """weight [E, N, K] in a layout every arm takes: each expert's matrix with a unit stride along
    N or K, the other stride 16-byte aligned, no expert overlapping the next; anything else (a
    strided K, an expanded expert or row, experts innermost) is copied, where torch._grouped_mm
    raised "Invalid strides/sizes". Here, not in the arm: arms.py is among the sources the shipped
    table's impl_hash covers, and no measured call changes (the Triton lane reads any strides)."""
    shape = getattr(weight, "shape", None)
    if shape is None or len(shape) != 3 or str(getattr(weight, "layout", None)) != "torch.strided":
        return weight  # the keys name it
    if weight.is_contiguous():  # every call of a model's experts: one C call, no stride arithmetic
        return weight
    e, n, k = shape
    s0, s1, s2 = weight.stride()
    align = max(16 // weight.element_size(), 1)
    if s2 == 1 and s1 >= k:
        inner = s1 % align == 0
    elif s1 == 1 and s2 >= n:
        inner = s2 % align == 0
    else:
        inner = False
    if inner and (e == 1 or (s0 % align == 0 and s0 >= n * k)):
        return weight
    return weight.contiguous()


def _fake(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None) -> Any:
    if _check(x, weight, topk_ids, topk_weights):
        _record(x, weight, topk_ids, topk_weights)  # a census on meta tensors runs this kernel
    return _empty(x, weight, topk_ids)


def _grad_form(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None) -> Any:
    import torch

    from tunedb.families.group_gemm import arms, keys

    if not _check(x, weight, topk_ids, topk_weights):
        # no token: an empty result still joins the graph, so a training step's backward reaches
        # x, weight and topk_weights (zero gradients) as torch's own empty product does
        joined = sum(t.sum() for t in (x, weight, topk_weights) if t is not None and t.requires_grad)
        return _empty(x, weight, topk_ids) + (joined * 0).to(x.dtype)
    sig, _ = keys.signature_of("group_gemm", x, weight, topk_ids, topk_weights)
    from torch._guards import detect_fake_mode

    if torch.compiler.is_compiling() or detect_fake_mode(topk_ids) is not None:
        return _traced_form(sig, x, weight, topk_ids, topk_weights)
    return arms.reference(sig, x, weight, topk_ids, topk_weights, torch.float32).to(x.dtype)


def _traced_form(sig: Any, x: Any, weight: Any, topk_ids: Any, topk_weights: Any) -> Any:
    """The grad form under a trace (torch.compile of a training call of the op): the reference's
    per-expert index of slots is data-dependent (unbacked sizes Dynamo refuses when they are not
    in the output), so every slot row times every expert, masked: static shapes, E times the
    flops. optimize()'s swapped experts never come here (a training step runs the model's own
    forward)."""
    import torch

    m, top_k = topk_ids.shape
    e, n, k = weight.shape
    rows = x.reshape(-1, k).float()
    src = rows if sig.get("x") == "slot" else rows.repeat_interleave(top_k, dim=0)
    flat = topk_ids.reshape(-1)
    if not flat.is_cuda:  # as eager CPU calls (keys.check_ids): an id outside 0..E-1 raises at run time
        torch._assert_async(((flat >= 0) & (flat < e)).all(),
                            f"group_gemm topk_ids holds an expert id outside 0..{e - 1} (the weight's E={e} experts)")
    y = torch.zeros((m * top_k, n), dtype=torch.float32, device=x.device)
    for ex in range(e):
        # where, not a 0/1 product, and an expert no slot routes to read as zeros: it may hold NaN /
        # Inf, which 0 * NaN would spread to every slot (forward, and backward through src)
        hit = flat == ex
        w = torch.where(hit.any(), weight[ex].float(), 0.0)
        y = y + torch.where(hit.unsqueeze(1), src @ w.T, 0.0)
    if topk_weights is not None:
        y = y * topk_weights.reshape(-1, 1).float()
    return y.view(m, top_k, n).to(x.dtype)


def register() -> None:
    """Define tunedb::group_gemm (once per process)."""
    if _lib:
        return
    with _lock:
        if _lib:
            return
        import torch

        lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive in _lib
        lib.define("group_gemm(Tensor x, Tensor weight, Tensor topk_ids, Tensor? topk_weights=None) -> Tensor")
        lib.impl("group_gemm", run, "CompositeExplicitAutograd")
        torch.library.register_fake("tunedb::group_gemm", _fake, lib=lib)
        grad_form.register(lib, "group_gemm", _grad_form)
        _lib.append(lib)


def group_gemm(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None) -> Any:
    """The grouped product through the tuned op (see the module docstring); a bad argument is
    named by keys.signature_of, which every path runs."""
    if not _lib:  # (swap_experts registers it: a compiler's trace never reaches register's lock)
        register()
    import torch

    if (type(x) not in _PLAIN or type(weight) not in _PLAIN or type(topk_ids) not in _PLAIN
            or (topk_weights is not None and type(topk_weights) not in _PLAIN)):
        from tunedb.families.key_rules import check_operands  # (not every call: 0.7 us)

        check_operands("group_gemm", ("topk_weights",), x=x, weight=weight, topk_ids=topk_ids,
                       topk_weights=topk_weights)
    return torch.ops.tunedb.group_gemm(x, weight, topk_ids, topk_weights)


# Registered at import, not on an op's first call: a first call inside torch.compile would run
# register() under Dynamo, which cannot enter its lock (fullgraph=True raised "Unsupported
# context manager"; linalg's ops had the same fix). Importing this module imports torch;
# importing the family package still does not.
register()
