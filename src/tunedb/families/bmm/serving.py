"""optimize()'s hook for the bmm family: serving the products a model makes in plain Python.

Eager attention is not a module: transformers' eager path and the census mirrors call
torch.matmul(q, k.transpose(-1, -2)) and torch.matmul(probs, v) inside a forward. No module swap
reaches those calls, so the hook wraps the model's forward (a forward pre-hook and an always-call
forward hook, which deep copies keep) in `ProductMode`, a TorchFunctionMode that sends
torch.matmul / torch.bmm / Tensor.__matmul__ of two CUDA activations (same dtype, fp16 / bf16 /
fp32, 3-D or more with equal batch dims, no gradient wanted) to tunedb::bmm -- but only keys
whose selection is a Triton tile: a key served by torch.bmm runs the original call.

What it cannot swap: SDPA (transformers' default attention, torch's nn.MultiheadAttention on its
fast path) never reaches a matmul; flash / SDPA kernels are not this family's. Products under
torch.compile are left to inductor: torch.compile(model) runs a module's hooks as Python around its
compiled forward, so the first compiled call takes them off (session 48: they cost each compiled
forward host time, Llama-3-8B 0.94x of compile alone), and model.compile() sheds or traces them alike. The mode costs a Python hop per torch call inside the
forward in eager mode, so optimize() installs it only when this arch has a bmm table with
entries and CUDA runs (without it no product is the mode's); under CUDA graphs the hop is paid
at capture only. Its hooks make a model fail torch.jit.script (TorchScript compiles a module's
forward hooks); `optimize(model, families=[...])` without "bmm" leaves them out. In eager mode
a forward that served no product with a tile makes the model skip the mode for its next 1, 2, 4, ... 1024 eager forwards
(probing again after each gap; a forward that serves one resets it): a model whose attention is
SDPA (Llama in transformers) makes no product the op serves, and the hop on every torch call of its
forward, our own GEMM launches' included, cost s17 D's Llama-3-8B decode 26-37% in eager. A model
whose forward made products the op could take but torch served at those shapes backs off at most
8 forwards (its next request's M may be a tile's; only products whose signature some loaded
table tiles at another M count: may_become_tile); a new database epoch ends a back-off; a forward
under stream capture always runs the mode (paid once, at capture) and leaves the back-off as it
was. A model whose probe after a 64-forward gap again finds nothing retires the mode (its hooks
come off: _retire) until a new epoch or autotune() re-arms it. A model holding
nn.MultiheadAttention gets no mode (holds_native_fast_path).
"""
from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

from tunedb.families.bmm import compiled_calls, configs

_state = threading.local()
_decisions: dict[tuple[Any, ...], Any] = {}  # call_key -> bound (a tile), _CANDIDATE or None (torch)
_SERVED_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")


def _clear() -> None:
    _decisions.clear()
    _tiled_sigs.clear()


# Signature -> whether a loaded table names a tile for it at some size (this epoch)
_tiled_sigs: dict[Any, bool] = {}
# what _decisions holds for a product torch serves at this shape but a tile may serve at another M
_CANDIDATE = "candidate"


def may_become_tile(signature: Any) -> bool:
    """Whether a product that torch serves now could be a tile's at another M (the next request's
    shapes): a loaded bmm table (user or system tier) names a tile at some size for its signature
    (B, N, K, layout and dtype; M is the size axis), or an override (autotune()) or a ranker
    (set_ranker) is installed. The family has no heuristic, so a signature no table measured is
    torch's at every M: its products are not candidates and the mode backs off fully. Judged per
    dtype before session 31, an unseen model's bf16 attention (no table names its shapes, but a
    shipped table tiles some bf16 key) held the back-off at 8 forwards: one eager forward in nine
    ran under the mode, 1.30x plain in eager (einsum attention, H200)."""
    from tunedb.families.bmm import ops

    if ops._overrides:
        return True
    got = _tiled_sigs.get(signature)
    if got is None:
        from tunedb.database import tiers

        tiers.on_reload(_clear)
        got = _tiled_sigs[signature] = _table_tiles(signature)
    return got


def _table_tiles(signature: Any) -> bool:
    from tunedb import database
    from tunedb.runtime import selector

    if selector._rankers.get(configs.FAMILY) is not None:  # set_ranker(): the model tier may tile any key
        return True
    try:
        arch_family, _ = selector.current_arch()
        files = database.lookup(arch_family, configs.FAMILY)
        return any(region.config_id not in configs.FAMILY_SENTINELS
                   for key in signature.lookup_keys() for res in files
                   for region in getattr(res.db.entries.get(key), "regions", ()))
    except Exception:  # a tier that cannot answer: assume it could (probe often, as before)
        return True


