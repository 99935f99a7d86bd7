"""prewarm(): measure a model's must-tune points that no tier covers, before any graph is captured.

    tunedb.optimize(model)
    tunedb.prewarm(model, (x,), budget_s=120, strict=True)   # then capture CUDA graphs

The points come from a census ShapeSet (its must-tune points), from Points, or from running
the model once on example inputs (every tuned-op call it makes is must-tune: a model that is
prewarmed is about to be captured; an optimized model none of whose calls a family serves, an
fp32 model's GEMMs say, has no points). A point is covered when the user or system tier answers
it. Uncovered points are measured under the protocol, weakest tier first (default before cost
model), then heaviest, within budget_s; winners are published to the user tier at their M and a
new epoch starts, so the next calls (and the graphs captured after them) serve them. In strict
mode a must-tune point still uncovered after the budget raises UncoveredShapeError.
Modules optimize() left as written (torch served them at every size) are recorded too, and when
winners were published optimize() runs again, swapping the modules a winner now serves.
"""
from __future__ import annotations

import numbers
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from tunedb.errors import NoGPUWarning, UncoveredShapeError
from tunedb.records import Point, ShapeSet, Signature
from tunedb.runtime import launch_table, report
from tunedb.runtime.autotuner import TUNER_KEYWORDS, Autotuner
from tunedb.runtime.tuner_args import check_keywords

COVERED_TIERS: tuple[str, ...] = ("user", "system")
_WEAKNESS = {"default": 0, "model": 1}  # measured first: the weakest answer


@dataclass(frozen=True)
class PrewarmResult:
    """What prewarm did: the must-tune points, those it measured, those still uncovered."""

    points: tuple[Point, ...]
    measured: tuple[Point, ...]
    uncovered: tuple[Point, ...]
    elapsed_s: float
    budget_exhausted: bool

    def summary(self) -> str:
        return (f"prewarm: {len(self.points)} must-tune points, {len(self.measured)} measured, "
                f"{len(self.uncovered)} uncovered{' (budget exhausted)' if self.budget_exhausted else ''}"
                f" in {self.elapsed_s:.1f}s")


def points_of(model: Any, inputs: Any, caller: str = "prewarm") -> tuple[Point, ...]:
    """The must-tune points of `inputs`: a ShapeSet, Points, or example inputs for `model`
    (`caller` names the function in an error: prewarm or confirm)."""
    if isinstance(inputs, ShapeSet):
        return tuple(p for p in inputs.points if p.must_tune)
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(p, Point) for p in inputs):
        return tuple(p for p in inputs if p.must_tune)
    if inputs is None:
        raise TypeError(f"{caller} needs what to tune: example inputs for the model (a tensor, a tuple "
                        "of args or a dict of kwargs), a census ShapeSet, or a list of Points")
    return _recorded(model, inputs, caller)


def forward_of(model: Any, inputs: Any) -> Callable[[], Any]:
    """model applied to example inputs: a dict as keywords, a list or tuple as positional
    arguments, anything else as the one argument."""
    if isinstance(inputs, dict):
        return lambda: model(**inputs)
    if isinstance(inputs, (list, tuple)):
        return lambda: model(*inputs)
    return lambda: model(inputs)


def _recorded(model: Any, inputs: Any, caller: str = "prewarm") -> tuple[Point, ...]:
    import torch

    if model is None:
        raise TypeError(f"{caller} needs a model to run example inputs through")
    if not callable(model):  # a string or a state_dict failed as "'str' object is not callable"
        raise TypeError(f"{caller} needs a model to run example inputs through (a torch.nn.Module or a "
                        f"callable), got {type(model).__name__}")
    with torch.no_grad(), launch_table.recording() as calls, report.recording_left(model):
        forward_of(model, inputs)()  # modules optimize() left as written are recorded too
    counts: dict[tuple[str, Signature, int], int] = {}
    for call in calls:
        counts[call] = counts.get(call, 0) + 1
    if not counts and _optimized(model):
        return ()  # its calls are ones no family serves (an fp32 model's GEMMs): nothing to measure
    if not counts:
        raise ValueError("the model made no tuned-op call on these inputs; run tunedb.optimize(model) "
                         "first, or pass a census ShapeSet")
    return tuple(Point(sig, m, weight=float(n), calls=n, must_tune=True)
                 for (_fam, sig, m), n in sorted(counts.items(), key=lambda kv: (str(kv[0][1]), kv[0][2])))


