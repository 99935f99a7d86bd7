"""A Linear and the activation optimize() fused into it, and the module left in the activation's
slot: the pair runs fused only while both still sit in the slots they were found in, the slot
still holds the activation module fused as its child `activation`, and nothing watches any of the
three (module surgery after optimize(): a LoRA or quantization wrapper set in the Linear's slot,
a new activation set in its own, a hook added on either; session 41: what a walk of
named_modules() does to the activation it finds as that child, as code that swaps every nn.GELU
for another module or hooks every activation does). Otherwise the Linear runs as nn.Linear and
the slot's module applies the activation the model wrote (its own hooks firing), so every module
gives what it gave before optimize(). The conv family's _Fusion (families/conv/patching.py)
holds the same rule for conv, norm and activation."""
from __future__ import annotations

import copy
import threading
import types
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from tunedb.families.gemm.callers import class_codes, run_by, traced_by

# torch's process-wide hooks (register_module_forward_hook): dicts mutated in place, bound once
_GLOBAL_HOOKS = tuple(getattr(_nn_module, name, {}) for name in (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
    "_global_backward_pre_hooks"))



def _placed(parent: nn.Module, name: str, module: Any) -> None:
    """torch's module-registration hook (process-wide, set once a fusion exists): a fused module
    (Linear, conv, norm) or activation slot set into a slot other than its own after optimize()
    (`model.tap = model.fc1`: one module in two places) ends that fusion for good; called from
    the new place it must give what the plain model's module gives there."""
    d = getattr(module, "__dict__", None) or {}
    fusion = d.get("_tunedb_fused") or d.get("_tunedb_fusion")
    if fusion is not None and not fusion.owns(parent, name, module):
        fusion.shared = True
    if name == "activation" and type(parent) is FusedActivation and "_tunedb_fused" in parent.__dict__:
        # a new child in a fused slot (a walk swapping every nn.GELU): compiled code of either
        # side guards the epoch, so it retraces and the new trace asks intact() again
        _EPOCH[0] += 1


_PLACED: list[Any] = []


def watch_placements() -> None:
    if not _PLACED:
        _PLACED.append(_nn_module.register_module_module_registration_hook(_placed))


_compiling = getattr(torch.compiler, "is_dynamo_compiling", None) or torch.compiler.is_compiling


def _rewired(m: Any) -> bool:
    """Whether `m` runs other code than its class's forward: a forward set on the instance (not
    TunedLinear's own jit.trace form, marked `_tunedb_trace`), or Module.compile()'s compiled call."""
    d = m.__dict__
    fwd = d.get("forward")
    return (fwd is not None and not getattr(fwd, "_tunedb_trace", False)) or d.get("_compiled_call_impl") is not None


def _dead() -> None:
    return None


def weak(m: Any) -> Any:
    """A weak reference to m, or one that is always dead for None: what the fusions hold (the model
    holds its modules; a strong reference from them would be a cycle)."""
    return _dead if m is None else weakref.ref(m)


def _UNREAD() -> None:  # a pair pickled before session 41 names no activation: the slot's child, read at first use
    return None


# settings that never change an activation's output (inplace: where it writes, not what)
_NOT_SETTINGS = frozenset({"training", "inplace"})


def settings_of(act: Any) -> tuple[tuple[str, Any], ...]:
    """An activation module's own settings (`approximate`; a Hugging Face activation's function),
    as the fused Linear applies them: plain values and functions, compared by value."""
    if act is None:
        return ()
    return tuple((k, v) for k, v in act.__dict__.items()
                 if not k.startswith("_") and k not in _NOT_SETTINGS
                 and isinstance(v, (str, int, float, bool, type(None), types.FunctionType,
                                    types.BuiltinFunctionType)))


# the names of the settings of each kind's activations (settings_of), for its compiled slot to read
_SETTING_NAMES: dict[str, tuple[str, ...]] = {}


