"""optimize(model): swap nn.Linear for TunedLinear and fuse a following activation where safe.

How fusion is decided (no torch.fx, no tracing; a structural rule that errs towards not fusing):

1. nn.Sequential (the exact class, whose forward feeds each child only to the next): a
   Linear immediately followed by an activation module fuses; the activation's slot becomes
   nn.Identity (fused_pair.FusedActivation: module surgery after optimize() unfuses the pair).
   This covers torchaudio's Conformer feed-forward (Linear, SiLU, ...). Not where the module
   holding the Sequential uses it other than by calling it (`self.mlp[0](x)`, `for
   layer in self.body: ...; feats.append(x)`: its children then run one by one, and the Linear's
   own output would carry the activation; fusion_source.self_values), nor where any model code
   reads its attribute off another module (`model.mlp[0]`; outside_reads).
2. A module whose own code (read as a Python AST) calls ``self.A(self.L(...))``, or runs
   ``v = self.L(...)`` immediately followed by ``v = self.A(v)`` (L an nn.Linear, A an
   activation module), where ``self.L`` and ``self.A`` each appear exactly once in all of the
   class's methods and properties besides __init__, and in the closures __init__ makes: L's output then flows only into A, and A is
   applied nowhere else, so A's attribute becomes nn.Identity. This covers Hugging Face's
   WhisperEncoderLayer / WhisperDecoderLayer (activation_fn(fc1(x))), LlamaMLP
   (act_fn(gate_proj(x)) * up_proj(x)) and the common `x = self.fc1(x); x = self.act(x)` style.
3. Left as written: a Linear whose key (with its fused activation) tunedb would serve with torch
   at every size, judged when optimize() runs (runtime/fallback_everywhere.py): measured so, or
   a key no table measured that the cost model declines at every probed size (autotune()
   measures those through hooks, then re-runs optimize(): report.measuring_guessed). The swap
   would only add the entry
   path's host time (eager decode: 0.97x of plain on Llama-3-8B; eight unseen models 1.04-1.14x;
   H200).
4. Never fused: a Linear reachable from two places (shared module), a Linear or activation
   with hooks, subclasses of nn.Linear, and everything else. Those Linears are still swapped
   (one TunedLinear per shared Linear), unfused, except hooked ones and subclasses (e.g.
   nn.MultiheadAttention's out_proj, whose weight the attention reads directly), which stay.

5. Siblings (siblings.py, sibling_source.py): TunedLinears a module's code calls on the same
   tensor in one straight run of statements (q, k, v; gate and up) are grouped, and a call at one
   row runs the group as one launch, each member taking its own output for that same tensor.

Activations: nn.GELU (approximate 'none' -> gelu, 'tanh' -> gelu_tanh), nn.ReLU, nn.SiLU, and
Hugging Face's GELUActivation, NewGELUActivation / GELUTanh / PytorchGELUTanh, SiLUActivation.
TunedLinear keeps the Linear's Parameters (same names), so state_dict keys do not change.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tunedb import settings
from tunedb.families.gemm import fused_pair, linear_script, ops, siblings
from tunedb.families.gemm.eager_sizes import note as _note_eager
from tunedb.families.gemm.fused_pair import decided as _decided
from tunedb.families.gemm.fusion_plan import fusions as _fusions
from tunedb.families.gemm.fusion_plan import linear_paths as _linear_paths
from tunedb.families.gemm.left_as_written import TorchEverywhere as _TorchEverywhere
from tunedb.families.gemm.left_as_written import key_of as _key_of
from tunedb.families.gemm.left_as_written import left_why as _left_why
from tunedb.families.gemm.left_modules import (ENCODER_FF, LINEAR_ATTRS, UNPATCHED_KINDS, carried,
                                               encoder_fast_path, unpatched_modules)
from tunedb.families.gemm.left_modules import kept as _kept
from tunedb.families.gemm.left_modules import subclass_weight as _subclass_weight
from tunedb.families.gemm.quiet_members import enter as _quiet_enter
from tunedb.families.gemm.quiet_members import is_quiet as _is_quiet
from tunedb.families.gemm.quiet_members import leave as _quiet_leave
from tunedb.families.gemm.linear_forms import eager_general as _general
from tunedb.families.gemm.linear_forms import traced as _traced
from tunedb.families.gemm.signatures import FAMILY as FAMILY_NAME
from tunedb.runtime import launch_table, report
from tunedb.runtime.fallback_everywhere import GUESSED

# the entry points' fast-path checks (ops.py), bound here once: TunedLinear.forward repeats them
_Tensor, _compiling, _dispatch_modes, _autocast, _grad_enabled, _known, _transformed = (
    ops._Tensor, ops._compiling, ops._dispatch_modes, ops._autocast, ops._grad_enabled, launch_table.known,
    ops._transformed)

# a device's current raw stream (0: the default stream, where nothing is captured); bound only where
# a group's quiet set can hold anything (siblings.SiblingGroup.may_take fills it only with the getter)
_raw_stream = siblings._RAW_STREAM
_generation = launch_table.generation
_linear = F.linear


def _memo_ok(x: Any, weight: Any, params: dict[str, Any], sib: Any) -> bool:
    """Whether an eager call that ran F.linear's arm may enter the layer's memo (eager_sizes.py):
    on a default stream, the weight a registered Parameter, and for a sibling member only a size
    its group declines there (quiet: it launches for none of those eagerly)."""
    return (_raw_stream is not None and params.get("weight") is weight and not _raw_stream(x.get_device())
            and (sib is None or (x.numel(), x.dtype) in sib[0].quiet))


class TunedLinear(nn.Module):
    """nn.Linear (optionally followed by an activation) running through tunedb's tuned ops."""

    def __init__(self, linear: nn.Linear, act: str = "none", approximate: bool = False,
                 act_module: Any = None) -> None:
        super().__init__()
        # the activation module fused away, run as the model wrote it where no tuned kernel
        # serves (a CPU tensor): transformers' NewGELUActivation (Phi, GPT-J) computes tanh-GELU
        # step by step in the model's dtype, which F.gelu(approximate="tanh") rounds
        # differently in bf16. Not a submodule: the module tree and state_dict stay as before.
        object.__setattr__(self, "_act_module", act_module)
        if act not in ops.ACTS:
            raise ValueError(f"unknown activation act={act!r}; allowed: {', '.join(ops.ACTS)}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        # nn.Linear(bias=False)'s own form: a None entry of _parameters (a bias added later with
        # register_parameter, BitFit-style, works as on nn.Linear; a plain tensor is refused)
        if linear.bias is None or isinstance(linear.bias, nn.Parameter):
            self.register_parameter("bias", linear.bias)
        else:  # a plain tensor set where nn.Linear's bias was (a buffer-like attribute): as it was
            self.bias = linear.bias
        self.act = act
        self.approximate = approximate
        self.train(linear.training)
        # a user's (or a library's: transformers' _is_hf_initialized) plain attributes on the
        # Linear stay readable on the module that replaces it
        for name, value in vars(linear).items():
            if (name not in LINEAR_ATTRS and name not in self.__dict__ and name != report.LEFT_MARK
                    and carried(value)):
                self.__dict__[name] = value

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation on the same Parameters, in place: a re-init loop asking
        hasattr(m, "reset_parameters") skipped the swapped layers and kept their old weights."""
        nn.Linear.reset_parameters(self)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        if _compiling():
            return _traced(self, x)
        # the Parameters straight from _parameters, which is what self.weight finds there through
        # Module.__getattr__, a Python frame per read (0.3-0.6 us on a slow host, paid by nn.Linear
        # twice a call); the attribute path serves what is not there (a parametrization's
        # property, a bias of None kept as a plain attribute)
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight
        bias = params["bias"] if "bias" in params else self.bias
        d = self.__dict__
        act = self.act
        pair = d.get("_tunedb_fused") if act != "none" else None
        # sizes whose served config yields to F.linear eagerly (eager_sizes.py); never read while a
        # compiler traces (_traced: its fields would become guards, a recompile at every reload)
        sizes = d.get("_eager_sizes")
        if sizes is not None and sizes.generation == _generation[0] and sizes.weight == id(weight) and type(x) is _Tensor:
            b = sizes.bounds.get((x.shape, x.dtype, bias is None))
            if b is not None and x.is_cuda and not _raw_stream(x.get_device()) and not _dispatch_modes():
                b.counter.calls += 1
                if pair is not None:
                    # a fused pair the torch arm serves eagerly runs as plain whoever calls: the
                    # Linear's own output, its slot applying the activation (no fused_here: its
                    # checks and frame walk cost more host than the pair's whole call saves)
                    _decided(pair, False)
                return F.linear(x, weight, bias)
        if pair is not None and not pair.fused_here():
            # surgery after optimize(), or a caller other than the parent's code: the activation's slot applies it (fused_pair)
            return F.linear(x, weight, bias)
        if "_as_written" in d:  # swapped only to join its siblings (siblings.attach): nn.Linear's cost where it can
            sib = d.get("_siblings")
            if sib is None or type(x) is not _Tensor or not x.is_cuda:
                return F.linear(x, weight, bias)
            group = sib[0]
            default = _raw_stream is not None and not _raw_stream(x.get_device())
            if (default and (x.numel(), x.dtype) in group.quiet) or not group.may_take(x):
                # declined on a default stream (primed where it could launch at all): a group that
                # never launches eagerly lets the member run F.linear with no question asked until
                # a capture (quiet_members.py), whatever the rows (more than the group takes too)
                if default and not group.eager_one_row():  # (a trace returned above)
                    _quiet_enter(self)
                return F.linear(x, weight, bias)
        # ops.gemm / gemm_act's eager fast path, inline (one Python frame less per call): a plain
        # CUDA tensor, no tracer, mode or autocast, no gradient wanted, a key served this epoch.
        # The key is the one those entry points build, so either side's first call fills it.
        if (type(x) is _Tensor and x.is_cuda and not (_dispatch_modes() or _autocast() or _transformed())
                and not (_grad_enabled() and (x.requires_grad or weight.requires_grad
                                              or (bias is not None and bias.requires_grad)))):
            sib = self.__dict__.get("_siblings")  # (group, index): siblings.py, one launch at one row
            # (a size its group declines eagerly, on a default stream: no launch, no kept output to take)
            if sib is not None and not ((x.numel(), x.dtype) in sib[0].quiet and not _raw_stream(x.get_device())):
                y = sib[0].call(sib[1], x)
                if y is not None:
                    return y
                if "_as_written" in self.__dict__:
                    return F.linear(x, weight, bias)
            if bias is None:
                bound = _known(("gemm" if act == "none" else "gemm_act", act, x.shape, x.dtype,
                                weight.shape, weight.dtype, None))
            else:
                bound = _known(("gemm_act", act, x.shape, x.dtype, weight.shape, weight.dtype,
                                (bias.shape, bias.dtype, bias.is_contiguous())))
            if bound is not None:
                bound.counter.calls += 1
                direct = bound.direct
                if direct is not None:
                    y = direct(x, weight, bias)
                    if direct is _linear and act == "none" and _memo_ok(x, weight, params, sib):
                        _note_eager(d, x, weight, bias, bound, _generation[0])  # the torch arm: F.linear's call
                    return y
                y = bound.call(x, weight, bias, None)
                # this call ran F.linear's arm (primed); a fused pair's torch arm (F.linear, then the
                # activation) runs as plain does from its next call: F.linear here, the model's
                # activation module in its slot, the same two kernels for less host time
                torch_arm = bound.eager == "torch" or (pair is not None and bound.config.id == "torch")
                if torch_arm and (act == "none" or pair is not None) and _memo_ok(x, weight, params, sib):
                    _note_eager(d, x, weight, bias, bound, _generation[0])
                return y
        if "_as_written" in self.__dict__:  # swapped only to join its siblings (siblings.attach): run as nn.Linear
            return F.linear(x, weight, bias)
        return _general(self, x, weight, bias, act)

    # torch.jit.script compiles the source inspect finds for forward, and inspect follows
    # __wrapped__: the scripted module calls the tuned op (linear_script.py), while eager calls
    # pay nothing for it (a torch.jit.is_scripting() branch costs a call per forward)
    forward.__wrapped__ = linear_script.script_forward  # type: ignore[attr-defined]

    def __getstate__(self) -> dict[str, Any]:
        """nn.Module's state without a quiet forward (quiet_members.py: a closure over this layer's
        own slots); a copy or an unpickled layer starts without one."""
        state = super().__getstate__()
        if _is_quiet(state.get("forward")):
            del state["forward"]
        return state

    def _replicate_for_data_parallel(self) -> "TunedLinear":
        replica = super()._replicate_for_data_parallel()  # a copy of __dict__: drop the quiet forward
        if _is_quiet(replica.__dict__.get("forward")):
            del replica.__dict__["forward"]
        return replica

    def __prepare_scriptable__(self) -> "TunedLinear":
        """torch.jit.script compiles script_forward, whose activation is `_script_act`: self.act,
        or none where the pair no longer holds (fused_pair: its slot then applies it). Returns
        self: torch.jit.script puts what this returns into the eager model's slot."""
        self.__dict__["_script_act"] = fused_pair.live_act(self, self.act)
        _quiet_leave((self,))  # TorchScript would compile the quiet forward, a closure it cannot
        return self

    def _slow_forward(self, *args: Any, **kwargs: Any) -> Any:
        # nn.Module.__call__ takes this path instead of forward only while torch.jit.trace
        # records: the trace gets the tuned op (linear_script.traced_forward), under the module
        # scope nn.Module's own _slow_forward names
        d = self.__dict__
        prior = d.get("forward")
        if prior is not None and not _is_quiet(prior):
            # a forward set on the instance after optimize() (accelerate's hooks wrap it): the
            # trace records what it runs, as on the plain module, and it stays where it was set
            return super()._slow_forward(*args, **kwargs)
        # who called (run_by, as eagerly): the trace records the path of this call, so a caller
        # other than the pair's parent (a helper's block.fc(x)) records the Linear's own output
        pair = d.get("_tunedb_fused")
        by_parent = pair is None or fused_pair.run_by(pair._parent(), 1)
        traced = functools.partial(linear_script.traced_forward, self, by_parent)
        traced._tunedb_trace = True  # type: ignore[attr-defined]  # fused_pair: the pair still holds
        d["forward"] = traced
        try:
            return super()._slow_forward(*args, **kwargs)
        finally:
            if prior is None:
                d.pop("forward", None)
            else:
                d["forward"] = prior  # the quiet forward (quiet_members) stays

    def table_key(self) -> tuple[Any, ...]:
        """The launch-table key prefix of this layer's calls: (op, dtype, N, K, act, has_bias)."""
        has_bias = self.bias is not None
        op = "gemm" if not has_bias and self.act == "none" else "gemm_act"
        n, k = self.weight.shape
        return (op, self.weight.dtype, n, k, self.act, has_bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, act={self.act}")


def allow_approximate() -> None:
    """Opt this process in to approximating arms, as TUNEDB_APPROXIMATE=1 does, and start a new
    epoch so that selections already made are made again under the opt-in.

    The opt-in is process-wide because the selection is memoised per shape, not per layer (a
    shape shared by an exact and an approximate model must resolve one way); it is also
    inherited by benchmark worker subprocesses, whose validity checks must agree."""
    import os

    from tunedb.runtime import selector
    if not settings.approximate_allowed():
        os.environ[settings.APPROXIMATE.name] = "1"
        selector.reload()


def optimize(model: nn.Module, approximate: bool = False, inplace: bool = True) -> nn.Module:
    """Swap every nn.Linear of `model` for a TunedLinear, fusing a following activation where
    the structure makes it safe (see the module docstring), except a Linear (or Linear and
    activation) whose key the tiers present now serve with torch at every size: it is left as
    written (the report says so), unless optimize(families="all") patches everything (the census).
    Run it again after a tier changes in the process (a tune, autotune's user tier): it swaps
    what the tier now serves and keeps the TunedLinears it made. Returns the patched model (a deep
    copy when inplace=False). approximate=True lets approximating arms (tanh-GELU epilogues for
    exact GELU) serve, gate permitting: process-wide, see allow_approximate()."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"optimize() needs a torch.nn.Module, got {type(model).__name__}")
    if approximate:
        allow_approximate()
    if not inplace:
        model = copy.deepcopy(model)
    if type(model) is nn.Linear and not _subclass_weight(model) and not _kept(model):  # no parent to patch
        reason = _TorchEverywhere()(model, "none")
        if reason is not None:
            left_one = [(model, _key_of(model, "none"), reason == GUESSED)]
            model.__dict__[report.LEFT_MARK] = (*left_one[0][1:], FAMILY_NAME)
            report.register_model(model, [], left=left_one, why=_left_why)
            return model
        model.__dict__.pop(report.LEFT_MARK, None)
        tuned = TunedLinear(model, approximate=approximate)
        report.register_model(tuned, [tuned])
        return tuned
    holders = _linear_paths(model)
    plan = _fusions(model, holders)
    swapped: dict[int, TunedLinear] = {}
    # a model optimized before (re-run after a tune): its TunedLinears stay and stay reported
    layers: dict[int, TunedLinear] = {id(m): m for m in model.modules() if type(m) is TunedLinear}
    left: dict[int, tuple[nn.Module, tuple[Any, ...], bool]] = {}
    served = _TorchEverywhere()
    for parent in list(model.modules()):
        fast = encoder_fast_path(parent)
        for attr, child in list(parent._modules.items()):
            if fast and attr in ENCODER_FF:
                continue  # torch's fused encoder layer reads these weights itself at inference
            if type(child) is TunedLinear and "_as_written" in child.__dict__ and served(child, "none") is None:
                del child.__dict__["_as_written"]  # a sibling left as written whose key a tier serves now
                if "_siblings" in child.__dict__:
                    child.__dict__["_siblings"][0].refresh()
                child.__dict__.pop(report.LEFT_MARK, None)
                continue
            if type(child) is not nn.Linear or _kept(child) or _subclass_weight(child):
                continue  # a hooked Linear stays, so its hooks keep firing (and its extra state stays)
            fused = plan.get((id(parent), attr))
            kind = fused[0] if fused is not None else "none"
            reason = served(child, kind)
            if reason is not None:
                left[id(child)] = (child, _key_of(child, kind), reason == GUESSED)
                child.__dict__[report.LEFT_MARK] = (*left[id(child)][1:], FAMILY_NAME)
                continue
            child.__dict__.pop(report.LEFT_MARK, None)  # the module's own call is what tunedb would run, minus the entry path
            if fused is not None:
                act_module = getattr(parent, fused[1], None)
                tuned = TunedLinear(child, kind, approximate, act_module=act_module)
                setattr(parent, fused[1], fused_pair.record(parent, attr, fused[1], tuned, act_module))
            else:
                tuned = swapped.get(id(child)) or TunedLinear(child, approximate=approximate)
                swapped[id(child)] = tuned
            layers[id(tuned)] = tuned
            setattr(parent, attr, tuned)
    siblings.attach(model, TunedLinear, lambda lin: not _kept(lin) and not _subclass_weight(lin))
    report.register_model(model, list(layers.values()), left=list(left.values()), why=_left_why)
    report.register_unpatched(model, "gemm", {UNPATCHED_KINDS[k]: n for k, n in unpatched_modules(model).items()})
    return model
