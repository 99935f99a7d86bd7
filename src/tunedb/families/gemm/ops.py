"""The tuned ops, registered with torch.library: ``tunedb::gemm`` and ``tunedb::gemm_act``.

    tunedb::gemm(Tensor x, Tensor weight, str tiers="") -> Tensor       x @ weight.T
    tunedb::gemm_act(Tensor x, Tensor weight, Tensor? bias, str act, str tiers="") -> Tensor
                                                                         act(x @ weight.T + bias)

``tiers`` never changes the result: it is the selection state (launch_table.compile_token) the
entry points saw when a compiler traced the call, so a compiled graph -- and every compile cache
keyed on it -- names the state its compile-time choices were made from (ops_compile.py).

``weight`` is laid out like ``nn.Linear.weight`` (N, K); x is (..., K). CUDA tensors run the
launcher the launch table bound for the shape; other devices (CPU, meta) run the torch arm
(F.linear + activation), so a patched model still runs on a machine without a GPU. Fake
kernels let torch.compile trace the ops; the autograd formula (ops_autograd.py) recomputes the
pre-activation.

Importing this module registers the ops (once per process). ``gemm`` / ``gemm_act`` below are
the entry points: in plain eager inference they call the implementation directly (the
dispatcher adds host time and nothing else there); under torch.compile, autograd or tensor
subclasses (FakeTensor) they go through ``torch.ops.tunedb``.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from tunedb.errors import OperandMismatchError, SignatureError
from tunedb.families.gemm.arms import act_fn
from tunedb.families.gemm.configs import ACTS as GEMM_ACTS
from tunedb.families.gemm import ops_autocast
from tunedb.families.key_rules import check_one_device, check_tensors
from tunedb.families.gemm.ops_autograd import _TunedGemm, torch_form
from tunedb.runtime import batch_dims, export_forms, fx_nodes, grad_form, launch_table

# The activations the GEMM family fuses, as the torch arm computes them (the CPU/meta path).
ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    name: act_fn(name) or (lambda y: y)
    for name in ("none", *sorted(a for a in GEMM_ACTS if a != "none"))}  # listed in errors in this order


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> None:
    if act not in ACTS:
        raise SignatureError(f"unknown activation act={act!r}; allowed: {', '.join(ACTS)}")
    if weight.dim() != 2:
        raise SignatureError(f"weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise OperandMismatchError(
            f"x's last dimension must equal weight's K={weight.shape[1]}, got x shape {tuple(x.shape)}"
        )
    if x.dtype != weight.dtype:
        raise OperandMismatchError(f"x dtype {x.dtype} differs from weight dtype {weight.dtype}; cast one of them")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise OperandMismatchError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if bias is not None and bias.dtype != x.dtype:
        raise OperandMismatchError(f"bias dtype {bias.dtype} differs from x dtype {x.dtype}; cast one of them")
    # a key's first call only (a memoised CUDA key checks nothing: docs/runtime.md)
    check_one_device("gemm", x=x, weight=weight, bias=bias)


_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_SERVED = (torch.float16, torch.bfloat16)  # what the GEMM family tunes; others take the torch arm


def _run(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
         act: str, key: tuple[Any, ...] | None = None) -> torch.Tensor:
    # a dtype the family does not serve (fp32) is not its call: the aten census keys its GEMM
    if launch_table.recording_active() and x.dtype in _SERVED:
        launch_table.record(op, x, weight, bias, act)
        with launch_table.recorded_call():
            return _execute(op, x, weight, bias, act, None)
    return _execute(op, x, weight, bias, act, key)


def _unserved(x: torch.Tensor) -> bool:
    """Devices and dtypes the GEMM family never serves (CPU, meta, fp32): the torch arm's."""
    return x.device.type != "cuda" or x.dtype not in _SERVED


def _execute(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             act: str, key: tuple[Any, ...] | None) -> torch.Tensor:
    n, k = weight.shape
    if _unserved(x) or k == 0:  # the bias as given: torch's CPU linear rounds a strided one apart
        return ACTS[act](F.linear(x, weight, bias))
    if bias is not None and not bias.is_contiguous():  # the Triton epilogue reads it at stride 1
        bias, key = bias.contiguous(), None  # and such calls never take the call memo
    m = x.numel() // k
    if m == 0 or n == 0:
        return x.new_empty((*x.shape[:-1], n))
    if x.get_device() != _current_device():  # a layer on another GPU (device_map="auto"): its
        with torch.cuda.device(x.device):  # first launch (a compile, a probe) runs there; later
            return _execute(op, x, weight, bias, act, key)  # calls' Triton sites switch by themselves
    # the launcher takes x as [..., K] and returns a fresh [..., N] tensor
    bound = launch_table.launcher(op, x, weight, bias, act, m)
    if bound.launched:
        y = bound.call(x, weight, bias, None)
    else:
        y = launch_table.first_launch(bound, x, weight, bias)
    if key is not None:
        launch_table.remember(key, bound)
    return y


