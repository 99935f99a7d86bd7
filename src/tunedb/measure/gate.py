"""The numerical gate: an arm must compute the op before its time counts.

The output is poisoned before the launch (NaN for floating outputs, the dtype's minimum for
integer ones; float8 outputs are poisoned with their NaN and checked through an fp32 upcast,
since torch implements neither isfinite nor most arithmetic for them), so an element the kernel never writes keeps the poison; a second run with
another poison tells "never written" from "computed that value". The family's verify rule
(families.contract.VerifyRule) then judges the output:
- tolerance: the relative Frobenius error ||out - ref|| / ||ref|| against the family's
  higher-precision reference; the baseline arm (the pick rule's fallback, cuBLAS for GEMM) is
  held to an absolute bound for its dtype, every other arm to `factor` x the baseline's own error
  (never below a small per-dtype floor), or to the rule's bound when it has one;
- exact: bitwise equal to the reference (integer outputs);
- residual: the family's residual hook on the inputs the arm started from (a solver's
  ||A x - b|| / ||b||, say), within the rule's bound or `factor` x the baseline's residual.
An arm of an in-place op (input policy RING) runs on a fresh copy of the inputs each time, and
its returned value is what is judged. torch is imported inside the functions that touch tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tunedb.records import Status

FACTOR = 4.0
# Absolute bounds for the baseline (cuBLAS) itself: a few units of rounding of the output dtype;
# fp32 allows TF32 accumulation.
# float8 (a quantizing op's q): half an ulp of e4m3 is 1/16 of a value, of e5m2 1/8.
ABS_BOUND: Mapping[str, float] = {"fp16": 1e-2, "bf16": 4e-2, "fp32": 2e-3, "fp64": 1e-9,
                                  "float8_e4m3fn": 6.25e-2, "float8_e5m2": 1.25e-1}
# The floor keeps a baseline that happens to be near-exact (tiny K) from failing honest arms;
# for float8 it lets a few elements of q land one ulp away where the accumulators differ.
FLOOR: Mapping[str, float] = {"fp16": 1e-3, "bf16": 8e-3, "fp32": 1e-5, "fp64": 1e-12,
                              "float8_e4m3fn": 2e-2, "float8_e5m2": 4e-2}
# A value no GEMM of random inputs produces exactly: tells "never written" from "wrote NaN".
_SECOND_POISON = 24576.0


@dataclass(frozen=True)
class GateResult:
    config_id: str
    status: Status
    error: float | None = None  # relative Frobenius error against the reference
    bound: float | None = None  # the bound it was held to
    detail: str = ""


def dtype_name(dtype: Any) -> str:
    import torch

    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
             torch.float64: "fp64"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref||_F / ||ref||_F in fp64 (the absolute error when ref is all zeros)."""
    import torch

    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if o.shape != r.shape:
        raise ValueError(f"output shape {tuple(o.shape)} differs from reference {tuple(r.shape)}")
    diff = torch.linalg.vector_norm(o - r).item()
    denom = torch.linalg.vector_norm(r).item()
    return diff / denom if denom > 0 else diff


def arm_bound(dtype: str, baseline_error: float | None) -> float:
    """The error an arm may have: FACTOR x the baseline's, at least the floor; the absolute
    bound when there is no trustworthy baseline."""
    if baseline_error is None:
        return ABS_BOUND.get(dtype, 1e-2)
    return max(FACTOR * baseline_error, FLOOR.get(dtype, 1e-3))


def describe(exc: BaseException, limit: int = 300) -> str:
    """'TypeName: message' of a failure, the message cut to `limit` characters."""
    return f"{type(exc).__name__}: {str(exc).strip()[:limit]}"


def classify_exception(exc: BaseException) -> Status:
    """Compile failures and resource overflows are told apart from launch failures."""
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    if name == "OutOfResources":
        return Status.INFEASIBLE
    if "Compil" in name or module.startswith("triton.compiler"):
        return Status.COMPILE_ERROR
    return Status.LAUNCH_ERROR


def _is_float8(dtype: Any) -> bool:
    return "float8" in str(dtype)


def _comparable(out: Any) -> Any:
    """The output in a dtype torch can test (isfinite, ==): float8 upcast to fp32, exactly."""
    import torch

    return out.to(torch.float32) if _is_float8(out.dtype) else out


def _poisons(dtype: Any) -> tuple[Any, Any]:
    """(first, second) poison values for an output dtype. float8's second is its smallest
    normal (24576 is not representable in e4m3; a quantized row rarely lands exactly there,
    and only elements that held the first poison are counted)."""
    import torch

    if _is_float8(dtype):
        return float("nan"), float(torch.finfo(dtype).smallest_normal)
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan"), _SECOND_POISON
    if dtype == torch.bool:
        return False, True
    info = torch.iinfo(dtype)
    return info.min, info.max


def _unwritten(out: Any, first: Any, rerun: Callable[[Any], Any] | None, second: Any) -> tuple[Any, int]:
    """(mask of elements that still hold the first poison, how many of them the rerun left at
    the second poison: never written)."""
    import torch

    view = _comparable(out)
    if isinstance(first, float) and first != first:
        bad = ~torch.isfinite(view)
    else:
        bad = view == first
    n_bad = int(bad.sum().item())
    if not n_bad or rerun is None:
        return bad, 0
    again = _comparable(rerun(second))
    return bad, int(((again == second) & bad).sum().item())


