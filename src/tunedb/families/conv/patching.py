"""optimize() for the conv family: nn.Conv1d / nn.Conv2d modules call tunedb::conv1d / conv2d.

A served module (zeros padding, numeric padding, not transposed) changes class in place to
TunedConv1d / TunedConv2d: the parameters, hooks and state dict stay as they are. Inside an
nn.Sequential (the exact class, that every holder only calls: gemm's rule 1,
fusion_source.sequentials_called_whole):
- Conv2d then nn.ReLU / nn.SiLU becomes one call with the activation fused (the Conformer's
  Conv2dSubsampling: conv2d(3x3, stride 2) + ReLU, twice); the activation becomes nn.Identity.
- Conv1d then BatchNorm1d then nn.SiLU / nn.ReLU (the Conformer's depthwise conv, its batch norm
  and its SiLU) becomes one call in eval mode: the batch norm is folded into the conv's weight and
  bias (in fp32, cached per parameter version, so a captured graph replays no folding) and the
  activation runs in the kernel's epilogue; the norm and activation modules pass their input
  through while the norm is in eval mode. In training mode the three run as before (the norm
  then uses batch statistics, which no folding can know), and so do calls no kernel serves (a CPU
  or fp32 input, an unbatched one): conv, norm and activation as written, no fold. The three run
  fused only while each still sits in its slot (module surgery after optimize() un-fuses them).
  The fold is cached per parameter version and eps until the next optimizer step in the process
  or training-mode call of the norm; an in-place write through `.data` bumps no version and is
  not seen (load_state_dict, an in-place op under no_grad or a new Parameter are), nor is any
  write between the replays of a CUDA graph captured with the fold (capture again).
Only where each fused module is held in one place and no user hook watches it (module_rules): a
fused module's own output is never produced, so its hooks, or a second caller, would get the
fused result. Such a conv is still swapped, unfused.
The op itself runs plain torch on CPU / fp32 inputs, so a patched model stays correct anywhere.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunedb.families.gemm import fused_pair
from tunedb.families.script_plain import as_plain
from tunedb.families.gemm.fusion_source import called_whole
from tunedb.families.module_rules import holders, hooked

PATCH_RULES = ("nn.Conv1d -> TunedConv1d (tunedb::conv1d)",
               "nn.Conv2d -> TunedConv2d (tunedb::conv2d)",
               "nn.Sequential(Conv2d, ReLU|SiLU) -> TunedConv2d(act=relu|silu), Identity",
               "nn.Sequential(Conv1d, BatchNorm1d, SiLU|ReLU) -> TunedConv1d(folded norm, act) in eval mode")


_STEPS = [0]  # optimizer steps taken in this process (a fused step writes parameters unversioned)
_HOOKED: list[Any] = []


def _count_steps() -> None:
    if not _HOOKED:  # at the first fold, not at import
        def bump(*_: Any) -> None:
            _STEPS[0] += 1
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _HOOKED.append(register_optimizer_step_post_hook(bump))


class _Fusion:
    """Conv1d, BatchNorm1d and activation fused by optimize() in one nn.Sequential: each holds
    this, and each runs fused only while all three still sit in the slots they were found in and
    no hook watches any of them (module surgery after optimize(): convert_sync_batchnorm, a slot
    set to nn.Identity or a new norm, a hook added later, makes every one of them run as
    written). The fold cache lives here. The Sequential and the three are held weakly (the model
    holds them; strong references here made a cycle that kept a dropped model alive until the
    cyclic GC ran)."""

    def __init__(self, seq: Any, names: tuple[str, str, str], conv: Any, bn: Any, act: Any) -> None:
        self.names = names
        self._refs = tuple(fused_pair.weak(m) for m in (seq, conv, bn, act))
        self.cache: tuple[Any, Any, Any] | None = None
        fused_pair.watch_placements()

    shared = False  # set into a second slot (fused_pair._placed): unfused for good

    def owns(self, seq: Any, name: str, module: Any) -> bool:
        return seq is self.seq and name in self.names and module is self._refs[1 + self.names.index(name)]()

    seq = property(lambda self: self._refs[0]())
    conv = property(lambda self: self._refs[1]())
    bn = property(lambda self: self._refs[2]())
    act = property(lambda self: self._refs[3]())

    def intact(self) -> bool:
        seq, conv, bn, act = (r() for r in self._refs)
        if seq is None or conv is None or bn is None or act is None or self.shared:  # one deleted: its slot is gone
            return False
        m = seq._modules
        if not (m.get(self.names[0]) is conv and m.get(self.names[1]) is bn and m.get(self.names[2]) is act):
            return False
        if fused_pair._rewired(conv) or fused_pair._rewired(bn) or fused_pair._rewired(act):
            return False  # a wrapped forward (accelerate's hooks) or one compiled alone: unfused (fused_pair)
        if bn.running_mean is None or bn.running_var is None or not bn.track_running_stats:
            return False  # statistics dropped after optimize() (test-time adaptation): the batch's, as nn's
        return not fused_pair.watched(conv, bn, act)

    def __deepcopy__(self, memo: dict[int, Any]) -> "_Fusion":
        import copy

        seq = self.seq
        if seq is None or id(seq) not in memo:  # one module copied alone (fuse_conv_bn_eval's deepcopy): unfused
            return _Fusion(None, self.names, None, None, None)
        fusion = _Fusion(memo[id(seq)], self.names, *(copy.deepcopy(m, memo) for m in (self.conv, self.bn, self.act)))
        fusion.shared = self.shared
        return fusion

    def __getstate__(self) -> dict[str, Any]:
        return {"names": self.names, "refs": tuple(r() for r in self._refs), "shared": self.shared}

    def __setstate__(self, state: dict[str, Any]) -> None:
        refs = state.get("refs") or tuple(state.get(k) for k in ("seq", "conv", "bn", "act"))  # pickled before s40
        self.__init__(refs[0], state["names"], *refs[1:])
        self.shared = state.get("shared", False)


def _fusion(module: Any) -> _Fusion | None:
    """The module's fusion while it holds: None when it was never fused or no longer is."""
    f = module.__dict__.get("_tunedb_fusion")
    return f if f is not None and f.intact() else None