def eligible(a: Any, b: Any) -> bool:
    """Whether the op may serve torch.matmul(a, b): two CUDA activations of one served dtype, 3-D
    or more with equal batch dims, dense, no gradient wanted, no autocast cast, not empty."""
    import torch

    from tunedb.runtime import autocast_rule

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.layout != torch.strided or b.layout != torch.strided:  # a sparse product is torch's
        return False
    if a.device.type != "cuda" or b.device != a.device or a.dtype != b.dtype or str(a.dtype) not in _SERVED_DTYPES:
        return False
    if a.dim() < 3 or a.dim() != b.dim() or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        return False
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return False
    if autocast_rule.casts("cuda", a, b):  # torch.matmul would cast the operands; the op would not
        return False
    return a.numel() != 0 and b.numel() != 0


def fold(a: Any, b: Any) -> tuple[Any, Any, tuple[int, ...]] | None:
    """(a3, b3, batch shape) for a product the op may serve, else None. A 4-D attention operand
    whose batch dims do not merge into one (a head-split view: q.view(b, t, h, d).transpose(1, 2))
    is copied here, as torch.matmul copies it too."""
    return _folded(a, b) if eligible(a, b) else None


def _folded(a: Any, b: Any) -> tuple[Any, Any, tuple[int, ...]]:
    from tunedb.runtime import batch_dims

    (a3, b3), batch = batch_dims.fold((a, b), (2, 2), "bmm")
    return a3, b3, batch


def serve(a: Any, b: Any) -> Any:
    """tunedb::bmm's result for a product whose key runs a Triton tile, else None.

    The decision is keyed on the call as made (shapes and strides, which decide what fold()
    gives), so a product torch serves is handed back before fold() reshapes anything: reshaping a
    head-split operand is a copy, which a torch-served product would pay on top of torch.matmul's
    own (session 31: einsum attention 1.09x slower in CUDA graphs)."""
    from tunedb.families.bmm import ops

    if not eligible(a, b):
        return None
    key = ops.call_key(a, b)
    decision = _decisions.get(key, _UNSEEN)
    if decision is _UNSEEN or ops._overrides:
        from tunedb.database import tiers

        tiers.on_reload(_clear)
        a3, b3, _batch = _folded(a, b)
        bound = ops.bound_for(a3, b3)
        if not ops.serves_torch(bound):
            decision = bound
        else:  # a candidate when a later request's M may be a tile's
            decision = _CANDIDATE if may_become_tile(bound.signature) else None
        if not ops._overrides:  # autotune()'s answers last only while it is active
            _decisions[key] = decision
    if decision is None:
        return None
    if decision is _CANDIDATE:
        _state.candidates = getattr(_state, "candidates", 0) + 1
        return None
    from tunedb.runtime import batch_dims

    a3, b3, batch = _folded(a, b)
    c = ops.bmm(a3, b3)
    _state.served = getattr(_state, "served", 0) + 1
    return batch_dims.unfold(c, batch)


_UNSEEN = object()


def _products() -> frozenset:
    import torch

    return frozenset((torch.bmm, torch.matmul, torch.Tensor.bmm, torch.Tensor.matmul, torch.Tensor.__matmul__))


def product_mode() -> Any:
    """A TorchFunctionMode serving tuned products (see the module docstring)."""
    return _mode_class()()


@functools.lru_cache(maxsize=1)
def _mode_class() -> type:
    """The ProductMode class, made once (a class statement per forward cost the eager call its
    creation, and under torch.compile is a graph break: fullgraph=True failed on it)."""
    import torch
    from torch.overrides import TorchFunctionMode

    products = _products()

    class ProductMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in products and len(args) == 2 and not kwargs and not torch.compiler.is_compiling():
                out = serve(*args)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    return ProductMode


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


_MAX_GAP = 1024  # eager forwards skipped at most between two probes of a model serving nothing
# ... of a model that made products the op could take, all served by torch at those shapes: its
# next request's shapes (a prefill after a long decode) may be a tile's, so it probes often
_PRODUCT_GAP = 8


def _capturing() -> bool:
    from tunedb.runtime import launch_table

    return launch_table._capturing()


