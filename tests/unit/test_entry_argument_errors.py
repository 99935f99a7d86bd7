"""Bad arguments to the families' entry points are refused by name, never truncated, never an
AttributeError from deep inside (session 33's API audit): a None or a number where a tensor
belongs, a float conv stride, a group_gemm call without tokens whose other arguments are wrong;
and what is right is accepted: a 0-d fp8 weight scale at N = 1, recommend()'s arch checked for
every n, prewarm()/confirm()'s numbers."""
from __future__ import annotations

import math

import pytest
import torch

import tunedb
from tunedb.errors import SignatureError
from tunedb.families.conv import ops as conv
from tunedb.families.gemm import ops as gemm
from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax
from tunedb.families.group_gemm.ops import group_gemm
from tunedb.families.scaled_mm.keys import infer_scale

W4 = torch.randn(4, 4)
EXPERTS = torch.randn(4, 6, 8).bfloat16()
NO_TOKENS = torch.empty(0, 2, dtype=torch.long)


@pytest.mark.parametrize("call,named", [
    (lambda: gemm.gemm(None, W4), "gemm's x must be a tensor, got None"),
    (lambda: gemm.gemm(torch.randn(2, 4), 1.0), "gemm's weight must be a tensor, got float"),
    (lambda: gemm.gemm_act(torch.randn(2, 4), W4, 3.0), "gemm_act's bias must be a tensor or None, got float"),
    (lambda: torch.ops.tunedb.gemm(None, W4), "gemm's x must be a tensor, got None"),
    (lambda: gemm_log_softmax(None, W4), "gemm_log_softmax's x must be a tensor, got None"),
    (lambda: gemm_log_softmax(torch.randn(2, 4), W4, 1.0), "gemm_log_softmax's bias must be a tensor or None"),
    (lambda: conv.conv1d(None, torch.randn(16, 8, 1)), "conv1d's x must be a tensor, got None"),
    (lambda: conv.conv2d(torch.randn(1, 3, 8, 8), None), "conv2d's weight must be a tensor, got None"),
    (lambda: group_gemm(None, EXPERTS, torch.zeros(3, 2, dtype=torch.long)), "group_gemm's x must be a tensor"),
    (lambda: group_gemm(torch.randn(3, 8).bfloat16(), EXPERTS, None), "group_gemm's topk_ids must be a tensor"),
])
def test_a_missing_tensor_is_named(call, named):
    with pytest.raises(SignatureError, match=named.replace("(", r"\(")):
        call()


@pytest.mark.parametrize("stride", [1.5, None, "2", True])
def test_a_conv_stride_that_is_no_int_is_refused_not_truncated(stride):
    with pytest.raises(SignatureError, match="stride="):
        conv.conv1d(torch.randn(2, 8, 20), torch.randn(16, 8, 1), stride=stride)
    got = conv.conv1d(torch.randn(2, 8, 20), torch.randn(16, 8, 3), stride=(2,), padding=torch.tensor(1).item())
    assert got.shape == (2, 16, 10)


def test_group_gemm_without_tokens_still_checks_its_other_arguments():
    assert group_gemm(torch.randn(0, 8).bfloat16(), EXPERTS, NO_TOKENS).shape == (0, 2, 6)
    with pytest.raises(SignatureError, match=r"x must be \[M, K\]"):
        group_gemm(torch.randn(3, 8).bfloat16(), EXPERTS, NO_TOKENS)
    with pytest.raises(SignatureError, match=r"weight must be \[E, N, K\]"):
        group_gemm(torch.randn(0, 8).bfloat16(), torch.randn(5).bfloat16(), NO_TOKENS)


def test_a_0d_fp8_weight_scale_is_per_tensor_even_at_n1():
    assert infer_scale(torch.tensor(1.0), 1, 64) == "tensor"
    assert infer_scale(torch.tensor(1.0), 8, 64) == "tensor"
    assert infer_scale(torch.ones(1), 1, 64) == "row"  # one output channel: the same numbers either way
    with pytest.raises(SignatureError, match="cannot tell the scale mode"):
        infer_scale(torch.ones(3), 8, 64)


def test_recommend_names_a_bad_arch_and_n_for_every_size():
    with pytest.raises(SignatureError, match="arch='bogus'"):
        tunedb.recommend("posv", "fp32", 200, 64, arch="bogus")
    with pytest.raises(SignatureError, match=r"n=-3 must be an int >= 0"):
        tunedb.recommend("posv", "fp32", -3, 64)
    assert tunedb.recommend("posv", "fp32", 1, 64).arm == "torch"  # outside 2..128: torch's forms


@pytest.mark.parametrize("bad", ["10", math.nan, math.inf, -1, True])
def test_prewarm_and_confirm_take_numbers_only(bad):
    m, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match="budget_s="):
        tunedb.prewarm(m, (x,), budget_s=bad)
    with pytest.raises(ValueError, match="tol="):
        tunedb.confirm(m, (x,), tol=bad)
