"""The tuning report: per optimized model, how its linear layers resolved, per tier.

optimize() registers each model it patches (held weakly) with its TunedLinear layers. A layer's
tier is the weakest tier any of its shapes resolved at in this epoch (a layer served by the user
tier at M=64 but by the default at M=4096 counts as default: it is not fully tuned). Layers
that have not yet run on a CUDA device are counted apart. The selector's own per-family lines
(every call counted per tier) follow the model lines, then the model tier's confidence: how
many unmeasured shapes it served a config or declined, and each served pick's predicted gain
and error band.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Any, Iterator

from tunedb.errors import TunedbError

from tunedb.runtime import selector
from tunedb.runtime import launch_table

# Strongest first: a layer is reported under the last of these that any of its shapes took.
TIER_ORDER: tuple[str, ...] = ("autotune", *selector.TIER_NAMES)
_TIER_WORDS = {"autotune": "autotune", **selector.REPORT_NAMES}

_models: list[tuple[weakref.ref, str, list[weakref.ref]]] = []
# optimize() may run in several threads at once (a server optimizing models as they load): the
# registries change under this lock, and readers iterate over snapshots (a concurrent
# registration raised "dictionary changed size during iteration")
_LOCK = threading.RLock()
# id(model) -> ((), why) for a model optimize() left modules of as written: the report's "left" part.
# Which modules, the marks in the model say when the report is made (left_in: a module another family
# swapped since carries none); a callable why reads them as they are then
_left: dict[int, tuple[list[tuple[Any, ...]], Any]] = {}


def register_model(model: Any, layers: list[Any], left: "list[tuple[Any, ...]] | None" = None,
                   why: Any = "") -> None:
    """Remember `model`'s tuned layers for the report (replacing an earlier registration), and
    the modules left as written ((module, key, guessed) each; `why`: the reason, e.g. "torch
    serves every size", or a function of the (module, key, guessed) items still left when the
    report is made). Which modules were left, and why, the modules' own marks say (LEFT_MARK,
    written by the family's optimize())."""
    with _LOCK:
        _models[:] = [rec for rec in _models if rec[0]() is not None and rec[0]() is not model]
        live = {id(rec[0]()) for rec in _models}
        for gone in [k for k in list(_left) if k not in live]:
            _left.pop(gone, None)
        _models.append((weakref.ref(model), type(model).__name__, [weakref.ref(l) for l in layers]))
        if left:
            _left[id(model)] = ([], why)
        else:
            _left.pop(id(model), None)


def _live_models() -> list[Any]:
    return [model for ref, _name, _layers in list(_models) if (model := ref()) is not None]


# id(model) -> (family, model name, {why: count}) of the modules a family's optimize() left to torch
_unpatched: dict[int, tuple[str, str, dict[str, int]]] = {}


def register_unpatched(model: Any, family: str, counts: dict[str, int]) -> None:
    """Remember the modules of `model` whose calls `family` could key but its optimize() does not
    swap ({why, in the family's words: count}): the report's "seen, not patched" line, so that
    tunedb claims nothing for them and says so."""
    with _LOCK:
        live = {id(rec[0]()) for rec in _models if rec[0]() is not None}
        for gone in [k for k in list(_unpatched) if k not in live]:
            _unpatched.pop(gone, None)
        if counts:
            _unpatched[id(model)] = (family, type(model).__name__, dict(counts))
        else:
            _unpatched.pop(id(model), None)


def unpatched_lines() -> list[str]:
    """One line per live model with modules a family's optimize() left to torch, by why."""
    lines = []
    for ref, _name, _layers in list(_models):
        model = ref()
        got = _unpatched.get(id(model)) if model is not None else None
        if got:
            family, name, counts = got
            total = sum(counts.values())
            kinds = "; ".join(f"{n} {why}" for why, n in sorted(counts.items()))
            lines.append(f"{family}: {total} module{'s' * (total != 1)} ({name}) seen, not patched "
                         f"(torch runs them): {kinds}")
    return lines


def registered(model: Any) -> bool:
    """Whether optimize() registered `model` (it may have left every module as written)."""
    return any(ref() is model for ref, _name, _layers in list(_models))