def _enter(module: Any, args: Any) -> None:
    # Runs before every eager forward of an optimized model, most of them skipped (the back-off
    # above): the skip path reads the module's __dict__ and the bound checks only, and writes the
    # counter into __dict__ (Module.__setattr__ walks the parameter, buffer and module dicts
    # first). It cost an unseen decoder's forward 32 us on the H200's host (session 30).
    compiling, capturing, epoch, tracing, frame_callback = _checks or _bind_checks()
    if tracing():  # Dynamo traces the hook (module.compile()): the compiler keeps the products
        return
    state = module.__dict__
    if frame_callback() is not None:
        # a torch.compile'd module's call, whose hooks run as Python outside the compiled graphs
        # while the compiler takes every product: the hooks serve nothing there, yet made each
        # compiled forward's host path longer (Module's hooked call path, the hooks' guards,
        # these frames: Llama-3-8B 0.94x of compile alone, session 48). Off until a new epoch.
        compiled_calls.outside_dynamo(_retire)(module)
        return
    if compiling():  # another trace (export's): no mode to trace
        return
    if state.get("_tunedb_bmm_retired"):  # its hooks are coming off (_retire): push nothing
        return
    stack = getattr(_state, "modes", None)
    if stack is None:
        stack = _state.modes = []
    with _inflight_lock:
        state["_tunedb_bmm_inflight"] = state.get("_tunedb_bmm_inflight", 0) + 1
    skip = state.get("_tunedb_bmm_skip", 0)
    if skip:
        if state.get("_tunedb_bmm_epoch") != epoch():
            # a new database epoch (a tune, autotune()'s or prewarm's publish, a reload) may serve
            # what the last probe found torch for: probe now, not after up to _MAX_GAP forwards
            state["_tunedb_bmm_skip"] = state["_tunedb_bmm_gap"] = 0
        elif not capturing():  # (a capture always runs the mode, and keeps the back-off)
            state["_tunedb_bmm_skip"] = skip - 1
            stack.append((module, None))  # _exit pops the entry its own forward pushed
            return
    mode = product_mode()
    mode.__enter__()
    stack.append((module, mode, getattr(_state, "served", 0), getattr(_state, "candidates", 0)))


def _exit(module: Any, args: Any, output: Any) -> None:
    stack = getattr(_state, "modes", None)
    if not stack or stack[-1][0] is not module:  # this forward pushed nothing (compiled, retiring)
        return
    entry = stack.pop()
    state = module.__dict__
    with _inflight_lock:
        state["_tunedb_bmm_inflight"] = state.get("_tunedb_bmm_inflight", 1) - 1
    if entry[1] is None:
        return
    _module, mode, served_before, candidates_before = entry
    mode.__exit__(None, None, None)
    _compiling_now, capturing, epoch, _tracing, _compiled = _checks or _bind_checks()
    if capturing():  # a capture always runs the mode and leaves the eager back-off as it was
        return
    if getattr(_state, "served", 0) > served_before:
        state["_tunedb_bmm_gap"] = 0
        return
    cap = _PRODUCT_GAP if getattr(_state, "candidates", 0) > candidates_before else _MAX_GAP
    # never while an exception unwinds (torch then runs this hook inside its own loop over the
    # hooks dict, which _retire changes) nor under autotune()
    if (cap == _MAX_GAP and state.get("_tunedb_bmm_gap", 0) >= _RETIRE_GAP and not _overridden()
            and sys.exc_info()[1] is None and _retire(module)):
        return
    gap = min(2 * state.get("_tunedb_bmm_gap", 0) or 1, cap)
    state["_tunedb_bmm_gap"] = state["_tunedb_bmm_skip"] = gap
    state["_tunedb_bmm_epoch"] = epoch()  # a back-off holds within its epoch


# A probe after a gap this long that again served nothing and met no candidate (no product
# whose signature a table tiles at any M) retires the mode on that model: its hooks come off.
# Kept on, the hooks alone (Module.__call__'s hooked path and the skip path) cost an eager
# forward 3-10 us on the H200's host: 3-8% of a small unseen model's forward (session 31,
# bench/unseen_zoo.py). A new database epoch (a tune, a publish) or autotune() entering re-arms
# it (_revive); so does optimize() run again.
_RETIRE_GAP = 64
_retired: "weakref.WeakSet[Any]" = weakref.WeakSet()
_inflight_lock = threading.Lock()  # each hooked module's forwards in flight (_tunedb_bmm_inflight)


def _overridden() -> bool:
    from tunedb.families.bmm import ops

    return bool(ops._overrides)


