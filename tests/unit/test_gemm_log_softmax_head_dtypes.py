"""An optimize()d Linear + LogSoftmax head under autocast: the model's fp32 head on bf16
activations raised 'x is torch.bfloat16 but weight is torch.float32' (and autocast runs
log_softmax in fp32, which the fused op would not). The head now computes exactly torch's pair
there, and a plain bf16 head still takes the fused op."""
from __future__ import annotations

import copy

import torch

from tunedb.families.gemm_log_softmax import census


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 33), torch.nn.LogSoftmax(dim=-1)).to(dtype)


def test_an_autocast_forward_is_the_plain_models():
    plain = _model()
    tuned = census.optimize(copy.deepcopy(plain))
    assert type(tuned[1]).__name__ == "TunedLinearLogSoftmax"
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = plain(x), tuned(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_plain_bf16_head_still_takes_the_fused_op():
    tuned = census.optimize(_model(torch.bfloat16))
    calls = []
    from tunedb.families.gemm_log_softmax import ops

    real = ops.gemm_log_softmax
    try:
        ops.gemm_log_softmax = lambda *a: calls.append(1) or real(*a)
        tuned(torch.randn(2, 16, dtype=torch.bfloat16))
    finally:
        ops.gemm_log_softmax = real
    assert calls == [1]
