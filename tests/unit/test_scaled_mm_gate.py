"""The numerical gate on the quantizing ops' outputs (CPU): an fp8 `_quant` arm's q (float8_e4m3fn,
which torch cannot isfinite or subtract) is poisoned, checked and compared through an fp32 upcast
against the row quantization of the fp32 product of the dequantized operands; int8 `_quant` bits
are compared exactly. A right q passes; a wrong element, an unwritten one or a NaN fails."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tunedb import families
from tunedb.families.scaled_mm import ops
from tunedb.measure.arms import Arm, problem_for
from tunedb.measure.gate import ABS_BOUND, gate_arms
from tunedb.records import Status

FP8 = families.get("scaled_mm_fp8")
INT8 = families.get("scaled_mm")
M = 24


def arm(cid, body):
    def make(args, kwargs, out):
        return lambda: body(args, out)
    return Arm(cid, make)


def gate(fam, sig, *arms):
    problem = problem_for(fam, sig, M, ["heuristic"])
    good = arm("heuristic", lambda a, out: out.copy_(ops._cpu(sig, *a)[0]))
    problem = dataclasses.replace(problem, arms=(good,) + arms, baseline=good)
    args, kwargs = problem.make_inputs("cpu", 3)
    return gate_arms(problem, args, kwargs, problem.make_out, sync=lambda: None)


def right(sig):
    return lambda a, out: out.copy_(ops._cpu(sig, *a)[0])


def shifted(sig):
    def body(a, out):  # every row one column off: a plausible indexing bug
        out.copy_(torch.roll(ops._cpu(sig, *a)[0].float(), 1, dims=1).to(out.dtype))
    return body


def skips(sig):
    def body(a, out):
        q = ops._cpu(sig, *a)[0]
        out[:, :-1] = q[:, :-1]  # the last column is never written
    return body


def nan(sig):
    def body(a, out):
        q = ops._cpu(sig, *a)[0].float()
        q[2, 3] = float("nan")
        out.copy_(q.to(out.dtype))
    return body


@pytest.mark.parametrize("scale", ["row", "block"])
def test_fp8_quant_gate_passes_a_right_q_and_fails_wrong_ones(scale):
    sig = FP8.make_signature("scaled_mm_quant", 96, 256, "fp8", scale)
    res = gate(FP8, sig, arm("same", right(sig)), arm("roll", shifted(sig)),
               arm("skip", skips(sig)), arm("nan", nan(sig)))
    assert res["heuristic"].status is Status.OK, res["heuristic"]
    assert res["heuristic"].bound == ABS_BOUND["float8_e4m3fn"]
    assert res["same"].status is Status.OK and res["same"].error == 0.0
    assert res["roll"].status is Status.INCORRECT and "exceeds the bound" in res["roll"].detail
    assert res["skip"].status is Status.INCORRECT and "never written" in res["skip"].detail
    assert "(0, 95)" in res["skip"].detail
    assert res["nan"].status is Status.INCORRECT and "NaN/Inf" in res["nan"].detail and "(2, 3)" in res["nan"].detail


def test_fp8_quant_gate_sees_a_q_one_mantissa_bit_short():
    sig = FP8.make_signature("scaled_mm_quant", 96, 256, "fp8", "row")

    def coarse(a, out):  # q rounded to e5m2 instead of e4m3: one mantissa bit short
        out.copy_(ops._cpu(sig, *a)[0].float().to(torch.float8_e5m2).float().to(out.dtype))

    def scaled(a, out):  # every q 10% too large (a wrong scale in the quantizer)
        out.copy_((ops._cpu(sig, *a)[0].float() * 1.1).to(out.dtype))

    res = gate(FP8, sig, arm("coarse", coarse), arm("scaled", scaled))
    assert res["scaled"].status is Status.INCORRECT
    # judged on fp32 values (not refused for its dtype): e5m2 rounding is ~3x the floor
    assert res["coarse"].status is Status.INCORRECT and "exceeds the bound 0.02" in res["coarse"].detail


def test_int8_quant_gate_compares_bits():
    sig = INT8.make_signature("scaled_mm_quant", 96, 256, "int8")

    def off_by_one(a, out):
        q = ops._cpu(sig, *a)[0]
        q[5, 7] = q[5, 7] + (1 if q[5, 7] < 127 else -1)
        out.copy_(q)

    res = gate(INT8, sig, arm("same", right(sig)), arm("off", off_by_one), arm("skip", skips(sig)))
    assert res["heuristic"].status is Status.OK and res["same"].status is Status.OK
    assert res["off"].status is Status.INCORRECT and "1 of 2304 output elements differ" in res["off"].detail
    assert res["skip"].status is Status.INCORRECT