def left_as_written(model: Any) -> tuple[list[tuple[Any, ...]], str]:
    """(table keys of the modules optimize() left as written in `model` and still so, why)."""
    got = _left.get(id(model))
    if got is None:
        return [], ""
    why = got[1]
    # the marked modules of the model now (a sibling group's members carry the marks of the
    # Linears they replaced; a module another family swapped since carries none)
    still = [(m, key, guessed) for m, key, guessed, _family in left_in(model)]
    if not still:
        return [], ""
    return [item[1] for item in still], why(still) if callable(why) else why


def drop_left(module: Any) -> None:
    """`module` is swapped by another family now: it no longer counts as left as written (nor does
    swap_left re-run the family that left it)."""
    module.__dict__.pop(LEFT_MARK, None)


# The attribute optimize() writes into a module it left as written: (table key, guessed, family). It is
# in the module's __dict__, so a deepcopy or an unpickled copy of the model keeps it, where the
# registry above (held by id) does not.
LEFT_MARK = "_tunedb_left"


def left_in(model: Any) -> list[tuple[Any, tuple[Any, ...], bool, str]]:
    """(module, table key, guessed, family) of each module of `model` optimize() left as written."""
    modules = model.modules() if hasattr(model, "modules") else ()
    return [(m, *m.__dict__[LEFT_MARK]) for m in modules if LEFT_MARK in m.__dict__]


@contextlib.contextmanager
def _forward_hooks(pairs: list[tuple[Any, Any]]) -> Iterator[int]:
    """Each (module, hook) pair's forward hook while inside; yields how many."""
    handles = [module.register_forward_hook(hook) for module, hook in pairs]
    try:
        yield len(handles)
    finally:
        for h in handles:
            h.remove()


def recording_left(model: Any) -> Any:
    """While inside, each module optimize() left as written in `model` (or in the model it was
    copied from) records the tuned-op call it would make if swapped (launch_table.record of its
    key's op and act), so that prewarm sees every shape a tier could serve; yields how many
    modules were hooked. Hooks are removed after."""
    return _forward_hooks([(module, functools.partial(_record_left, key[0], key[4]))
                           for module, key, _guessed, _family in left_in(model)])


@contextlib.contextmanager
def measuring_guessed(measure: Any) -> Iterator[list[Any]]:
    """While inside, each module optimize() left as written for want of measurements (guessed)
    in a live registered model calls measure(signature, m) with the tuned-op call it would make
    if swapped (its output stays the module's own); yields the list of the models whose modules
    did (autotune() re-runs optimize() on those after publishing). Hooks are removed after."""
    touched: list[Any] = []
    pairs: dict[int, tuple[Any, Any]] = {}  # one hook a module, held by two models or not
    for model in _live_models():
        for module, key, guessed, _family in left_in(model):
            if guessed and id(module) not in pairs:
                pairs[id(module)] = (module, functools.partial(_measure_left, measure, touched,
                                                               weakref.ref(model), key[0], key[4]))
    with _forward_hooks(list(pairs.values())):
        yield touched


def _measure_left(measure: Any, touched: list[Any], model_ref: Any, op: str, act: str, module: Any,
                  args: tuple[Any, ...], _out: Any) -> None:
    if not args:
        return
    try:
        sig, m = launch_table.signature_of(op, args[0], module.weight, module.bias, act)
    except TunedbError:  # a dtype the family never serves: no shape to tune
        return
    measure(sig, m)
    model = model_ref()
    if model is not None and not any(t is model for t in touched):
        touched.append(model)


def _record_left(op: str, act: str, module: Any, args: tuple[Any, ...], _out: Any) -> None:
    if launch_table.recording_active() and args:
        try:
            launch_table.record(op, args[0], module.weight, module.bias, act)
        except TunedbError:  # a dtype the family never serves: no shape to tune
            pass


def layer_key(layer: Any) -> tuple[Any, ...]:
    """The launch-table key prefix of a registered layer (its family's table_key())."""
    return layer.table_key()


def layer_tiers() -> list[tuple[str, list[tuple[tuple[Any, ...], str | None]]]]:
    """Per live registered model: (name, [(layer key, weakest tier or None if not run)])."""
    seen: dict[tuple[Any, ...], str] = {}
    for key, bound in launch_table.entries():
        prefix = key[:6]
        tier = bound.tier if bound.tier in TIER_ORDER else "default"
        old = seen.get(prefix)
        if old is None or TIER_ORDER.index(tier) > TIER_ORDER.index(old):
            seen[prefix] = tier
    out = []
    for model_ref, name, refs in list(_models):
        if model_ref() is None:
            continue
        rows: list[tuple[tuple[Any, ...], str | None]] = []
        for ref in refs:
            layer = ref()
            if layer is not None:
                key = layer_key(layer)
                rows.append((key, seen.get(key)))
        out.append((name, rows))
    return out