def judge(out: Any, ref: Any, bound: float, rerun: Callable[[Any], Any] | None = None,
          config_id: str = "", kind: str = "tolerance", residual: float | None = None) -> GateResult:
    """Judge one (already produced) output against the reference under a verify kind.

    rerun(fill) re-poisons the output with `fill`, launches again and returns the output; it
    tells unwritten elements from computed NaN/Inf. kind "residual" judges `residual` (the
    family's measure) against the bound; "exact" wants every element bitwise equal.
    """
    first, second = _poisons(out.dtype)
    floating = out.dtype.is_floating_point or out.dtype.is_complex
    bad, unwritten = _unwritten(out, first, rerun, second)
    n_bad = int(bad.sum().item())
    if unwritten or (n_bad and floating):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        if unwritten:
            detail = (f"{unwritten} of {out.numel()} output elements never written "
                      f"(still poisoned), first at index {idx}")
        else:
            detail = f"{n_bad} of {out.numel()} output elements are NaN/Inf, first at index {idx}"
        return GateResult(config_id, Status.INCORRECT, None, bound, detail)
    if kind == "exact":
        if out.shape != ref.shape:
            raise ValueError(f"output shape {tuple(out.shape)} differs from reference {tuple(ref.shape)}")
        differ = _comparable(out).to(ref.dtype) != _comparable(ref)
        n = int(differ.sum().item())
        if n:
            idx = tuple(int(i) for i in differ.nonzero()[0].tolist())
            return GateResult(config_id, Status.INCORRECT, float(n), 0.0,
                              f"{n} of {out.numel()} output elements differ from the exact reference, "
                              f"first at index {idx}")
        return GateResult(config_id, Status.OK, 0.0, 0.0, "")
    if kind == "residual":
        if residual is None:
            return GateResult(config_id, Status.INCORRECT, None, bound,
                              "the verify rule is 'residual' but the family gave no residual for this output")
        err = float(residual)
        what = "residual"
    else:
        err = relative_error(out, ref)
        what = "relative error"
    if not err <= bound:  # NaN fails too
        return GateResult(config_id, Status.INCORRECT, err, bound, f"{what} {err:.3g} exceeds the bound {bound:.3g}")
    return GateResult(config_id, Status.OK, err, bound, "")


def gate_arms(problem: Any, args: tuple, kwargs: dict, make_out: Callable[..., Any] | None,
              sync: Callable[[], None], ref: Any = None) -> dict[str, GateResult]:
    """Gate every arm of `problem` on the given inputs; the baseline first, its error sets the bound.
    `ref`: the reference output when the caller already computed it (an fp32 GEMM per point).
    Under the ring policy (an in-place op) every run starts from a fresh copy of `args`, gets no
    output buffer and is judged by what it returns."""
    from tunedb.measure.inputs import fresh_copy

    if ref is None:
        ref = problem.reference(fresh_copy(args), kwargs)
    rule = problem.verify
    kind = getattr(rule, "kind", "tolerance")
    factor = getattr(rule, "factor", FACTOR)
    fixed = getattr(rule, "bound", None)
    in_place = problem.policy == "ring" or make_out is None
    results: dict[str, GateResult] = {}

    def run(arm: Any, fill: Any) -> tuple[Any, tuple]:
        if in_place:
            inputs = fresh_copy(args)
            out = arm.make(inputs, kwargs, None)()
            sync()
            return out, inputs
        out = make_out(args, kwargs, ref)
        out.fill_(fill)
        arm.make(args, kwargs, out)()
        sync()
        return out, args

    def one(arm: Any, bound: float) -> GateResult:
        try:
            first = _poisons(ref.dtype if in_place else make_out(args, kwargs, ref).dtype)[0]
            out, _ = run(arm, first)
            value = problem.residual(fresh_copy(args), kwargs, out) if kind == "residual" and problem.residual else None
            rerun = None if in_place else (lambda fill: run(arm, fill)[0])
            return judge(out, ref, bound, rerun=rerun, config_id=arm.config_id, kind=kind, residual=value)
        except Exception as exc:  # a failing arm costs itself, never the point
            return GateResult(arm.config_id, classify_exception(exc), None, bound, describe(exc))

    import torch

    first_tensor = next((a for a in args if isinstance(a, torch.Tensor)), ref)
    dtype = dtype_name(first_tensor.dtype if in_place else make_out(args, kwargs, ref).dtype)
    baseline_error = None
    baseline = problem.baseline_arm()
    if baseline is not None and baseline.make is not None:
        base = one(baseline, fixed if fixed is not None else ABS_BOUND.get(dtype, 1e-2))
        if base.status.ok:
            baseline_error = base.error
        if baseline.config_id in problem.config_ids:
            results[base.config_id] = base
    if fixed is not None:
        bound = fixed
    elif baseline_error is None:
        bound = ABS_BOUND.get(dtype, 1e-2)
    else:
        bound = max(factor * baseline_error, FLOOR.get(dtype, 1e-3))
    for arm in problem.arms:
        if arm.config_id not in results:
            results[arm.config_id] = one(arm, bound)
    return results