def _optimized(model: Any) -> bool:
    """Whether optimize() swapped any module of `model`, left one as written, or registered it
    (read off the modules' classes and marks too, so a deepcopy or an unpickled copy counts)."""
    modules = model.modules() if hasattr(model, "modules") else ()
    return (report.registered(model) or bool(report.left_in(model))
            or any(type(m).__module__.startswith("tunedb.") for m in modules))


def _tier(sig: Signature, m: int) -> str:
    from tunedb.runtime import selector
    return selector.peek(sig.family, sig, m).tier


def prewarm(model: Any, inputs: Any = None, budget_s: float = 120.0, strict: bool = False,
            **tuner: Any) -> PrewarmResult:
    """Measure the uncovered must-tune points of `model` (or of a ShapeSet / Points given as
    `inputs`) into the user tier within budget_s seconds; strict=True raises
    UncoveredShapeError for any left uncovered. Extra keywords (measurer=, publisher=,
    arch_family=, working_set_bytes= (default: the model's parameter bytes)) go to the
    Autotuner that measures."""
    from tunedb import families

    check_keywords("prewarm", tuner, TUNER_KEYWORDS)
    if isinstance(budget_s, bool) or not isinstance(budget_s, numbers.Real) or not 0 <= budget_s < float("inf"):
        raise ValueError(f"budget_s={budget_s!r} must be a number of seconds >= 0 (finite)")
    if not isinstance(strict, bool):  # strict="no" is truthy: it raised where the user asked it not to
        raise TypeError(f"prewarm strict={strict!r} must be True or False")
    if isinstance(model, (ShapeSet, list, tuple)) and inputs is None:
        model, inputs = None, model
    # a torch.compile'd module: its compiled graph never reaches the recorder (it found 0 points
    # and strict passed); the module it wraps makes the same calls
    model = getattr(model, "_orig_mod", model)
    points = points_of(model, inputs)
    start = time.monotonic()
    todo = []
    for p in points:
        tier = _tier(p.signature, p.m)
        if tier not in COVERED_TIERS:
            todo.append((_WEAKNESS.get(tier, 0), -p.weight, -p.m, p))
    todo.sort(key=lambda row: row[:3])
    measured: list[Point] = []
    exhausted = False
    if model is not None and hasattr(model, "parameters"):
        tuner.setdefault("working_set_bytes",
                         sum(p.numel() * p.element_size() for p in model.parameters()))
    tuner_ = Autotuner(None, publish=True, enabled=True, **tuner)
    why = tuner_.cannot_measure() if todo else None
    if why:  # one line, not one warning per point (nor a compile pool's spawn tracebacks)
        warnings.warn(f"prewarm measured nothing: {why}; {len(todo)} must-tune point"
                      f"{'s' * (len(todo) != 1)} stay uncovered", NoGPUWarning, stacklevel=2)  # (an AutotuneWarning too)
        todo = []
    # every point's candidates compile in parallel, in the order they will be measured
    tuner_.compile_ahead([(families.get(p.signature.family), p.signature, p.m) for *_, p in todo])
    for _w, _weight, _m, p in todo:
        if time.monotonic() - start >= budget_s:
            exhausted = True
            break
        if tuner_.tune(families.get(p.signature.family), p.signature, p.m) is not None:
            measured.append(p)
    tuner_.flush()  # publishes the winners and starts the epoch that serves them
    if measured and model is not None:
        from tunedb.runtime import patching

        patching.swap_left(model)  # what optimize() left as written and a tier now serves is swapped
    uncovered = tuple(p for p in points if _tier(p.signature, p.m) not in COVERED_TIERS)
    result = PrewarmResult(points, tuple(measured), uncovered, time.monotonic() - start, exhausted)
    if strict and uncovered:
        shown = ", ".join(f"{p.signature} M={p.m}" for p in uncovered[:5])
        more = f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else ""
        remedy = (f"{why}" if why else "raise budget_s") + ", run `tunedb tune` on a GPU, or pass strict=False"
        raise UncoveredShapeError(
            f"{len(uncovered)} must-tune point{'s' * (len(uncovered) != 1)} no tier covers after "
            f"prewarm ({result.summary()}): {shown}{more}; {remedy}")
    return result
