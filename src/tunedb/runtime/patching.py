"""optimize(model): every kernel family patches the model with its own rules, in registry order.

A family's `optimize(model, approximate=False)` hook swaps the modules it serves for its tuned
ops (GEMM: nn.Linear, and a following activation where safe, for TunedLinear; see
families/gemm/patching.py); a family without the hook leaves the model as it is.

Which families patch (`families=`): by default the registry's default family (GEMM, whose
unmeasured shapes the fallback or its confidence-gated model tier serve) and every other family
that has a measured table for this GPU's arch in a tier (user or system). A family with no table
would serve every call with its fallback -- the framework's own kernel behind one more Python
hop, a loss in eager mode and no gain anywhere -- so on a model nobody measured its modules stay
the model's own. `families="all"` patches with every family (the census of `tunedb tune` does,
so that what a table could serve is recorded); a list names them.

Modules a family's fallback would serve at every size (GEMM: a Linear whose key every tier
answers with torch) are left as written by default: swapping them adds tunedb's entry path to
the call the module makes anyway (runtime/fallback_everywhere.py; the report lists them as "left
as written"). `families="all"` patches those too (patching_everything()): the census records
every module as the run-time call it could become. A tier written later in the process (a tune,
autotune's user tier) reaches left modules only when optimize() runs again; prewarm and
autotune() run it after publishing for the models whose left modules they measured (swap_left).
Modules left only because no table measured their key (a model nobody measured) are measured
by autotune() through forward hooks while it is active (report.measuring_guessed).
"""
from __future__ import annotations

import contextvars
import copy
from typing import Any, Iterable

from tunedb import families as _registry
from tunedb.families.contract import hook
from tunedb.errors import SettingsError


def optimize(model: Any, approximate: bool = False, inplace: bool = True,
             families: "str | Iterable[str] | None" = None) -> Any:
    """The model with the families' patches applied (a deep copy when inplace=False).
    approximate=True lets approximating arms serve, gate permitting (process-wide). families:
    None (the default family and every family measured on this arch), "all", or names."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize() needs a torch.nn.Module, got {type(model).__name__}")
    for name, value in (("approximate", approximate), ("inplace", inplace)):
        if not isinstance(value, bool):  # a truthy "no" would patch in place, or approximate
            raise TypeError(f"optimize() {name}={value!r} must be True or False")
    chosen = patching_families(families)
    if not inplace:
        model = copy.deepcopy(model)
    token = _everything.set(_everything.get() or families == "all")
    try:
        for name in chosen:
            model = hook(_registry.get(name), "optimize")(model, approximate=approximate)
    finally:
        _everything.reset(token)
    return model


# per thread (a context variable): two optimize() calls in two threads, one with families="all",
# shared a module global, and the later one's restore left "all" on for the rest of the process
_everything: contextvars.ContextVar[bool] = contextvars.ContextVar("tunedb_patching_everything", default=False)


def swap_left(model: Any) -> bool:
    """Re-run, on `model`, the optimize() of each family that left some of its modules as written
    (prewarm and autotune() call it after publishing what they measured: what a tier now serves
    with a config is swapped in). Found by the marks the modules carry, which a deepcopy or an
    unpickled copy of an optimized model keeps. False when nothing was left in it."""
    from tunedb.runtime import report

    marked = report.left_in(model)
    if any(module is model for module, *_rest in marked):
        return False  # a bare module given to optimize(): no parent to swap it in (optimize() it again)
    families = {family for *_m, family in marked}
    for family in sorted(families):
        hook(_registry.get(family), "optimize")(model)
    return bool(families)


def patching_everything() -> bool:
    """True inside optimize(families="all"): a family patches every module it could serve, even
    one its fallback serves at every size (what the census of `tunedb tune` must see)."""
    return _everything.get()


def patching_families(which: "str | Iterable[str] | None" = None) -> tuple[str, ...]:
    """The families optimize() patches with, in registry order (see the module docstring)."""
    names = _registry.names()
    if which == "all":
        return names
    if which is not None:
        asked = (which,) if isinstance(which, str) else _names(which)
        for name in asked:
            if name not in names:
                from tunedb.errors import RegistryError

                hint = ' ("all" is a value of its own: families="all", not in a list)' if name == "all" else ""
                raise RegistryError(f"families={which!r}: unknown kernel family {name!r}{hint}; allowed are None "
                                    f"(the default and every family measured here), \"all\", or names of "
                                    f"{', '.join(names)}")
            _registry.get(name)
        return tuple(n for n in names if n in asked)
    return tuple(n for n in names if n == _registry.DEFAULT or _measured(n))


def _names(which: Any) -> tuple[str, ...]:
    """A families= value that is not one string, as a tuple of names; anything else (a number,
    bytes, a mapping, a list holding a non-string) is refused naming it and what is allowed (an
    int used to fail as "'int' object is not iterable")."""
    from tunedb.errors import RegistryError, SettingsError

    from collections.abc import Iterable as _Iterable, Mapping

    names = None
    if isinstance(which, _Iterable) and not isinstance(which, (bytes, bytearray, Mapping)):
        names = tuple(which)
    if names is None or not all(isinstance(n, str) for n in names):
        raise RegistryError(f"families={which!r}: allowed are None, \"all\", a family name or a list "
                            f"of names; registered: {', '.join(_registry.names())}")
    return names


def _measured(name: str) -> bool:
    """Whether a tier file for the current arch holds entries of family `name`."""
    from tunedb import database
    from tunedb.runtime import selector

    try:
        return any(res.db.entries for res in database.lookup(selector.current_arch_family(), name))
    except SettingsError:  # a bad TUNEDB_* value is the user's to fix: named, never swallowed
        raise
    except Exception:  # an unreadable tier is skipped by lookup; anything else: not measured
        return False