def setting_names(kind: str) -> tuple[str, ...]:
    """The settings a compiled slot of `kind` reads off its activation, each a guard: a changed one
    retraces, and the new trace's intact() unfuses the pair and bumps the epoch. A trace constant."""
    return _SETTING_NAMES.get(kind, ())


setting_names._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _own_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def watched(*modules: nn.Module) -> bool:
    """Whether a hook watches any of `modules`, or every module (a process-wide hook): a fusion
    would hand it the fused output: every fusion's intact() asks it (FusedPair's unrolled)."""
    for m in modules:
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return True
    g0, g1, g2, g3 = _GLOBAL_HOOKS
    return bool(g0 or g1 or g2 or g3)


def live_act(module: nn.Module, act: str) -> str:
    """The activation `module` (a fused Linear or conv) applies itself now: `act` while its pair
    holds, "none" once it does not (its slot then applies it)."""
    pair = module.__dict__.get("_tunedb_fused")
    return "none" if act != "none" and pair is not None and not pair.intact() else act


class FusedPair:
    """Where optimize() fused `linear` (held as `parent.<lin_attr>`) with the activation module
    held as `parent.<act_attr>` (replaced there by `blank`, which holds it as its child
    `activation`: `act`). A reference kept in
    both modules' __dict__, not a submodule: the module tree and state dict stay as they were.
    The parent, Linear, slot and activation are held weakly: the model holds them, and a strong
    reference here would make a cycle that keeps a dropped model's weights alive until the cyclic
    GC runs."""

    def __init__(self, parent: nn.Module | None, lin_attr: str, act_attr: str, linear: nn.Module | None,
                 blank: nn.Module | None, act: nn.Module | None = None) -> None:
        self.lin_attr, self.act_attr = lin_attr, act_attr
        self._refs(parent, linear, blank, act)

    shared = False  # set into a second slot (_placed), or its activation's settings changed: unfused for good
    _settings: tuple[tuple[str, Any], ...] = ()  # the activation's, as fused (settings_of)

    def owns(self, parent: Any, name: str, module: Any) -> bool:
        return parent is self._parent() and module is (self._linear() if name == self.lin_attr else
                                                       self._blank() if name == self.act_attr else object())

    kind = ""  # a pair of no parent (one module copied alone): never fused

    def _refs(self, parent: Any, linear: Any, blank: Any, act: Any) -> None:
        watch_placements()
        self._parent, self._linear, self._blank, self._act = (weak(m) for m in (parent, linear, blank, act))
        self._settings = settings_of(act)
        if parent is not None:
            self.kind = kind_of(type(parent), self.lin_attr, self.act_attr)
            _MEMBERS.setdefault(self.kind, weakref.WeakSet()).add(self)
            _KIND_CLASS[self.kind] = type(parent)
        self._name_settings()

    def _name_settings(self) -> None:
        names = _SETTING_NAMES.get(self.kind, ())
        if self.kind and not {k for k, _ in self._settings} <= set(names):
            _SETTING_NAMES[self.kind] = tuple(sorted(set(names) | {k for k, _ in self._settings}))

    def intact(self) -> bool:
        # on every fused call's host path (0.2-0.3 us), so written out: no helper frames
        parent = self._parent()
        if parent is None or self.shared:
            return False
        slots = parent._modules
        linear, blank = self._linear(), self._blank()
        if (linear is None or blank is None or slots.get(self.lin_attr) is not linear
                or slots.get(self.act_attr) is not blank):
            return False
        if self._act is _UNREAD:
            self._read_act(blank)
        # the activation fused still the slot's child (set there by a walk that swaps every
        # nn.GELU, say) and unwatched (a hook every activation module found gets)
        act = self._act()
        if blank._modules.get("activation") is not act or (act is not None and (
                act._forward_hooks or act._forward_pre_hooks or act._backward_hooks or act._backward_pre_hooks)):
            return False
        # a setting changed on the activation itself (found by model.modules(): no slot saw the
        # write): unfused for good, and compiled code of either side retraces (the epoch)
        if act is not None:
            ad = act.__dict__
            for k, v in self._settings:
                if ad.get(k, _UNREAD) != v:
                    self.shared = True
                    _EPOCH[0] += 1
                    return False
        # watched(linear, blank) unrolled: this runs twice on every fused call's host path, and the
        # helper's frame and loop cost a third more (0.64 vs 0.48 us on the CPU host)
        if (linear._forward_hooks or linear._forward_pre_hooks or linear._backward_hooks or linear._backward_pre_hooks
                or blank._forward_hooks or blank._forward_pre_hooks or blank._backward_hooks
                or blank._backward_pre_hooks):
            return False
        # a forward set on the instance (accelerate's offload hooks wrap it: the wrapper, not the
        # parent, then calls the Linear, and run_by would unfuse one side only; TunedLinear's own
        # torch.jit.trace form is marked and keeps the pair), or one side compiled alone
        # (Module.compile(): its trace cannot see the caller, the other side's eager call can)
        if _rewired(linear) or _rewired(blank) or (act is not None and _rewired(act)):
            return False  # (the activation's own forward replaced: the kernel applies the old one)
        g0, g1, g2, g3 = _GLOBAL_HOOKS
        return not (g0 or g1 or g2 or g3)

    def fused_here(self) -> bool:
        """Whether the forward of the Linear (conv, head) calling this runs fused: while a
        compiler traces, its kind's state (intact_kind: a constant of the trace);
        eagerly intact() and that forward called by the parent's own code (run_by: one more frame
        walk on the fused call's path), a decision its slot then takes (taken()). Called directly
        by the forward (run_by counts frames)."""
        if _compiling():
            return fused_traced(self.kind)
        got = self.intact() and run_by(self._parent(), 2)
        decided(self, got)
        return got

    def _read_act(self, blank: Any) -> None:
        """A pair pickled before session 41: the activation a TunedLinear fused (it keeps it), else
        the slot's child now."""
        linear = self._linear()
        act = None if linear is None else linear.__dict__.get("_act_module")
        if act is None and blank is not None:
            act = blank._modules.get("activation")
        self._act = weak(act)
        self._settings = settings_of(act)
        self._name_settings()

    def __deepcopy__(self, memo: dict[int, Any]) -> FusedPair:
        parent = self._parent()
        if self._act is _UNREAD:
            self._read_act(self._blank())
        if parent is None or id(parent) not in memo:  # one module copied alone: no slot holds the copy, unfused
            return FusedPair(None, self.lin_attr, self.act_attr, None, None)
        # in the memo before its modules are copied: the copy of the other side, reached from
        # theirs, holds this same pair (it made a second one)
        pair = memo[id(self)] = object.__new__(FusedPair)
        refs = [copy.deepcopy(m, memo) for m in (self._linear(), self._blank(), self._act())]
        pair.__init__(memo[id(parent)], self.lin_attr, self.act_attr, *refs)
        pair.shared, pair._settings = self.shared, self._settings
        return pair

    def __getstate__(self) -> dict[str, Any]:
        # pickle keeps the objects (its memo resolves the model's own references to them); one
        # layer pickled alone brings its parent, which nothing holds after loading: unfused then
        if self._act is _UNREAD:
            self._read_act(self._blank())
        return {"lin_attr": self.lin_attr, "act_attr": self.act_attr, "shared": self.shared,
                "settings": self._settings,
                "refs": (self._parent(), self._linear(), self._blank(), self._act())}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.lin_attr, self.act_attr = state["lin_attr"], state["act_attr"]
        refs = state["refs"]
        self._refs(*refs[:3], refs[3] if len(refs) > 3 else None)
        self.shared = state.get("shared", False)
        if "settings" in state:
            self._settings = state["settings"]
            self._name_settings()
        if len(refs) <= 3:
            self._act = _UNREAD


