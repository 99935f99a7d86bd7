"""The op entry points on inputs torch takes or refuses in its own way (session 54's probe): mixed
dtypes under autocast compute torch's product, a sparse MoE operand and a wrong Python type are
named (a TypeError too, as torch's), conv's padding='same' names the rank x was given."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import ArgumentTypeError, SignatureError
from tunedb.families.bmm.ops import bmm
from tunedb.families.conv.ops import conv1d, conv2d
from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax
from tunedb.families.group_gemm.ops import group_gemm
from tunedb.families.scaled_mm import ops as smm


def test_bmm_under_autocast_casts_mixed_operands_as_matmul_does():
    a, b = torch.randn(2, 3, 4, dtype=torch.bfloat16), torch.randn(2, 4, 5)
    with torch.autocast("cpu", torch.bfloat16):
        got, want = bmm(a, b), torch.matmul(a, b)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_gemm_log_softmax_under_autocast_computes_torchs_pair(x_dtype, w_dtype):
    x, w, b = torch.randn(3, 8, dtype=x_dtype), torch.randn(10, 8, dtype=w_dtype), torch.randn(10)
    with torch.autocast("cpu", torch.bfloat16):
        got = gemm_log_softmax(x, w, b)
        want = torch.log_softmax(torch.nn.functional.linear(x, w, b), -1)
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("sparse", ["x", "weight", "topk_ids", "topk_weights"])
def test_a_sparse_group_gemm_operand_is_named(sparse):
    args = {"x": torch.randn(4, 8, dtype=torch.bfloat16), "weight": torch.randn(3, 6, 8, dtype=torch.bfloat16),
            "topk_ids": torch.randint(0, 3, (4, 2)), "topk_weights": torch.rand(4, 2)}
    args[sparse] = args[sparse].to_sparse()
    with pytest.raises(SignatureError, match=f"group_gemm's {sparse} must be a dense"):
        group_gemm(**args)


def _i8(*shape):
    return torch.randint(-4, 4, shape, dtype=torch.int8)


@pytest.mark.parametrize("call, named", [
    (lambda: bmm(2.0, torch.randn(2, 3, 4)), "bmm's a must be a tensor, got float"),
    (lambda: gemm_log_softmax(torch.randn(3, 8, dtype=torch.bfloat16), [[1.0] * 8]), "weight must be a tensor, got list"),
    (lambda: group_gemm(torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(3, 6, 8, dtype=torch.bfloat16),
                        [[0, 1]] * 4), "topk_ids must be a tensor, got list"),
    (lambda: smm.scaled_mm_int8(_i8(3, 16), _i8(8, 16), 0.5, torch.rand(1, 8)), "x_scale must be a tensor, got float"),
    (lambda: smm.scaled_mm_fp8(torch.randn(3, 16).to(torch.float8_e4m3fn), torch.randn(8, 16).to(torch.float8_e4m3fn),
                               torch.ones(3, 1), torch.ones(1, 8), 1), "scale must be a str"),
    (lambda: smm.scaled_mm_int8(_i8(3, 16), _i8(8, 16), torch.rand(3, 1), torch.rand(1, 8), "bf16"),
     "out_dtype must be a torch.dtype or None, got str"),
    (lambda: conv2d(torch.randn(1, 4, 6, 6), torch.randn(6, 4, 3, 3), groups=2.0), "groups must be an int, got float"),
    (lambda: conv1d(torch.randn(1, 4, 6), torch.randn(6, 4, 3), groups=None), "groups must be an int, got NoneType"),
])
def test_a_wrong_python_type_is_named_and_is_a_type_error_as_torchs(call, named):
    with pytest.raises(ArgumentTypeError, match=named) as err:
        call()
    assert isinstance(err.value, TypeError) and isinstance(err.value, SignatureError)


def test_conv_groups_takes_what_torch_takes_and_refuses_what_it_refuses():
    import numpy as np

    x, w = torch.randn(1, 4, 6, 6), torch.randn(6, 2, 3, 3)
    for groups in (np.int64(2), torch.tensor(2)):  # integer-likes torch takes
        torch.testing.assert_close(conv2d(x, w, groups=groups), torch.nn.functional.conv2d(x, w, groups=2))
    with pytest.raises(RuntimeError) as want:  # below 1: torch's own error
        torch.nn.functional.conv2d(x, w, groups=0)
    with pytest.raises(RuntimeError) as got:
        conv2d(x, w, groups=0)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("b_shape", [(4, 5), (2, 4, 5, 1), (4,)])
def test_bmm_under_autocast_refuses_shapes_it_refuses_without(b_shape):
    """The autocast branch takes only operands bmm takes (3-D @ 2-D was torch.matmul's broadcast)."""
    a, b = torch.randn(2, 3, 4, dtype=torch.bfloat16), torch.randn(*b_shape)
    with pytest.raises(SignatureError):
        bmm(a, b.bfloat16())
    with torch.autocast("cpu", torch.bfloat16), pytest.raises(SignatureError):
        bmm(a, b)


def test_scaled_mm_fp8_scale_none_infers_the_mode_as_an_empty_string_does():
    x, w = torch.randn(3, 16).to(torch.float8_e4m3fn), torch.randn(8, 16).to(torch.float8_e4m3fn)
    sx, sw = torch.rand(3, 1), torch.rand(1, 8)
    assert torch.equal(smm.scaled_mm_fp8(x, w, sx, sw, None), smm.scaled_mm_fp8(x, w, sx, sw, ""))
    q, s = smm.scaled_mm_fp8_quant(x, w, sx, sw, None)
    q2, s2 = smm.scaled_mm_fp8_quant(x, w, sx, sw, "")
    assert torch.equal(q.float(), q2.float()) and torch.equal(s, s2)


@pytest.mark.parametrize("op, x, w", [
    (conv2d, torch.randn(7, 9), torch.randn(6, 4, 2, 2)),
    (conv1d, torch.randn(1, 4, 7, 9), torch.randn(6, 4, 2)),
])
def test_same_padding_with_an_even_kernel_names_the_rank_x_was_given(op, x, w):
    ref = torch.nn.functional.conv2d if op is conv2d else torch.nn.functional.conv1d
    with pytest.raises(RuntimeError) as want:
        ref(x, w, padding="same")
    with pytest.raises(RuntimeError) as got:
        op(x, w, padding="same")
    assert str(got.value) == str(want.value)