# --- registration -------------------------------------------------------------------------
# Defined with torch.library's low-level API rather than torch.library.custom_op: inside a
# compiled graph every call goes through the dispatcher, and custom_op's generic Python layers
# (an autograd kernel that runs even without grad, a redispatch, a dynamo-disable wrapper, an
# aliasing check) cost ~3x what the call itself costs on the host (CPU: 39 vs 19 us per gemm_act
# call). Here the Autograd kernel below calls the implementation directly when no gradient is
# needed and the tensors are plain (no subclass, no dispatch mode), and otherwise applies an
# autograd.Function whose forward redispatches below autograd, as custom_op's does. The GPU path
# through it is not yet measured on the device (bench/host_overhead.py's dispatcher row).

_lib = torch.library.Library("tunedb", "DEF")  # noqa: TOR901 - kept alive for the process
_lib.define("gemm(Tensor x, Tensor weight, str tiers='') -> Tensor")
_lib.define("gemm_act(Tensor x, Tensor weight, Tensor? bias, str act, str tiers='') -> Tensor")


def _serve(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           act: str) -> torch.Tensor:
    """A call through the dispatcher (a compiled graph's opaque op, autograd): a CUDA call whose
    exact key already ran this epoch goes straight to its bound launcher (launch_table.known), as
    an eager entry-point call does; any other is validated and resolved."""
    key = None
    if x.is_cuda:
        key = (op, act, x.shape, x.dtype, weight.shape, weight.dtype,
               None if bias is None else (bias.shape, bias.dtype, bias.is_contiguous()))
        bound = _known(key)
        if bound is not None:
            bound.counter.calls += 1
            direct = bound.direct
            return bound.call(x, weight, bias, None) if direct is None else direct(x, weight, bias)
    _check(x, weight, bias, act)
    return _run(op, x, weight, bias, act, key)


def _gemm_impl(x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> torch.Tensor:
    return _serve("gemm", x, weight, None, "none")


def _gemm_act_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   act: str, tiers: str = "") -> torch.Tensor:
    return _serve("gemm_act", x, weight, bias, act)


# every backend: CUDA tensors run the launch table's launcher, others the torch arm
_lib.impl("gemm", _gemm_impl, "CompositeExplicitAutograd")
_lib.impl("gemm_act", _gemm_act_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("tunedb::gemm_act", lib=_lib)
def _gemm_act_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   act: str, tiers: str = "") -> torch.Tensor:
    _check(x, weight, bias, act)
    if x.device.type != "meta":
        from tunedb.families.gemm import ops_compile

        if not ops_compile.registered[0]:
            ops_compile.register_compile_decompositions()  # a compiler is tracing the op: before its lowering
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("tunedb::gemm", lib=_lib)
def _gemm_fake(x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> torch.Tensor:
    return _gemm_act_fake(x, weight, None, "none")


_dispatch_modes = torch._C._len_torch_dispatch_stack
_tls_included = torch._C._dispatch_tls_is_dispatch_key_included
_FUNCTIONALIZE = torch._C.DispatchKey.Functionalize
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # a Parameter (model weights) has no dispatch hook
_DIRECT_DEVICES = ("cuda", "cpu")


def _plain_no_grad(x: torch.Tensor, *rest: torch.Tensor | None) -> bool:
    """No gradient needed, no tensor subclass (FakeTensor, FunctionalTensor), no dispatch mode,
    no C++ functionalization, a CUDA or CPU x (meta tensors take the fake kernel): the cases where
    the kernels below autograd would only reach the implementation anyway."""
    if _dispatch_modes() or x.device.type not in _DIRECT_DEVICES or _tls_included(_FUNCTIONALIZE):
        return False
    grad = _grad_enabled()
    for t in (x, *rest):
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad)):
            return False
    return True


