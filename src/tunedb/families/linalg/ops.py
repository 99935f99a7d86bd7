"""The linalg ops, registered with torch.library when this module is imported: ``tunedb::linalg_<op>``.

    tunedb::linalg_dot(Tensor x, Tensor y) -> Tensor                 [batch]
    tunedb::linalg_gemv(Tensor A, Tensor x) -> Tensor                [batch, n]
    tunedb::linalg_gemm(Tensor A, Tensor B) -> Tensor                [batch, n, n]
    tunedb::linalg_potrf(Tensor A) -> (Tensor L, Tensor info)        L row-major, info int32 [batch]
    tunedb::linalg_trsv(Tensor L, Tensor b) -> Tensor                [batch, n]
    tunedb::linalg_posv(Tensor A, Tensor b) -> (Tensor x, Tensor info)

The Python entry points below also take torch.linalg's shapes (any leading batch dimensions, or
none, folded by runtime/batch_dims; an n outside 2..128 runs torch's forms): _any_shape. The ops are functional (they never
write their inputs). A CUDA call resolves its config through
the selector (user tier > system tier > the heuristic > the library arm) once per (op, dtype, n,
batch) and epoch; later calls of that key are one dict lookup to the bound launcher, so a CUDA
graph captured after an eager call replays the kernel eager runs. Other devices take the library
arm. A non-SPD problem of potrf/posv is reported in `info` (0, or the 1-based column whose pivot
failed, as torch.linalg.cholesky_ex reports): never an exception, never a hang; the other
problems of the batch are unaffected. Fake kernels let torch.compile trace the ops (they stay
opaque in the graph). No autograd formula of their own: where a gradient is wanted the library
arm's forms run (runtime.grad_form), so the gradient is torch's on every device.

A new (op, dtype, n, batch) resolves through the generic run-time path (runtime/dispatch.py,
which asks autotune()'s overrides and then the selector); this module keeps a cheaper front memo
keyed by the tensors' dtype and shape (no Signature built per call), and the first-launch
fallback to the library arm. Once a key's first call succeeded, its later calls take a prepared
launch (`_fast`: cuda_launcher, triton_launcher, or the torch arm's forms directly), which skips
the general path's re-checks: an eager call's host time was 55-78 us there, more than torch's own
calls (bench/linalg_eager.py, session 29).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import torch

from tunedb.errors import SignatureError
from tunedb.runtime import autocast_rule
from tunedb.families.linalg import signatures
from tunedb.records import Config
from tunedb.runtime import batch_dims, fx_nodes, grad_form, launch_table

_Tensor = torch.Tensor

OUTPUTS = {"dot": "Tensor", "gemv": "Tensor", "gemm": "Tensor", "potrf": "(Tensor, Tensor)",
           "trsv": "Tensor", "posv": "(Tensor, Tensor)"}
ARGS = {"dot": "Tensor x, Tensor y", "gemv": "Tensor A, Tensor x", "gemm": "Tensor A, Tensor B",
        "potrf": "Tensor A", "trsv": "Tensor L, Tensor b", "posv": "Tensor A, Tensor b"}


_bound: dict[tuple[Any, ...], Any] = {}  # (op, dtypes, shapes) -> launch_table.Bound
# (op, dtypes, shapes) -> (Bound, prepared eager launch or None): keys whose first call succeeded
_fast: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_lock = threading.Lock()
_lib: list[Any] = []
_overrides = launch_table._overrides  # the runtime's override stack (autotune()), shared, never rebound


def _family() -> Any:
    from tunedb import families

    return families.get(signatures.FAMILY)


def _clear() -> None:
    _bound.clear()
    _fast.clear()


def bound_for(op: str, *tensors: Any) -> Any:
    """The bound resolution of a CUDA call (a launch_table.Bound: config, tier, call, counter),
    counted as one call. A key already served this epoch is one dict lookup; a new one goes
    through the generic run-time path (runtime.dispatch: autotune()'s overrides, then the
    selector's chain), and is kept here unless an override is active (autotune() may measure)."""
    first = tensors[0]
    # every tensor's whole shape and dtype: a key of the first's (n, batch) alone let a repeated
    # call with a mismatched b (or a 4-D A) skip signature_of's checks and fail in the launcher
    second = tensors[1] if len(tensors) > 1 else first
    key = (op, first.dtype, first.shape, second.dtype, second.shape)
    hit = None if _overrides else _bound.get(key)
    if hit is not None:
        hit.counter.calls += 1
        return hit
    from tunedb.database import tiers
    from tunedb.runtime import dispatch

    tiers.on_reload(_clear)  # (once) a new epoch drops every bound launcher
    got = dispatch.bound(signatures.FAMILY, op, *tensors)
    if not _overrides:
        with _lock:
            _bound[key] = got
    return got


def _any_autocast() -> bool:
    import torch

    check = getattr(torch._C, "_is_any_autocast_enabled", None)
    return True if check is None else check()


def run(op: str, *tensors: Any) -> Any:
    """The op's implementation (what every backend of tunedb::linalg_<op> runs)."""
    first = tensors[0]
    if first is None or tensors[-1] is None:  # torch.ops passes a None given for a Tensor through
        signatures.signature_of(op, *tensors)  # names it (SignatureError)
    if _any_autocast() and hasattr(first, "device"):
        import torch

        dev = first.device.type
        if autocast_rule.enabled(dev):  # the op's dtype is its operands' (its fake's): the
            with torch.autocast(dev, enabled=False):  # torch arm's bmm would run in bf16
                return run(op, *tensors)
    if not first.is_cuda:
        sig, _batch = signatures.signature_of(op, *tensors)
        return _family().launch(Config.sentinel("torch"), sig, *tensors)
    # get_device: the index (-1 off CUDA), without building two torch.device objects a call
    if first.numel() == 0 or (len(tensors) > 1 and tensors[1].get_device() != first.get_device()):
        # an empty batch has nothing to launch (numel, not shape[0]: a 0-d tensor has no shape[0],
        # and is named by signature_of like any bad shape); the front memo keys first's device
        # only: signature_of names a mix
        return _fake(op, *tensors)
    second = tensors[1] if len(tensors) > 1 else first
    key = (op, first.dtype, first.shape, second.dtype, second.shape)
    hit = None if _overrides else _fast.get(key)
    if hit is not None:
        bound, fast = hit
        bound.counter.calls += 1
        if fast is not None:
            got = fast(tensors)
            if got is not None:
                return got
        return bound.call(*tensors)
    bound = bound_for(op, *tensors)
    if bound.launched:
        out = bound.call(*tensors)
    else:
        out = launch_table.first_call(bound, *tensors)
    if not _overrides and bound.launched:
        with _lock:
            _fast[key] = (bound, _prepared(op, bound, first))
    return out


def _prepared(op: str, bound: Any, first: Any) -> Any:
    """A key's shortcut past the general launch path (family.launch -> launch.launch, which
    re-checks what the key already fixed), or None: the torch arm's forms called directly where
    the torch arm serves (the config, or the eager_fallback hook's choice outside a capture), the
    CUDA tier's prepared launch (cuda_launcher) or a Triton arm's (triton_launcher) where one
    serves. Each returns None for a call it does not take (a capture of an eager-fallback key, a
    strided input), which then goes the general way. Not after a failed first call put the torch arm in (bound.config)."""
    import torch

    from tunedb.families.linalg.kernels_torch import torch_arm

    cid = bound.config.id
    if bound.eager is not None or cid in ("torch", "default"):
        if (bound.eager or "torch") != "torch":
            return None
        form = functools.partial(torch_arm, op, False, out=None)
        if bound.eager is None:
            return form
        capturing = torch._C._cuda_isCurrentStreamCapturing
        return lambda tensors: None if capturing() else form(tensors)
    if not first.is_contiguous() or cid.startswith("nvmath") or bound.config.is_sentinel:
        return None
    from tunedb.families.linalg import cuda_launcher, triton_launcher

    n, batch, dtype = first.shape[-1], first.shape[0], signatures.dtype_name(first.dtype)
    try:
        if cid.startswith("cuda"):
            return cuda_launcher.prepare(op, cid, n, batch, dtype, first.get_device())
        return triton_launcher.prepare(op, cid, n, batch, dtype)
    except Exception:  # the general path keeps serving; this is only its shortcut
        return None


# each operand's rank in the strict ops' form (matrices [batch, n, n], vectors [batch, n])
_RANKS = {"dot": (2, 2), "gemv": (3, 2), "gemm": (3, 3), "potrf": (3,), "trsv": (3, 2), "posv": (3, 2)}


def _vmap(op: str, info: Any, in_dims: tuple, *tensors: Any) -> Any:
    """torch.vmap's rule for tunedb::linalg_<op>: the vmapped dimension joins the op's batch (an
    operand not vmapped is expanded to it, which copies it V times), one call over V x batch
    problems instead of torch's fallback of one call per vmapped slice; the results are split
    back, vmapped at dimension 0."""
    moved = batch_dims.vmapped_front(tensors, in_dims, info.batch_size)
    for t, rank in zip(moved, _RANKS[op]):  # folded first, a wrong rank was named in a shape never passed
        if t.dim() - 1 != rank:
            form = "[batch, n, n]" if rank == 3 else "[batch, n]"
            raise SignatureError(f"tunedb::linalg_{op} under vmap: each sample's operand must be {form}, got a "
                                 f"sample of shape {list(t.shape[1:])}; the entry points (tunedb's la.{op}) "
                                 f"take any batch dims under vmap")
    flat, lead = batch_dims.fold(moved, tuple(max(t.dim() - 2, 0) for t in moved), f"linalg {op} under vmap")
    out = batch_dims.unfold(_op(op)(*flat), lead)
    return out, (0, 0) if isinstance(out, tuple) else 0


def _potrf(a: Any) -> Any:
    """potrf's implementation: run's (L, info) with L row-major, the layout the fake kernel
    promises and the kernel arms write. The library arm's cholesky_ex returns L column-major
    (LAPACK's and cuSOLVER's layout), and Inductor asserts a compiled call's strides against the
    fake's, so torch.compile(potrf) failed wherever the library arm serves (every CPU call)."""
    low, info = run("potrf", a)
    return row_major(low), info


def row_major(t: Any) -> Any:
    """t with row-major strides (the layout every arm's L has). An empty tensor counts as
    contiguous whatever its strides, so cholesky_ex's column-major L of a batch of 0 kept them."""
    import torch

    if t.numel() == 0:
        return t.clone(memory_format=torch.contiguous_format)
    return t if t.is_contiguous() else t.contiguous()


def _fake(op: str, *tensors: Any) -> Any:
    import torch

    signatures.check_call(op, *tensors)  # the same errors as a real call, no size specialised
    a = tensors[0]
    if op == "dot":
        return a.new_empty((a.shape[0],))
    if op in ("gemv", "trsv"):
        return tensors[1].new_empty(tensors[1].shape)
    if op == "gemm":
        return a.new_empty(a.shape)
    info = a.new_zeros((a.shape[0],), dtype=torch.int32)
    return (a.new_empty(a.shape), info) if op == "potrf" else (tensors[1].new_empty(tensors[1].shape), info)


def _grad_form(op: str, *tensors: Any) -> Any:
    """The op where a gradient is wanted (runtime.grad_form): the library arm's forms, which
    torch differentiates (cholesky_ex, solve_triangular, bmm), on every device."""
    from tunedb.families.linalg import problems

    signatures.check_call(op, *tensors)  # the same errors as a served call (traced: no size specialised)
    out = problems.torch_arm(op, *tensors)
    return (row_major(out[0]), out[1]) if op == "potrf" else out  # L row-major, as served


def register() -> None:
    """Define tunedb::linalg_<op> (once per process)."""
    if _lib:
        return
    with _lock:
        if _lib:
            return
        import torch

        lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive in _lib
        for op in signatures.OPS:
            lib.define(f"linalg_{op}({ARGS[op]}) -> {OUTPUTS[op]}")
            impl = _potrf if op == "potrf" else functools.partial(run, op)
            lib.impl(f"linalg_{op}", impl, "CompositeExplicitAutograd")
            torch.library.register_fake(f"tunedb::linalg_{op}", functools.partial(_fake, op), lib=lib)
            grad_form.register(lib, f"linalg_{op}", functools.partial(_grad_form, op))
            torch.library.register_vmap(f"tunedb::linalg_{op}", functools.partial(_vmap, op), lib=lib)
        _lib.append(lib)


def _op(name: str) -> Any:
    register()  # a no-op once this module is imported (it registers below)
    import torch

    return getattr(torch.ops.tunedb, f"linalg_{name}")


def _call(name: str, *tensors: Any) -> Any:
    """The entry points' one path: in plain eager inference on CUDA the implementation itself
    (grad_form.direct: the dispatcher hop and the Autograd kernel cost more host time than a
    small solve takes on the GPU), anything else through torch.ops.tunedb. Shapes other than
    the ops' own (leading batch dimensions other than one, an n the family does not serve) go
    through _any_shape first."""
    first = tensors[0]
    if type(first) is not _Tensor or type(tensors[-1]) is not _Tensor:
        # symbolic_trace: one node, the public function (a Proxy anywhere: posv of a buffer's A)
        node = fx_nodes.recorded(_PUBLIC[name], tensors)
        if node is not None:
            return node
        for t, arg in zip(tensors, signatures.ARG_NAMES[name]):
            # an array or a list: the dispatcher's refusal printed the whole value, naming no argument
            if t is not None and not isinstance(t, _Tensor) and not hasattr(type(t), "__torch_function__"):
                raise SignatureError(f"linalg {name}'s {arg} must be a torch.Tensor, got {type(t).__name__} "
                                     f"(torch.as_tensor converts an array)")
    try:
        # every operand in the op's own rank: under vmap a mismatched second operand went straight
        # to the op's vmap rule, whose error sent the caller to the entry point they had called
        ranks = _RANKS[name]  # no generator: this is every eager call's host path
        canonical = (first.dim() == ranks[0] and (len(tensors) == 1 or tensors[1].dim() == ranks[1])
                     and N_MIN <= first.shape[-1] <= N_MAX)
    except (AttributeError, RuntimeError):  # not a tensor, or a nested one (no sizes): the op names it
        canonical = True
    if not canonical:
        return _any_shape(name, tensors)
    if grad_form.direct(tensors):
        return _potrf(*tensors) if name == "potrf" else run(name, *tensors)
    if any(getattr(t, "is_nested", False) for t in tensors):  # the dispatcher has no NestedTensor kernel
        signatures.signature_of(name, *tensors)  # names it (SignatureError)
    return _op(name)(*tensors)


# Trailing dimensions of one problem, per operand: the first (x for dot, else the n x n matrix)
# and the second (y, x or b: a vector; gemm's B: a matrix).
_CORE = {"dot": 1, "gemv": 2, "gemm": 2, "potrf": 2, "trsv": 2, "posv": 2}
_CORE2 = {"dot": 1, "gemv": 1, "gemm": 2, "trsv": 1, "posv": 1}
N_MIN, N_MAX = signatures.N_MIN, signatures.N_MAX


def _any_shape(name: str, tensors: tuple) -> Any:
    """torch.linalg's shape convention on the entry points: any leading batch dimensions (none for
    one problem: a 2-D A, 1-D vectors), flattened into the ops' one batch dimension and restored
    on the results (info takes the batch shape, 0-d for one problem, as cholesky_ex's). An n
    outside the family's 2..128 runs the torch arm's forms (no kernel here is built for it), on
    every device, so a system one step past the table is served, not refused.
    The operands' batch shapes must be equal (no broadcasting). Anything else goes to the op
    unchanged, whose checks name the bad value."""
    import torch

    from tunedb.families.linalg.kernels_torch import torch_arm

    first = tensors[0]
    cores = (_CORE[name],) + ((_CORE2[name],) if len(tensors) > 1 else ())
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return _op(name)(*tensors)  # the op's checks name it (a sparse tensor cannot be reshaped)
    for t, c, arg in zip(tensors, cores, signatures.ARG_NAMES[name]):
        if t.dim() < c:  # named here: the op's checks start at the first operand, and blamed A for a 0-d b
            raise SignatureError(f"linalg {name}'s {arg} must have shape {'[..., n, n]' if c == 2 else '[..., n]'} "
                                 f"(any leading batch dimensions), got shape {list(t.shape)}")
    _check_cores(name, tensors, cores)
    flat, lead = batch_dims.fold(tensors, cores, f"linalg {name}")
    if not N_MIN <= first.shape[-1] <= N_MAX:
        signatures.check_call(name, *flat, n_range=False)  # square A, shapes, one dtype and device
        dev = first.device.type
        cast = _any_autocast() and autocast_rule.enabled(dev)
        with torch.autocast(dev, enabled=False) if cast else contextlib.nullcontext():
            out = torch_arm(name, False, flat, None)  # the library arm's forms, no kernel here is built for n
        if name == "potrf":
            out = (row_major(out[0]), out[1])  # L row-major, as every arm returns it
    else:
        out = _call(name, *flat)
    return batch_dims.unfold(out, lead)


def _check_cores(name: str, tensors: tuple, cores: tuple) -> None:
    """The problems' own dimensions, named with the shapes the caller passed (the op's checks see
    them folded): A square, and every other operand's n A's."""
    args = signatures.ARG_NAMES[name]
    first = tensors[0]
    n = first.shape[-1]
    if cores[0] == 2 and first.shape[-2] != n:
        raise SignatureError(f"linalg {name}'s {args[0]} must be square, shape [..., n, n], got shape {list(first.shape)}")
    if len(tensors) < 2:
        return
    t, c = tensors[1], cores[1]
    want = (n,) * c
    if tuple(t.shape[t.dim() - c:]) == want:
        return
    if c == 1 and t.dim() >= 2 and t.shape[-2] == n and tuple(t.shape[:-1]) == tuple(first.shape[:first.dim() - cores[0] + 1]):
        raise SignatureError(f"linalg {name}'s {args[1]} takes one vector per problem, shape [..., n] with n = {n} "
                             f"({args[0]}'s), got shape {list(t.shape)}: a matrix of right-hand sides [..., n, k] "
                             f"is not taken (pass each column, {args[1]}[..., j], or move k into the batch)")
    core = "[..., n, n]" if c == 2 else "[..., n]"
    raise SignatureError(f"linalg {name}'s {args[1]} must have shape {core} with n = {n} ({args[0]}'s shape "
                         f"{list(first.shape)}), got shape {list(t.shape)}")


def dot(x: Any, y: Any) -> Any:
    """x . y per problem: [batch, n] x [batch, n] -> [batch]."""
    return _call("dot", x, y)


def gemv(a: Any, x: Any) -> Any:
    """A @ x per problem: [batch, n, n] x [batch, n] -> [batch, n]."""
    return _call("gemv", a, x)


def gemm(a: Any, b: Any) -> Any:
    """A @ B per problem: [batch, n, n] x [batch, n, n] -> [batch, n, n]."""
    return _call("gemm", a, b)


def potrf(a: Any) -> tuple[Any, Any]:
    """(L, info): the lower Cholesky factor of each SPD A (only its lower triangle is read);
    info[i] != 0 where A[i] is not positive definite."""
    return _call("potrf", a)


def trsv(low: Any, b: Any) -> Any:
    """x with L x = b per problem (L lower triangular, non-unit diagonal; its upper part unread)."""
    return _call("trsv", low, b)


def posv(a: Any, b: Any) -> tuple[Any, Any]:
    """(x, info): x with A x = b per SPD problem; info as potrf's."""
    return _call("posv", a, b)


_PUBLIC = {"dot": dot, "gemv": gemv, "gemm": gemm, "potrf": potrf, "trsv": trsv, "posv": posv}


def report() -> list[tuple[str, int, str, str, int]]:
    """(signature, batch, config, tier, calls) of every key resolved this epoch."""
    return [(b.signature.format(), b.m, b.config.id, b.tier, b.calls) for b in _bound.values()]


# Registered at import, not on an op's first call: a first call inside torch.compile would run
# register() under Dynamo, which cannot enter its lock (fullgraph=True raised "Unsupported
# context manager"; without fullgraph the call graph-broke). Importing this module imports torch;
# importing the family package still does not.
register()