def _fused_call(module: Any) -> _Fusion | None:
    """_fusion(module), asked by the module's forward, and None also where that forward was not
    called by the Sequential's own code (fused_pair.run_by: a loop over its children collecting
    each output gets each module's own)."""
    f = _fusion(module)
    return f if f is None or fused_pair._compiling() or fused_pair.run_by(f.seq, 2) else None


def _folded(conv: nn.Module, bn: nn.BatchNorm1d, fusion: _Fusion) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of conv followed by bn in eval mode, computed in fp32 once per version
    where no gradient is wanted, and per call where one is (the fold is then part of the graph
    that backward walks, and a cached graph would be freed by the first backward) or while a
    compiler traces (the fold goes into its graph). The cache also ends at any optimizer step in
    the process (a fused step leaves the version counters as they were) and when the norm runs
    in training mode (its running statistics are updated without one)."""
    parts = (conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in parts):
        return _fold(conv, bn)
    if torch.compiler.is_compiling():  # traced tensors (torch.export's fakes) have no data pointer
        return _fold(conv, bn)
    _count_steps()
    key = (*((t.data_ptr(), t._version) if t is not None else None for t in parts), bn.eps, _STEPS[0])
    cached = fusion.cache
    # the same tensors, not only the same addresses: a parameter replaced by a new tensor at the
    # freed one's address starts at version 0 too (the cache holds the old ones, by identity)
    if cached is not None and cached[0] == key and all(a is b for a, b in zip(cached[2], parts)):
        return cached[1]
    # cached tensors are leaves (deepcopy and pickling take the module), and normal tensors even
    # when the first call ran under inference_mode: an inference tensor in the cache would make a
    # later call that records autograd fail ("Inference tensors cannot be saved for backward")
    with torch.inference_mode(False), torch.no_grad():
        out = _fold(conv, bn)
    fusion.cache = (key, out, parts)
    return out


def _fold(conv: nn.Module, bn: nn.BatchNorm1d) -> tuple[torch.Tensor, torch.Tensor]:
    # fp32 at least (half-precision weights fold without rounding the scale), fp64 for fp64 ones
    ct = torch.promote_types(conv.weight.dtype, torch.float32)
    var, mean = bn.running_var.to(ct), bn.running_mean.to(ct)
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.to(ct)
    w = conv.weight.to(ct) * scale.view(-1, *([1] * (conv.weight.dim() - 1)))
    b = conv.bias.to(ct) if conv.bias is not None else torch.zeros_like(mean)
    b = (b - mean) * scale + (bn.bias.to(ct) if bn.bias is not None else 0.0)
    return w.to(conv.weight.dtype), b.to(conv.weight.dtype)


class TunedConv1d(nn.Conv1d):
    tunedb_act = "none"
    _scripts_plain = True

    def __prepare_scriptable__(self) -> nn.Module:
        return as_plain(self, nn.Conv1d)

    def _own(self, x: torch.Tensor, act: str) -> torch.Tensor:
        from tunedb.families.conv import ops

        if self.padding_mode != "zeros":  # set after optimize(): nn's own forward pads it
            return ops.activate(nn.Conv1d.forward(self, x), act)
        return ops.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, act)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        fusion = _fused_call(self)
        if not isinstance(x, torch.Tensor):  # torch.fx's Proxy: each of the three records nn's own form
            return nn.Conv1d.forward(self, x)
        if fusion is None:
            return self._own(x, "none")
        bn = fusion.bn
        if bn.training:  # the norm and activation run as modules (batch statistics)
            fusion.cache = None
            return self._own(x, "none")
        from tunedb.families.conv import ops

        if not (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and x.dim() == 3) \
                or self.padding_mode != "zeros":
            # no kernel serves this call: conv, norm and activation as the model wrote them (the
            # fold rounds differently, and BatchNorm1d's own input checks stay)
            return ops.activate(nn.BatchNorm1d.forward(bn, self._own(x, "none")), self.tunedb_act)
        w, b = _folded(self, bn, fusion)
        return ops.conv1d(x, w, b, self.stride, self.padding, self.dilation, self.groups, self.tunedb_act)


class TunedConv2d(nn.Conv2d):
    tunedb_act = "none"
    _scripts_plain = True

    def __prepare_scriptable__(self) -> nn.Module:
        return as_plain(self, nn.Conv2d)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        from tunedb.families.conv import ops

        pair = self.__dict__.get("_tunedb_fused")
        # "none" after surgery or for a caller other than the parent's code: its slot applies it
        act = self.tunedb_act if pair is None or pair.fused_here() else "none"
        # set after optimize() (nn's own forward pads it), or torch.fx's Proxy (nn's own form)
        if self.padding_mode != "zeros" or not isinstance(x, torch.Tensor):
            return ops.activate(nn.Conv2d.forward(self, x), act)
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups, act)


class AbsorbedBatchNorm1d(nn.BatchNorm1d):
    """A batch norm folded into the conv before it: passes its input through in eval mode."""

    def __prepare_scriptable__(self) -> nn.Module:
        return as_plain(self, nn.BatchNorm1d)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        fusion = _fused_call(self)
        if fusion is None or self.training or not isinstance(x, torch.Tensor):
            if fusion is not None and isinstance(x, torch.Tensor):
                fusion.cache = None  # the running statistics move without a version bump
            return super().forward(x)
        return x

    def _check_input_dim(self, input: Any) -> None:
        if isinstance(input, torch.Tensor):  # torch.fx's Proxy has no dim() to check (plain BatchNorm1d is a leaf there)
            super()._check_input_dim(input)


class _Absorbed:
    """An activation run by the conv's epilogue while the fused norm is in eval mode."""

    def __prepare_scriptable__(self) -> nn.Module:
        return as_plain(self, type(self).__mro__[2])  # AbsorbedSiLU -> nn.SiLU

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = input  # nn's own parameter name: module(input=t) works as on the module replaced
        fusion = _fused_call(self)
        if fusion is None or fusion.bn.training or not isinstance(x, torch.Tensor):  # a Proxy: nn's own form
            return super().forward(x)
        return x


