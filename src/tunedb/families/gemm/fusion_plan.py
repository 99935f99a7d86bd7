"""Which Linear + activation pairs optimize() fuses: the activation modules the tuned ops can apply
(activation_kind) and the plan of safe fusions over a model (fusions), by the rules patching.py's
docstring sets out (an exact nn.Sequential; a module whose own code calls its activation on its
Linear's output and nowhere else; never a shared, hooked, kept or walked module)."""
from __future__ import annotations

from typing import Any

from torch import nn

from tunedb.families.gemm.fusion_source import WALKED_ANY, model_outside_reads, model_reached_reads
from tunedb.families.gemm.fusion_source import class_calls as _class_calls
from tunedb.families.gemm.fusion_source import sequentials_called_whole as _called_whole
from tunedb.families.gemm.left_modules import kept as _kept
from tunedb.families.module_rules import holders
from tunedb.families.module_rules import hooked as _hooked

_HF_ACTS: dict[str, str] = {
    "GELUActivation": "gelu", "NewGELUActivation": "gelu_tanh", "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh", "GELUPytorchTanh": "gelu_tanh", "FastGELUActivation": "",
    "SiLUActivation": "silu", "ReLUActivation": "relu",
}


def activation_kind(module: Any) -> str | None:
    """The tuned-op act name of an activation module, or None when it is not one we fuse."""
    cls = type(module)
    if cls is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if cls is nn.ReLU:
        return "relu"
    if cls is nn.SiLU:
        return "silu"
    if cls.__module__.startswith("transformers."):
        return _HF_ACTS.get(cls.__name__) or None
    return None


def linear_paths(model: nn.Module) -> dict[int, int]:
    """How many places (parent, attribute) hold each nn.Linear."""
    return holders(model, (nn.Linear,))


def _may_fuse(children: dict[str, Any]) -> bool:
    """Whether a module's own code could fuse anything: fusable() needs an nn.Linear child. When
    none is there, its class's source is not read (_class_calls, the costly part: a Hugging Face
    model's top module brings PreTrainedModel's hundred-odd methods, 0.3-0.5 s of ast.parse in a
    whisper-base census on a CPU)."""
    return any(type(c) is nn.Linear for c in children.values())


def fusions(model: nn.Module, holders: dict[int, int]) -> dict[tuple[int, str], tuple[str, str]]:
    """(id(parent), linear attr) -> (act kind, activation attr to blank), for safe fusions."""
    plan: dict[tuple[int, str], tuple[str, str]] = {}

    def fusable(lin: Any, act_mod: Any) -> str | None:
        if type(lin) is not nn.Linear or holders.get(id(lin)) != 1 or _kept(lin):
            return None
        if not isinstance(act_mod, nn.Module) or _hooked(act_mod):
            return None
        return activation_kind(act_mod)

    outside: list[frozenset[str] | None] = []  # attribute names read off a module other than self, model-wide

    def read_outside(name: str) -> bool:
        if not outside:  # read once, at the first question (the class sources are parsed then)
            outside.append(model_outside_reads(model))
        return outside[0] is None or name in outside[0]  # None: some model code unreadable, nothing proven

    whole = _called_whole(model, read_outside)
    reached: list[frozenset[str] | None] = []  # attribute names whose module some model code reaches into

    def walked(module: nn.Module) -> bool:
        """Whether model code may run `module`'s children one by one (`self.block.children()`)."""
        if not reached:
            reached.append(model_reached_reads(model))
            for owner in model.modules():
                for attr, child in owner._modules.items():
                    if child is not None:  # add_module(name, None) holds a slot, not a module
                        held_as.setdefault(id(child), set()).add(attr)
        return (reached[0] is None or WALKED_ANY in reached[0]
                or bool(held_as.get(id(module), set()) & reached[0]))

    held_as: dict[int, set[str]] = {}
    for parent in model.modules():
        if _hooked(parent):  # (a forward set on the instance counts: its source is not the class's)
            continue
        children = parent._modules
        if type(parent) is nn.Sequential:
            if id(parent) not in whole:
                continue
            names = list(children)
            for here, nxt in zip(names, names[1:]):
                kind = fusable(children[here], children[nxt])
                if kind:
                    plan[(id(parent), here)] = (kind, nxt)
            continue
        if not _may_fuse(children):
            continue
        for act_attr, lin_attr in _class_calls(type(parent)):
            if act_attr in parent.__dict__ or lin_attr in parent.__dict__:
                # an instance attribute shadows the child: `self.activation` is not the module
                # (nn.TransformerDecoderLayer's __setstate__ sets activation = F.relu over a GELU child)
                continue
            kind = fusable(children.get(lin_attr), children.get(act_attr))
            if kind and walked(parent):
                break
            # `self.block.fc(x)` or `self.block.act(y)` elsewhere: keep both as they are
            if kind and not read_outside(lin_attr) and not read_outside(act_attr):
                plan[(id(parent), lin_attr)] = (kind, act_attr)
    return plan