# each thread's last eager decision per pair (id -> fused), made by the Linear's side, taken by the
# slot's (whose call follows it in the parent's code, same thread): deciding twice, the halves
# disagreed when another thread toggled a process-wide hook between them (session 57)
_DECIDED = threading.local()


def decided(pair: FusedPair, fused: bool) -> None:
    """Record the Linear's side's decision for this call (fused_here; the jit.trace form's own)."""
    try:
        _DECIDED.d[id(pair)] = fused
    except AttributeError:
        _DECIDED.d = {id(pair): fused}


def taken(pair: FusedPair) -> bool:
    """The slot's side: whether its Linear ran fused for the input it hands on (the decision made
    last in this thread, taken once: a later call of the slot by other code applies its module)."""
    try:
        return _DECIDED.d.pop(id(pair), False)
    except AttributeError:
        return False


def kind_of(cls: type, lin_attr: str, act_attr: str) -> str:
    """A pair's kind: where it sits (its parent's class, the two slots' names). The same in every
    block of a model and in every process (a pickled slot keeps its own copy)."""
    return f"{cls.__module__}.{cls.__qualname__}|{lin_attr}|{act_attr}"


# the pairs of each kind alive now, and an epoch bumped when a fused slot gets a new child
_MEMBERS: dict[str, weakref.WeakSet[FusedPair]] = {}
_EPOCH = [0]


