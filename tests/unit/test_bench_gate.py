"""The numerical gate on synthetic outputs (CPU tensors): wrong, NaN, unwritten, slightly off."""
import pytest
import torch

from tunedb.measure.arms import Arm, Problem
from tunedb.measure.gate import ABS_BOUND, arm_bound, classify_exception, gate_arms, judge, relative_error
from tunedb.records import Signature, Status

SIG = Signature.make("gemm", "gemm", "fp16", N=48, K=64)
M = 40


def make_inputs(device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, 64, generator=g).half()
    w = torch.randn(48, 64, generator=g).half()
    return (x, w), {}


def reference(args, kwargs):
    x, w = args
    return x.double() @ w.double().t()


def arm(cid, body):
    def make(args, kwargs, out):
        return lambda: body(*args, out)
    return Arm(cid, make)


def good(x, w, out):
    out.copy_((x.float() @ w.float().t()).half())


def zero_column(x, w, out):
    good(x, w, out)
    out[:, 5] = 0


def truncated_k(x, w, out):
    out.copy_((x[:, :48].float() @ w[:, :48].float().t()).half())


def makes_nan(x, w, out):
    good(x, w, out)
    out[3, 7] = float("nan")


def skips_one(x, w, out):
    full = (x.float() @ w.float().t()).half()
    out[:, :-1] = full[:, :-1]
    out[:-1, -1] = full[:-1, -1]  # element (M-1, N-1) is never written


def slightly_off(x, w, out):
    # 2x the baseline's own rounding error: within the 4x bound
    exact = x.double() @ w.double().t()
    base = (x.float() @ w.float().t()).half().double()
    out.copy_((exact + 2.0 * (base - exact)).half())


def raises(x, w, out):
    raise RuntimeError("illegal instruction in tile")


def run_gate(*arms):
    problem = Problem(SIG, M, (arm("torch", good),) + arms, make_inputs=make_inputs,
                      reference=reference)
    args, kwargs = make_inputs("cpu", 0)
    make_out = lambda a, k, ref: torch.empty(ref.shape, dtype=torch.float16)
    return gate_arms(problem, args, kwargs, make_out, sync=lambda: None)


def test_gate_verdicts_on_synthetic_outputs():
    res = run_gate(arm("zero_col", zero_column), arm("trunc_k", truncated_k),
                   arm("nan", makes_nan), arm("unwritten", skips_one),
                   arm("close", slightly_off), arm("boom", raises))
    assert res["torch"].status is Status.OK
    assert res["torch"].bound == ABS_BOUND["fp16"]
    base = res["torch"].error
    assert 0 < base < 1e-3
    assert res["close"].status is Status.OK
    assert base < res["close"].error <= res["close"].bound == pytest.approx(arm_bound("fp16", base))
    for cid in ("zero_col", "trunc_k"):
        assert res[cid].status is Status.INCORRECT
        assert "exceeds the bound" in res[cid].detail
    assert res["nan"].status is Status.INCORRECT
    assert "NaN/Inf" in res["nan"].detail and "(3, 7)" in res["nan"].detail
    assert res["unwritten"].status is Status.INCORRECT
    assert "never written" in res["unwritten"].detail and f"({M - 1}, 47)" in res["unwritten"].detail
    assert res["boom"].status is Status.LAUNCH_ERROR
    assert "illegal instruction" in res["boom"].detail


def test_baseline_failing_its_absolute_bound_leaves_others_on_the_absolute_bound():
    problem = Problem(SIG, M, (arm("torch", zero_column), arm("a", good)),
                      make_inputs=make_inputs, reference=reference)
    args, kwargs = make_inputs("cpu", 0)
    res = gate_arms(problem, args, kwargs,
                    lambda a, k, ref: torch.empty(ref.shape, dtype=torch.float16), sync=lambda: None)
    assert res["torch"].status is Status.INCORRECT  # cuBLAS goes through the gate too
    assert res["a"].status is Status.OK and res["a"].bound == ABS_BOUND["fp16"]


def test_untimed_baseline_still_sets_the_bound():
    problem = Problem(SIG, M, (arm("a", good), arm("b", zero_column)), make_inputs=make_inputs,
                      reference=reference, baseline=arm("torch", good))
    args, kwargs = make_inputs("cpu", 0)
    res = gate_arms(problem, args, kwargs,
                    lambda a, k, ref: torch.empty(ref.shape, dtype=torch.float16), sync=lambda: None)
    assert set(res) == {"a", "b"}
    assert res["a"].bound < ABS_BOUND["fp16"]
    assert res["b"].status is Status.INCORRECT


def test_relative_error_and_floor():
    ref = torch.ones(4, 4, dtype=torch.float64)
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(ref * 1.01, ref) == pytest.approx(0.01)
    assert arm_bound("bf16", 0.0) == pytest.approx(8e-3)  # the floor
    assert arm_bound("fp16", 1e-3) == pytest.approx(4e-3)
    with pytest.raises(ValueError, match="shape"):
        relative_error(torch.ones(2, 3), torch.ones(3, 2))
    verdict = judge(torch.full((2, 2), float("inf")), ref[:2, :2], bound=1.0)
    assert verdict.status is Status.INCORRECT and "NaN/Inf" in verdict.detail


def test_exception_classification():
    class CompilationError(Exception):
        pass

    class OutOfResources(Exception):
        pass

    assert classify_exception(CompilationError("x")) is Status.COMPILE_ERROR
    assert classify_exception(OutOfResources("smem")) is Status.INFEASIBLE
    assert classify_exception(RuntimeError("x")) is Status.LAUNCH_ERROR


def _int_problem(*arms):
    from tunedb.families.contract import VerifyRule

    def make_inputs_int(device, seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(-100, 100, (M, 64), generator=g, dtype=torch.int32),
                torch.randint(-100, 100, (48, 64), generator=g, dtype=torch.int32)), {}

    def ref(args, kwargs):
        x, w = args
        return x.long() @ w.long().t()

    problem = Problem(SIG, M, arms, make_inputs=make_inputs_int, reference=ref, verify=VerifyRule("exact"))
    args, kwargs = make_inputs_int("cpu", 0)
    make_out = lambda a, k, r: torch.empty(r.shape, dtype=torch.int32)
    return gate_arms(problem, args, kwargs, make_out, sync=lambda: None)


def exact_int(x, w, out):
    out.copy_(x.long() @ w.long().t())


def test_exact_rule_poisons_integer_outputs_and_wants_every_bit():
    def off_by_one(x, w, out):
        exact_int(x, w, out)
        out[3, 7] += 1

    def skips_a_row(x, w, out):
        full = x.long() @ w.long().t()
        out[1:].copy_(full[1:])

    res = _int_problem(arm("torch", exact_int), arm("off", off_by_one), arm("skip", skips_a_row))
    assert res["torch"].status is Status.OK
    assert res["off"].status is Status.INCORRECT and "1 of 1920 output elements differ" in res["off"].detail
    assert res["skip"].status is Status.INCORRECT and "never written" in res["skip"].detail
