"""The numerical gate: an arm must compute the op before its time counts.

The output is poisoned (NaN) before the launch, so an element the kernel never writes stays
NaN; the result is compared with the family's fp32/fp64 reference on upcast inputs by the
relative Frobenius error ||out - ref|| / ||ref||. The framework op (the baseline arm, cuBLAS for
GEMM) is gated against an absolute bound for its dtype; every other arm must stay within
FACTOR x the baseline's own error (never below a small per-dtype floor). torch is imported
inside the functions that touch tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tunedb.records import Status

FACTOR = 4.0
# Absolute bounds for the baseline (cuBLAS) itself: a few units of rounding of the output dtype;
# fp32 allows TF32 accumulation.
ABS_BOUND: Mapping[str, float] = {"fp16": 1e-2, "bf16": 4e-2, "fp32": 2e-3, "fp64": 1e-9}
# The floor keeps a baseline that happens to be near-exact (tiny K) from failing honest arms.
FLOOR: Mapping[str, float] = {"fp16": 1e-3, "bf16": 8e-3, "fp32": 1e-5, "fp64": 1e-12}
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


def judge(out: Any, ref: Any, bound: float, rerun: Callable[[float], Any] | None = None,
          config_id: str = "") -> GateResult:
    """Judge one (already produced) output against the reference and a bound.

    rerun(fill) re-poisons the output with `fill`, launches again and returns the output; it
    tells unwritten elements from computed NaN/Inf.
    """
    import torch

    bad = ~torch.isfinite(out)
    n_bad = int(bad.sum().item())
    if n_bad:
        unwritten = 0
        if rerun is not None:
            again = rerun(_SECOND_POISON)
            unwritten = int((again == torch.full_like(again, _SECOND_POISON)).sum().item())
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        if unwritten:
            detail = (f"{unwritten} of {out.numel()} output elements never written "
                      f"(still poisoned), first at index {idx}")
        else:
            detail = f"{n_bad} of {out.numel()} output elements are NaN/Inf, first at index {idx}"
        return GateResult(config_id, Status.INCORRECT, None, bound, detail)
    err = relative_error(out, ref)
    if err > bound:
        return GateResult(config_id, Status.INCORRECT, err, bound,
                          f"relative error {err:.3g} exceeds the bound {bound:.3g}")
    return GateResult(config_id, Status.OK, err, bound, "")


def gate_arms(problem: Any, args: tuple, kwargs: dict, make_out: Callable[..., Any],
              sync: Callable[[], None], ref: Any = None) -> dict[str, GateResult]:
    """Gate every arm of `problem` on the given inputs; the baseline first, its error sets the bound.
    `ref`: the reference output when the caller already computed it (an fp32 GEMM per point)."""
    if ref is None:
        ref = problem.reference(args, kwargs)
    results: dict[str, GateResult] = {}

    def run(arm: Any, fill: float) -> Any:
        out = make_out(args, kwargs, ref)
        out.fill_(fill)
        arm.make(args, kwargs, out)()
        sync()
        return out

    def one(arm: Any, bound: float) -> GateResult:
        try:
            out = run(arm, float("nan"))
            return judge(out, ref, bound, rerun=lambda fill: run(arm, fill), config_id=arm.config_id)
        except Exception as exc:  # a failing arm costs itself, never the point
            return GateResult(arm.config_id, classify_exception(exc), None, bound, describe(exc))

    dtype = dtype_name(make_out(args, kwargs, ref).dtype)
    baseline_error = None
    baseline = problem.baseline_arm()
    if baseline is not None and baseline.make is not None:
        base = one(baseline, ABS_BOUND.get(dtype, 1e-2))
        if base.status.ok:
            baseline_error = base.error
        if baseline.config_id in problem.config_ids:
            results[base.config_id] = base
    bound = arm_bound(dtype, baseline_error)
    for arm in problem.arms:
        if arm.config_id not in results:
            results[arm.config_id] = one(arm, bound)
    return results