def _retire(module: Any) -> bool:
    """Take the mode's hooks off `module` unless one of its forwards is in flight (another
    thread's, or an outer call of the same module): one whose _exit would then never run would
    leave the mode on its thread's stack. True when it did."""
    from tunedb.database import tiers
    from tunedb.runtime import launch_table

    state = module.__dict__
    with _inflight_lock:
        if state.get("_tunedb_bmm_inflight", 0):
            return False
        state["_tunedb_bmm_retired"] = True  # a forward whose pre-hook already ran pushes nothing
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key in [k for k, h in hooks.items() if h is _enter or h is _exit]:
                del hooks[key]
                module._forward_hooks_always_called.pop(key, None)
    for name in ("_tunedb_bmm_skip", "_tunedb_bmm_gap", "_tunedb_bmm_epoch"):
        state.pop(name, None)
    state["_tunedb_bmm_serving"] = False
    _retired.add(module)
    tiers.on_reload(_revive)
    launch_table.on_override(_revive)
    return True


def _revive() -> None:
    """Re-install the mode on every live model it retired from (a new epoch, or autotune())."""
    for module in list(_retired):
        _retired.discard(module)
        install(module)


_checks: list[Any] = []


def _bind_checks() -> list[Any]:
    """(is_compiling, is the current stream capturing, the database epoch: the selector's, which
    is the tiers', whether Dynamo traces, Dynamo's frame callback: compiled_calls), bound once:
    the hook is installed only where CUDA runs (optimize), so torch's
    C getter of the capture state is safe to call, without torch.cuda's availability check in
    Python each forward."""
    import torch

    from tunedb.database import tiers

    fast = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) if torch.cuda.is_available() else None
    # a CPU build's torch._C names a dummy that raises: there the module's _capturing, looked up
    # at each call
    capturing = fast or (lambda: _capturing())
    compiling = torch.compiler.is_compiling
    # Dynamo's trace alone (is_compiling is also true for a whole torch.compile'd call on newer torch)
    tracing = getattr(torch.compiler, "is_dynamo_compiling", compiling)
    _checks[:] = [compiling, capturing, tiers.epoch, tracing, compiled_calls.frame_callback()]
    return _checks


# optimize()'s other families read a module's hooks as a user's (GEMM fuses nothing in a hooked
# module); these two change no input or output, so they say they are tunedb's own
_enter.tunedb_own_hook = True  # type: ignore[attr-defined]
_exit.tunedb_own_hook = True  # type: ignore[attr-defined]


def has_table() -> bool:
    """Whether this arch's bmm tables (user or system tier) hold any entry."""
    from tunedb import database
    from tunedb.runtime import selector

    arch_family, _ = selector.current_arch()
    return any(res.db.entries for res in database.lookup(arch_family, configs.FAMILY))


def install(model: Any) -> Any:
    """Wrap `model`'s forward in ProductMode (once)."""
    if getattr(model, "_tunedb_bmm_serving", False):
        return model
    model.__dict__.pop("_tunedb_bmm_retired", None)
    compiled_calls.skip_frames(_enter, _exit)
    _checks or _bind_checks()  # now: bound on a first call that model.compile() traces, it diverged (grad_form.bind)
    model.register_forward_pre_hook(_enter)
    model.register_forward_hook(_exit, always_call=True)
    model._tunedb_bmm_serving = True
    return model


def can_serve() -> bool:
    """Whether this process can run a product the mode would serve: it serves CUDA activations
    only, so without CUDA the hooks would serve nothing, yet cost a hop per torch call of an
    eager forward, and make the model fail torch.jit.script (TorchScript compiles a module's
    forward hooks and needs them typed like its forward) and torch.jit.trace's check, which a
    plain model passes."""
    import torch

    return torch.cuda.is_available()


def holds_native_fast_path(model: Any) -> bool:
    """Whether `model` holds an nn.MultiheadAttention (alone or inside torch's Transformer layers).
    Their inference forward takes a fused native path (torch._native_multi_head_attention,
    torch._transformer_encoder_layer_fwd) only while torch.overrides.has_torch_function() is false
    for their tensors, which ANY active TorchFunctionMode makes true: under the product mode they
    run their composite path, in CUDA graphs too (session 31, H200: a ViT 1.17x and torch's
    TransformerEncoder 1.41x slower than plain in graphs). The mode never serves their products
    (product_source.py), so it is left off such a model: what the fast path buys is larger than
    what the mode's tiles bought anywhere (1.03x over torch.bmm in geomean)."""
    import torch

    return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def optimize(model: Any) -> Any:
    """The family's optimize() hook: install the product mode where a bmm table has entries, CUDA
    runs (can_serve), the model's code can make a product (product_source.makes_products) and no
    native fast path would be lost (holds_native_fast_path)."""
    from tunedb.families.bmm.product_source import makes_products

    if not (has_table() and can_serve()) or holds_native_fast_path(model):
        return model
    return install(model) if makes_products(model) else model