class AbsorbedSiLU(_Absorbed, nn.SiLU):
    pass


class AbsorbedReLU(_Absorbed, nn.ReLU):
    pass


_TUNED = {nn.Conv1d: TunedConv1d, nn.Conv2d: TunedConv2d}
_ACTS = {nn.ReLU: "relu", nn.SiLU: "silu"}
_ABSORBED = {nn.ReLU: AbsorbedReLU, nn.SiLU: AbsorbedSiLU}


def served(module: Any) -> bool:
    return (type(module) in _TUNED and module.padding_mode == "zeros" and not isinstance(module.padding, str)
            and not module.transposed)


def _foldable(bn: Any, conv: Any) -> bool:
    return (type(bn) is nn.BatchNorm1d and bn.track_running_stats and bn.running_mean is not None
            and bn.num_features == conv.out_channels)


def _alone(held: dict[int, int], *modules: Any) -> bool:
    """Whether each module is held in one place and watched by no user hook."""
    return all(held.get(id(m)) == 1 and not hooked(m) for m in modules)


def _fuse(seq: nn.Sequential, held: dict[int, int]) -> None:
    mods = seq._modules
    names = list(mods)
    for i, name in enumerate(names):
        conv = mods[name]
        nxt = [mods[n] for n in names[i + 1:i + 3]]
        if (type(conv) is nn.Conv2d and served(conv) and nxt and type(nxt[0]) in _ACTS and _alone(held, conv)
                and not hooked(nxt[0])):  # the activation leaves this slot only: others may hold it
            conv.__class__ = TunedConv2d
            conv.tunedb_act = _ACTS[type(nxt[0])]
            # the slot passes through while the pair holds, and applies the activation after
            # module surgery (a new activation, a hook, the conv replaced: fused_pair)
            mods[names[i + 1]] = fused_pair.record(seq, name, names[i + 1], conv, nxt[0])
        elif (type(conv) is nn.Conv1d and served(conv) and len(nxt) == 2 and _foldable(nxt[0], conv)
              and type(nxt[1]) in _ACTS and _alone(held, conv, *nxt)):
            bn, act = nxt
            conv.__class__ = TunedConv1d
            conv.tunedb_act = _ACTS[type(act)]
            bn.__class__ = AbsorbedBatchNorm1d
            act.__class__ = _ABSORBED[type(act)]
            # a reference, not a submodule: the state dict and module tree stay as they were
            fusion = _Fusion(seq, (name, names[i + 1], names[i + 2]), conv, bn, act)
            for m in (conv, bn, act):
                m.__dict__["_tunedb_fusion"] = fusion


def optimize(model: Any, approximate: bool = False) -> Any:
    """The model with its served convolutions swapped (in place); returns it."""
    from tunedb.families.conv import ops  # noqa: F401 -- registers the ops

    held = holders(model, (*_TUNED, nn.BatchNorm1d, *_ACTS))
    whole = called_whole(model)
    for parent in list(model.modules()):
        # the exact class, called whole by every holder (gemm's rule 1): a subclass's forward, or
        # code walking the children (`for layer in self.features: ...; feats.append(x)`), would
        # see a fused module's output where it wanted the conv's own
        if type(parent) is nn.Sequential and id(parent) in whole:
            _fuse(parent, held)
    for module in list(model.modules()):
        if served(module):
            module.__class__ = _TUNED[type(module)]
    return model