def intact_kind(kind: str, epoch: int, settings: tuple[Any, ...] = ()) -> bool:
    """Whether every live pair of `kind` is intact(): what a compiler's trace runs once per call site
    and keeps as a constant of the graph. Both arguments are constants every Dynamo takes (torch
    2.11's refuses an object argument) and guards by value, read by each side from what it holds
    itself: the Linear (conv, head) from its pair, the slot from its own copy (`_tunedb_kind`).
    Reading the pair from both sides made Dynamo guard their identity with a Python lambda, and
    tracing intact() read weakrefs, both slots and every hook dict: 15-20 guards and up to five
    lambdas a pair at every compiled call (Llama-3-8B, 8 layers, no CUDA graphs: 2-5% of the
    forward, sessions 49-50). A kind, not a pair: the blocks of a model share it, so one compiled
    block serves every block (regional compilation) instead of recompiling per pair (an identity
    or a per-pair key is a guard that differs in every block, past Dynamo's recompile limit at 8).
    All of the kind or none: a pair unfused by surgery unfuses its kind in compiled code (unfused
    is every pair's plain output: correct, slower). What intact() reads is guarded where it can
    change: the parent's forward reads both slots (a module of another type retraces) and a new
    child set into a slot bumps the epoch. `epoch` and `settings` (the slot's activation's, as
    read now) are only for those guards."""
    for attempt in range(2):
        live = [p for p in list(_MEMBERS.get(kind, ())) if p._parent() is not None]
        if all(p.intact() for p in live):
            return bool(live)
        if not attempt:  # a broken pair may be a dropped model's, a cycle not yet collected: not the kind's
            import gc

            gc.collect()
    return False


# torch.compiler.assume_constant_result's mark, set directly (that function imports Dynamo: ops._token)
intact_kind._dynamo_marked_constant = True  # type: ignore[attr-defined]


_KIND_CLASS: dict[str, type] = {}  # each kind's parent class (whose code may call the pair fused)


def called_by_parent(kind: str) -> bool:
    """Whether the traced side of a pair of `kind` was called by its parent's code (callers.traced_by;
    other code gets the Linear's own output, as run_by gives it eagerly). A trace constant per call site."""
    return traced_by(_KIND_CLASS.get(kind))


called_by_parent._dynamo_marked_constant = True  # type: ignore[attr-defined]


def fused_traced(kind: str) -> bool:
    """A fused side's decision while a compiler traces: its kind's constant, under the epoch (read
    here, through this module only: one source, no aliasing guard), and its caller the parent's
    code (called_by_parent: per call site)."""
    return intact_kind(kind, _EPOCH[0], ()) and called_by_parent(kind)