def _gemm_autograd(x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> torch.Tensor:
    if type(x) not in _PLAIN or type(weight) not in _PLAIN:  # a subclass passes; None, a number: named
        check_tensors("gemm", x=x, weight=weight)
    if _transformed():
        return torch_form(x, weight, None, None)
    if _plain_no_grad(x, weight):
        return _gemm_impl(x, weight)
    return _TunedGemm.apply(x, weight, None, None, tiers)


def _gemm_act_autograd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       act: str, tiers: str = "") -> torch.Tensor:
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        check_tensors("gemm_act", ("bias",), x=x, weight=weight, bias=bias)
    if _transformed():
        return torch_form(x, weight, bias, act)
    if _plain_no_grad(x, weight, bias):
        return _gemm_act_impl(x, weight, bias, act)
    return _TunedGemm.apply(x, weight, bias, act, tiers)


_lib.impl("gemm", _gemm_autograd, "Autograd")
_lib.impl("gemm_act", _gemm_act_autograd, "Autograd")
# what torch.onnx.export (dynamo=True) decomposes them to: the torch form (runtime/export_forms.py)
export_forms.register(torch.ops.tunedb.gemm.default, lambda x, weight, tiers="": torch_form(x, weight, None, None))
export_forms.register(torch.ops.tunedb.gemm_act.default,
                      lambda x, weight, bias=None, act="none", tiers="": torch_form(x, weight, bias, act))
ops_autocast.register(_lib, ACTS)  # under torch.autocast: what F.linear computes there


