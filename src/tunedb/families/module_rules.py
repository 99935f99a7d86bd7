"""What every family's optimize() hook asks of a module before it fuses it with a neighbour:
whether a user's hooks watch it, and how many places in the model hold it. A fused module's
own output is never produced, so a hook on it, or a second place that calls it, would see (or
return) the fused result instead of the module's."""
from __future__ import annotations

from typing import Any


def hooked(module: Any) -> bool:
    """Whether a user's hooks watch `module` or replace its forward (tunedb's own, such as the bmm family's product mode
    on the top module, mark themselves `tunedb_own_hook` and change no input or output)."""
    hooks = (*module._forward_hooks.values(), *module._forward_pre_hooks.values())
    return (any(not getattr(h, "tunedb_own_hook", False) for h in hooks)
            or any(getattr(module, name, None) for name in _OTHER_HOOKS)
            # a forward set on the instance (accelerate's offload hook, a LoRA or debugging patch)
            # is a hook in effect: the code that runs is not the class's
            or "forward" in module.__dict__)


# Hooks a swapped module would lose: backward (full and pre: register_full_backward_pre_hook),
# and the state_dict / load_state_dict hooks that change what a checkpoint holds.
_OTHER_HOOKS = ("_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
                "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def holders(model: Any, kinds: tuple[type, ...] | None = None) -> dict[int, int]:
    """id(module) -> how many places (parent, attribute) hold it, for modules of exactly `kinds`
    (every module when None)."""
    count: dict[int, int] = {}
    for parent in model.modules():
        for child in parent._modules.values():
            if kinds is None or type(child) in kinds:
                count[id(child)] = count.get(id(child), 0) + 1
    return count