def model_lines(family: str | None = None) -> list[str]:
    from tunedb import families

    family = family or families.DEFAULT
    lines = []
    for (name, rows), left in zip(layer_tiers(), _left_of_live()):
        counts = dict.fromkeys(TIER_ORDER, 0)
        not_run = 0
        for _key, tier in rows:
            if tier is None:
                not_run += 1
            else:
                counts[tier] += 1
        keys, why = left
        left_line = (f"{family}: {len(keys)} linear layer{'s' * (len(keys) != 1)} over {len(set(keys))} "
                     f"signature{'s' * (len(set(keys)) != 1)} ({name}) left as written ({why})") if keys else None
        if not rows:  # every Linear was left to another family (a torchao-quantized model) or as written
            lines += [left_line] if left_line else []
            continue
        n_sigs = len({key for key, _ in rows})
        parts = [f"{counts[t]} {_TIER_WORDS[t]}" for t in TIER_ORDER if t != "autotune"]
        if counts["autotune"]:
            parts.insert(0, f"{counts['autotune']} autotune")
        if not_run:
            parts.append(f"{not_run} not yet run on a GPU")
        lines.append(f"{family}: {len(rows)} linear layer{'s' * (len(rows) != 1)} over {n_sigs} "
                     f"signature{'s' * (n_sigs != 1)} ({name}): {', '.join(parts)}")
        lines += [left_line] if left_line else []
    return lines


def _left_of_live() -> list[tuple[list[tuple[Any, ...]], str]]:
    """left_as_written of each live registered model, in layer_tiers()'s order."""
    return [left_as_written(model) for ref, _n, _l in list(_models) if (model := ref()) is not None]


def confidence_lines() -> list[str]:
    """Per family whose model tier decided something this epoch: how many unmeasured shapes it
    served a config and declined, then each served config's predicted gain and error band."""
    from tunedb.runtime import serving

    lines = []
    for family in sorted({fam for fam, _sig, _m in serving.decisions()}):
        line = serving.confidence_line(family)
        if line:
            lines.append(line)
        for (_f, sig, m), d in sorted(serving.decisions(family).items(), key=lambda kv: (kv[0][1].format(), kv[0][2])):
            if getattr(d, "best", None) is not None and d.config is d.best:
                lines.append(f"  {sig.format()} M={m}: model: {d.describe()}")
    return lines


# shapes listed per family under its fallback line: a server sees every sequence length, and a
# report of thousands of lines hides the rest (serving.fallbacks() holds them all)
FALLBACK_SHOWN = 8


def fallback_lines() -> list[str]:
    """Per family: the shapes whose entry's region named a config its evidence does not support
    there (serving.unsupported), each with why the fallback served instead (the first
    FALLBACK_SHOWN, then how many more)."""
    from tunedb.runtime import serving

    lines = []
    for family in sorted({fam for fam, _sig, _m in serving.fallbacks()}):
        lines.append(serving.fallback_line(family))
        shown = sorted(serving.fallbacks(family).items(), key=lambda kv: (kv[0][1].format(), kv[0][2]))
        for (_f, sig, m), (_key, _cid, why) in shown[:FALLBACK_SHOWN]:
            lines.append(f"  {sig.format()} M={m}: {why}")
        if len(shown) > FALLBACK_SHOWN:
            lines.append(f"  ... and {len(shown) - FALLBACK_SHOWN} more (tunedb.runtime.serving.fallbacks())")
    return lines


def tuning_report() -> str:
    """One line per family and optimized model, then the selector's per-family lines."""
    from tunedb import families
    from tunedb.families.contract import hook

    own = [line for name in families.names() for line in hook(families.get(name), "report_lines")()]
    lines = model_lines() + unpatched_lines() + own + list(selector.report_lines()) + confidence_lines() + fallback_lines()
    return "\n".join(lines) if lines else selector.tuning_report()  # its "nothing called yet" line