def _vmap_gemm(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> Any:
    return _vmap_act(info, (*in_dims[:2], None), x, weight, None, "none")


def _vmap_act(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None = None, act: str = "none", tiers: str = "") -> Any:
    """torch.vmap's rule for the ops called directly (an exported optimize()d model's graph calls
    them; the entry points run the torch form under a transform). Without one, torch's fallback
    ran the op once per vmapped slice, with a warning and other low bits than vmap over the plain
    layer (s43 audit). A vmapped x only: the vmapped dim joins x's rows, one call (F.linear's own
    batching). A vmapped weight or bias (per-sample layers): a batched matmul in torch's ops."""
    x_dim, w_dim, b_dim = (*in_dims, None, None)[:3]
    if w_dim is None and b_dim is None:
        x = x.movedim(x_dim, 0)
        return (gemm(x, weight) if bias is None and act == "none" else gemm_act(x, weight, bias, act)), 0
    size = info.batch_size
    x, weight = batch_dims.vmapped_front((x, weight), (x_dim, w_dim), size)
    if size:  # the checks of one vmapped slice (bad operands are named as outside vmap)
        _check(x[0], weight[0], bias if b_dim is None else bias.select(b_dim, 0), act)
    lead = x.shape[1:-1]
    y = torch.matmul(x.reshape(size, -1, x.shape[-1]), weight.mT)
    if bias is not None:
        y = y + batch_dims.vmapped_front((bias,), (b_dim,), size)[0].unsqueeze(1)
    return ACTS[act](y).reshape(size, *lead, weight.shape[1]), 0


torch.library.register_vmap("tunedb::gemm", _vmap_gemm, lib=_lib)
torch.library.register_vmap("tunedb::gemm_act", _vmap_act, lib=_lib)


# --- entry points -------------------------------------------------------------------------

# Plain tensors, eager, no autograd: the dispatcher would add nothing, so the entry points call
# the implementation directly (anything else goes through torch.ops.tunedb). On CUDA a call whose
# exact key (op, act, shapes, dtypes) already ran this epoch was validated then, and goes straight
# to its bound launcher (launch_table.known).
# Under torch.autocast every call takes the dispatcher (ops_autocast.py).
# The trace check: Dynamo's own flag (a plain `return False` in eager, constant True while
# Dynamo traces; 45 ns cheaper than is_compiling()), then the dispatch-mode stack -- the other
# tracers run under a mode (non-strict export's fake mode, make_fx's proxy mode), and a plain
# tensor can reach the entry points there (an exported module's lifted constant); so can a
# debugging mode (FlopCounterMode). Those calls go through the dispatcher, where the modes see
# tunedb's ops. Subclass tensors (FakeTensor, FunctionalTensor) fail the type check first.
# The one mode that wants the eager path is tunedb's own census recorder (census.recorder): it
# counts tuned calls through launch_table.record, and their torch arm's aten ops not at all.
_compiling = getattr(torch.compiler, "is_dynamo_compiling", None) or torch.compiler.is_compiling
# torch.jit.trace records only dispatched ops: a Triton launch run directly would be kept as a
# constant output on CUDA, and the CPU's torch form recorded as aten ops in one grad mode only
# (the trace's no-grad check then failed). Traced, a call goes through torch.ops.tunedb
_jit_tracing = torch._C._get_tracing_state
_recording = launch_table.recording_active
_known = launch_table.known
# torch.autocast on for any device: the call goes through the dispatcher, whose Autocast kernel
# (ops_autocast.py) computes what F.linear does under it (one C call, ~85 ns on a slow CPU)
_autocast = torch._C._is_any_autocast_enabled
# A functorch or forward-AD transform: the call runs the torch form (ops_autograd.torch_form); the
# tuned kernels and _TunedGemm (no jvp, no functorch rule) would drop a tangent or fail
_transformed = grad_form.transformed
grad_form.bind()  # now, not on a first call inside a compiled frame (grad_form.bind)


def _token() -> str:
    return launch_table.compile_token()


# What torch.compiler.assume_constant_result sets, set directly: that function imports Dynamo
# (~1.3 s) and this module must import cheaply. Dynamo then calls _token at trace time and puts
# its result in the graph as a constant, with no guard on it. Only a trace reads the token (a
# compiler, or a tracer's tensor subclass): an eager call that needs autograd passes "".
_token._dynamo_marked_constant = True  # type: ignore[attr-defined]
# the current CUDA device, cheaply (a call's x is already on CUDA, so CUDA is initialised)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


# The entry points below repeat _serve's body inline: the eager hot path saves a call frame.
# Their first test is the whole eager fast path (families/gemm/patching.py's TunedLinear.forward
# repeats it, so a swapped Linear pays one frame less): a plain CUDA tensor, no tracer, dispatch
# mode or autocast, no gradient wanted, and a call key that already ran this epoch. Anything
# else (a miss included) takes _entry, which sorts the call as the checks below describe.
def gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through the tuned selection (weight is (N, K), like nn.Linear.weight)."""
    if (type(x) is _Tensor and x.is_cuda and not (_compiling() or _dispatch_modes() or _autocast() or _transformed() or _jit_tracing())
            and not (_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        bound = _known(("gemm", "none", x.shape, x.dtype, weight.shape, weight.dtype, None))
        if bound is not None:
            bound.counter.calls += 1
            direct = bound.direct
            return bound.call(x, weight, None, None) if direct is None else direct(x, weight)
    return _entry("gemm", x, weight, None, "none")


def gemm_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             act: str = "none") -> torch.Tensor:
    """act(x @ weight.T + bias); act is one of none, gelu, gelu_tanh, relu, silu."""
    if (type(x) is _Tensor and x.is_cuda and not (_compiling() or _dispatch_modes() or _autocast() or _transformed() or _jit_tracing())
            and not (_grad_enabled() and (x.requires_grad or weight.requires_grad
                                          or (bias is not None and bias.requires_grad)))):
        bound = _known(("gemm_act", act, x.shape, x.dtype, weight.shape, weight.dtype,
                        None if bias is None else (bias.shape, bias.dtype, bias.is_contiguous())))
        if bound is not None:
            bound.counter.calls += 1
            direct = bound.direct
            return bound.call(x, weight, bias, None) if direct is None else direct(x, weight, bias)
    return _entry("gemm_act", x, weight, bias, act)


def _entry(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           act: str) -> torch.Tensor:
    """An entry-point call the fast path did not serve: traced, autocast or autograd calls go
    through torch.ops.tunedb; an eager call is validated, resolved and (CUDA) memoised; under a
    functorch transform or forward-mode AD the torch form serves (ops_autograd.torch_form)."""
    if type(x) is not _Tensor or type(weight) not in _PLAIN or (bias is not None and type(bias) not in _PLAIN):
        node = (fx_nodes.recorded(gemm, (x, weight)) if op == "gemm"
                else fx_nodes.recorded(gemm_act, (x, weight, bias, act)))
        if node is not None:  # symbolic_trace: one node, the public function
            return node
        check_tensors(op, ("bias",), x=x, weight=weight, bias=bias)
    if _transformed():
        return torch_form(x, weight, bias, act)
    traced = (type(x) is not _Tensor or _compiling() or (_dispatch_modes() and not _recording())
              or _jit_tracing() is not None)
    autocast = _autocast() and not (_recording() and ops_autocast.off_for(x))  # a census: see off_for
    if traced or autocast or (_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                     or (bias is not None and bias.requires_grad))):
        token = _token() if traced else ""
        if op == "gemm":
            return torch.ops.tunedb.gemm(x, weight, token)
        return torch.ops.tunedb.gemm_act(x, weight, bias, act, token)
    return _serve(op, x, weight, bias, act)  # eager: the implementation, as the dispatcher's would