class FusedActivation(nn.Identity):
    """The activation's slot after optimize() fused it into the Linear before it: passes its input
    through while the pair is intact, and runs the activation the model wrote (its child
    `activation`, which holds no state: the state dict is unchanged) once it is not."""

    def forward(self, input: Any) -> Any:
        d = self.__dict__
        if _compiling():  # the slot's own copy of its pair's kind (intact_kind: no read of the pair object)
            kind = d.get("_tunedb_kind")
            if kind is None:  # a slot pickled before session 51: its pair's, read
                pair = d.get("_tunedb_fused")
                kind = None if pair is None else pair.kind
            # the child read (its type guarded): one set through _modules (no registration hook)
            # retraces; and its settings (guarded by value: one changed on the module itself retraces)
            act = self._modules.get("activation")
            if kind is None or (intact_kind(kind, _EPOCH[0], tuple(getattr(act, k, None) for k in setting_names(kind)))
                                and called_by_parent(kind)):
                return input
        else:
            pair = d.get("_tunedb_fused")
            # eagerly what its Linear decided for this call (a caller of its own, or surgery, made it unfused)
            if pair is None or taken(pair):
                return input
        # the child's forward, not its __call__: a hook on every module (or a process-wide one)
        # fires once, on this slot, as on the activation module the plain model holds here; but
        # hooks of the child's own (set on it as found by named_modules()) fire, as they would there
        act = self._modules["activation"]
        return act(input) if _own_hooks(act) else act.forward(input)

    def __getattr__(self, name: str) -> Any:
        """The activation's attributes read through the slot (`block.act.approximate`), as plain's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            act = None if name.startswith("_") else self.__dict__.get("_modules", {}).get("activation")
            if act is None or name not in act.__dict__:
                raise
            return act.__dict__[name]

    def __setattr__(self, name: str, value: Any) -> None:
        """A write of one of the activation's own settings (`block.act.approximate = "tanh"`) goes to
        the activation, and a changed one unfuses the pair for good: the Linear's fused kernel
        applies the activation as it was at optimize()."""
        act = (None if name.startswith("_") or name in self.__dict__
               else self.__dict__.get("_modules", {}).get("activation"))
        if act is None or name not in act.__dict__ or isinstance(value, (nn.Module, torch.Tensor)):
            super().__setattr__(name, value)
            return
        changed = act.__dict__[name] is not value and act.__dict__[name] != value
        setattr(act, name, value)
        pair = self.__dict__.get("_tunedb_fused")
        if changed and pair is not None and not pair.shared:
            pair.shared = True
            _EPOCH[0] += 1  # compiled code guards the epoch: its kind retraces, unfused

    def __prepare_scriptable__(self) -> FusedActivation:
        """torch.jit.script compiles _script_forward with the pair's state now (returns self:
        what this returns replaces the module in the eager model's slot)."""
        pair = self.__dict__.get("_tunedb_fused")
        lin = None if pair is None else pair._linear()
        # a fused module that scripts as its plain class (as_plain) applies no activation there
        self.__dict__["_script_apply"] = pair is not None and (
            not pair.intact() or getattr(type(lin), "_scripts_plain", False))
        return self


def _script_forward(self: Any, input: torch.Tensor) -> torch.Tensor:
    """FusedActivation.forward as torch.jit.script compiles it (inspect follows __wrapped__)."""
    if self._script_apply:
        return self.activation(input)
    return input


FusedActivation.forward.__wrapped__ = _script_forward  # type: ignore[attr-defined]


def record(parent: nn.Module, lin_attr: str, act_attr: str, linear: nn.Module, act_module: Any) -> FusedActivation:
    """The module for the activation's slot, with the pair recorded in it and in `linear`."""
    blank = FusedActivation()
    blank.train(getattr(act_module, "training", linear.training))
    if isinstance(act_module, nn.Module):
        blank.activation = act_module
    pair = FusedPair(parent, lin_attr, act_attr, linear, blank, blank._modules.get("activation"))
    # the code run_by counts as the parent's, read now, from the class optimize() read for the
    # fusion: a forward patched onto the class later (calling the Linear its own way) is not
    class_codes(type(parent))
    linear.__dict__["_tunedb_fused"] = pair
    blank.__dict__["_tunedb_fused"] = pair
    blank.__dict__["_tunedb_kind"] = pair.kind
    return blank
