"""Calls a user makes that no table or test named before session 49 (found by probing the public
entry points and optimize() with unusual code and inputs on the CPU): each keeps plain PyTorch's
result, or names the bad argument and what is allowed."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
from torch import nn

import tunedb
from tunedb.errors import SignatureError


def _reinit(model, seed=123):
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()


def test_a_reinit_loop_reaches_the_swapped_linears():
    plain = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).bfloat16()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned[0]).__name__ == "TunedLinear"
    _reinit(plain)
    _reinit(tuned)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    for a, b in zip(plain.parameters(), tuned.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(plain(x), tuned(x))


def test_a_strided_bias_on_the_cpu_keeps_plain_bits():
    def build():  # built twice: a deepcopy would make the bias contiguous
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)).bfloat16()
        nn.init.normal_(model[0].weight)
        model[0].bias = nn.Parameter(torch.randn(16, 2, dtype=torch.bfloat16)[:, 0])
        return model

    plain, tuned = build(), tunedb.optimize(build(), families="all")
    assert not tuned[0].bias.is_contiguous() and type(tuned[0]).__name__ == "TunedLinear"
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(plain(x), tuned(x))


@pytest.mark.parametrize("shape,transposed,three_d", list(itertools.product([(8, 16, 3), (33, 65, 9)], [False, True],
                                                                             [False, True])))
def test_weight_and_bias_gradients_are_plain_bits_in_either_weight_layout(shape, transposed, three_d):
    """torch's mm backward computes a weight's gradient in the order its layout implies (a weight
    made from a transposed tensor, as tying or checkpoint conversion code makes it)."""
    k, n, m = shape

    def build():
        torch.manual_seed(0)
        lin = nn.Linear(k, n)
        if transposed:
            lin.weight = nn.Parameter(torch.randn(k, n).t())
        return nn.Sequential(lin)

    plain, tuned = build(), tunedb.optimize(build(), families="all")
    torch.manual_seed(1)
    x = torch.randn(2, m, k) if three_d else torch.randn(m, k)
    plain(x).square().sum().backward()
    tuned(x).square().sum().backward()
    assert torch.equal(plain[0].weight.grad, tuned[0].weight.grad)
    assert torch.equal(plain[0].bias.grad, tuned[0].bias.grad)


def _weight_views():
    g = torch.Generator().manual_seed(0)
    e, n, k = 4, 24, 32
    base = torch.randn(e, n, k, generator=g).bfloat16()
    return {
        "contiguous": base,
        "strided K": torch.randn(e, n, 2 * k, generator=g).bfloat16()[..., ::2],
        "expanded N": torch.randn(e, 1, k, generator=g).bfloat16().expand(e, n, k),
        "experts innermost": torch.randn(n, k, e, generator=g).bfloat16().permute(2, 0, 1),
        "transposed store": torch.randn(e, k, n, generator=g).bfloat16().transpose(1, 2),
    }


@pytest.mark.parametrize("layout", list(_weight_views()))
def test_group_gemm_takes_any_weight_layout(layout):
    from tunedb.families.group_gemm.ops import group_gemm

    w = _weight_views()[layout]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, w.shape[2], generator=g).bfloat16()
    ids = torch.randint(0, w.shape[0], (6, 2), generator=g)
    want = group_gemm(x, w.contiguous(), ids)
    assert torch.equal(group_gemm(x, w, ids), want)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64, torch.bool])
def test_group_gemm_names_routing_weights_of_a_dtype_it_does_not_take(dtype):
    from tunedb.families.group_gemm.ops import group_gemm

    x, w = torch.randn(6, 8).bfloat16(), torch.randn(4, 5, 8).bfloat16()
    ids = torch.randint(0, 4, (6, 2))
    with pytest.raises(SignatureError, match=r"topk_weights must be a real floating dtype.*" + str(dtype).split(".")[1]):
        group_gemm(x, w, ids, torch.ones(6, 2, dtype=dtype))


def test_fp8_block_scales_are_told_from_row_scales_by_the_activation_scale():
    """At N <= 128 with N = ceil(K/128), a block weight scale [1, KB] has a row-wise [1, N] scale's
    shape: the activation's [M, KB] says block."""
    from tunedb.families.scaled_mm.ops import scaled_mm_fp8

    torch.manual_seed(0)
    f8 = torch.float8_e4m3fn
    m, n, k = 4, 32, 4096
    kb = k // 128
    x, w = torch.randn(m, k).to(f8), torch.randn(n, k).to(f8)
    xs, ws = torch.rand(m, kb) + 0.5, torch.rand(1, kb) + 0.5
    assert torch.equal(scaled_mm_fp8(x, w, xs, ws), scaled_mm_fp8(x, w, xs, ws, "block"))
    # a row-wise call of the same weight scale shape stays row-wise
    rows = scaled_mm_fp8(x, w, torch.rand(m, 1) + 0.5, ws)
    assert rows.shape == (m, n)


@pytest.mark.parametrize("which", ["x", "weight", "x_scale", "w_scale"])
@pytest.mark.parametrize("op", ["int8", "int8_quant", "fp8"])
def test_scaled_mm_names_a_missing_operand(op, which):
    from tunedb.families.scaled_mm import ops

    m, n, k = 6, 5, 8
    dt = torch.int8 if op.startswith("int8") else torch.float8_e4m3fn
    args = {"x": torch.randint(-5, 5, (m, k), dtype=torch.int8).to(dt),
            "weight": torch.randint(-5, 5, (n, k), dtype=torch.int8).to(dt),
            "x_scale": torch.rand(m), "w_scale": torch.rand(n)}
    args[which] = None
    fn = {"int8": ops.scaled_mm_int8, "int8_quant": ops.scaled_mm_int8_quant, "fp8": ops.scaled_mm_fp8}[op]
    with pytest.raises(SignatureError, match=f"{which} must be a tensor, got None"):
        fn(args["x"], args["weight"], args["x_scale"], args["w_scale"])


@pytest.mark.parametrize("sparse", ["a", "b"])
def test_bmm_names_a_sparse_operand(sparse):
    from tunedb.families.bmm.ops import bmm

    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 6)
    if sparse == "a":
        a = a.to_sparse()
    else:
        b = b.to_sparse()
    with pytest.raises(SignatureError, match=f"bmm's {sparse} must be a dense"):
        bmm(a, b)


def test_a_sparse_product_is_never_the_product_modes():
    from tunedb.families.bmm.serving import eligible

    a = torch.randn(3, 4, 5)
    assert not eligible(a.to_sparse(), torch.randn(3, 5, 6))


@pytest.mark.parametrize("op,weight", [("conv1d", (6, 4, 3, 2)), ("conv1d", (6, 4)), ("conv2d", (6, 4, 3))])
@pytest.mark.parametrize("padding", [0, "same"])
def test_conv_names_a_weight_of_the_wrong_rank(op, weight, padding):
    from tunedb.families.conv import ops

    x = torch.randn(2, 4, 20) if op == "conv1d" else torch.randn(2, 4, 8, 8)
    with pytest.raises(SignatureError, match=rf"{op}'s weight must be .*got shape \[{', '.join(map(str, weight))}\]"):
        getattr(ops, op)(x, torch.randn(*weight), padding=padding)
