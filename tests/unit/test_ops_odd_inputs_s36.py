"""Odd inputs to the public ops that an audit found mishandled (session 36): relu's gradient at a
NaN pre-activation, a meta operand beside CPU ones (conv, bmm's torch-only dtypes), the fp8
scale mode inferred at N = 1 and at M = 0, and group_gemm's traced grad form (ids checked,
an unrouted expert's NaN kept out)."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.bmm import ops as bmm_ops
from tunedb.families.conv import ops as conv_ops
from tunedb.families.gemm import ops as gemm_ops
from tunedb.families.group_gemm import ops as group_ops
import tunedb.families.scaled_mm.ops  # noqa: F401 - registers the scaled_mm ops

bmm_ops.register()
group_ops.register()


def test_relu_gradient_at_a_nan_pre_activation_is_torchs():
    x = torch.tensor([[1.0, 2.0], [3.0, float("nan")]], requires_grad=True)
    w = torch.tensor([[1.0, -1.0], [0.5, 0.5]], requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    ours = torch.autograd.grad(gemm_ops.gemm_act(x, w, b, "relu").sum(), (x, w, b))
    theirs = torch.autograd.grad(torch.relu(torch.nn.functional.linear(x, w, b)).sum(), (x, w, b))
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_a_meta_operand_beside_cpu_ones_is_refused_by_name():
    x, w = torch.randn(1, 2, 5), torch.ones(3, 2, 1)
    with pytest.raises(SignatureError, match="bias on meta"):
        conv_ops.conv1d(x, w, torch.zeros(3, device="meta"))
    with pytest.raises(SignatureError, match="weight on meta"):
        torch.ops.tunedb.conv2d(torch.randn(1, 2, 4, 4), torch.ones(3, 2, 1, 1, device="meta"), None,
                                [1, 1], [0, 0], [1, 1], 1, "none")
    with pytest.raises(SignatureError, match="b on meta"):
        bmm_ops.bmm(torch.ones(2, 3, 4, dtype=torch.float64), torch.ones(2, 4, 5, dtype=torch.float64, device="meta"))


def test_fp8_scale_mode_inferred_at_one_output_channel_and_no_row():
    fp8 = torch.float8_e4m3fn
    x, w = torch.randn(3, 16).to(fp8), torch.randn(1, 16).to(fp8)
    per_tensor = torch.ops.tunedb.scaled_mm_fp8(x, w, torch.tensor([0.5]), torch.tensor([2.0]))  # [1] and [1] at N=1
    explicit = torch.ops.tunedb.scaled_mm_fp8(x, w, torch.tensor([0.5]), torch.tensor([2.0]), scale="tensor")
    assert torch.equal(per_tensor, explicit)
    empty = torch.ops.tunedb.scaled_mm_fp8(torch.randn(0, 100).to(fp8), torch.randn(5, 100).to(fp8),
                                           torch.rand(0, 1), torch.rand(1, 1))  # block scales, N, K <= 128, M = 0
    assert tuple(empty.shape) == (0, 5)


def _routed(e=4, n=6, k=8):
    torch.manual_seed(0)
    ids = torch.tensor([[0, 1], [2, 1], [1, 0]])  # expert 3 receives no token
    w = torch.randn(e, n, k, dtype=torch.bfloat16)
    return torch.randn(3, k, dtype=torch.bfloat16), w, ids


def test_group_gemm_compiled_for_training_checks_ids_and_keeps_an_unrouted_experts_nan_out():
    x, w, ids = _routed()
    w[3] = float("nan")

    def f(x, w, ids):
        return group_ops.group_gemm(x, w, ids)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xc = x.clone().requires_grad_()
    y = compiled(xc, w, ids)
    y.float().sum().backward()
    assert not y.isnan().any() and not xc.grad.isnan().any()
    xe = x.clone().requires_grad_()
    torch.testing.assert_close(y, f(xe, w, ids), rtol=2e-2, atol=2e-2)
    bad = ids.clone()
    bad[1, 1] = 9
    with pytest.raises(RuntimeError, match="expert id outside 0..3"):
        compiled(x.clone().requires_grad_(), w, bad)


def test_an_encoder_layers_fast_path_feed_forward_is_left_to_torch_and_said_so(monkeypatch):
    """nn.TransformerEncoderLayer (batch_first, ReLU/GELU) runs torch's fused fast path at
    inference, which never calls linear1 / linear2: they stay nn.Linear and the report lists them
    as seen, not patched (a census would have counted them as tuned calls). Without batch_first
    there is no fast path and they are swapped as any Linear."""
    from torch import nn

    import tunedb
    from tunedb.families.gemm import patching

    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))  # a table serves every key
    fast = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2).eval()
    tunedb.optimize(fast)
    assert all(type(layer.linear1) is nn.Linear and type(layer.linear2) is nn.Linear for layer in fast.layers)
    assert any("4 nn.TransformerEncoderLayer feed-forward" in line for line in tunedb.tuning_report().splitlines())
    x = torch.randn(2, 5, 32)
    with torch.inference_mode():
        fast(x)  # the fast path, as before optimize()
    slow = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=False), 2).eval()
    tunedb.optimize(slow)
    assert all(type(layer.linear1) is patching.TunedLinear for layer in slow.layers)
