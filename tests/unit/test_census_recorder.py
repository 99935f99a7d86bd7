"""The aten-level recorder: what it records for linears, the LM head, products of activations,
weights reached through views and casts, on meta tensors and on real CPU tensors."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tunedb.census.recorder import Recorder as GemmRecorder, record
from tunedb.records import Signature


def gemm(n, k, dt="half"):
    return Signature.make("gemm", "gemm", dt, N=n, K=k)


def bmm(b, n, k, dt="half", lay="nn"):
    """A product of activations: the bmm family's key (families/bmm), not GEMM's."""
    return Signature.make("bmm", "bmm", dt, B=b, N=n, K=k, lay=lay)


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_with_and_without_bias(device, dtype):
    with torch.device(device):
        a, b = nn.Linear(32, 48).to(dtype), nn.Linear(48, 16, bias=False).to(dtype)
        x = torch.randn(3, 5, 32, dtype=dtype)
    calls = record(lambda: b(a(x)))
    assert calls == {(gemm(48, 32), 15): 1, (gemm(16, 48), 15): 1}


def test_noncontiguous_input_and_fp32():
    with torch.device("meta"):
        lin = nn.Linear(8, 24)
        x = torch.randn(4, 6, 8).transpose(0, 1)
    assert record(lambda: lin(x)) == {(gemm(24, 8, "fp32"), 24): 1}


def test_products_of_activations_are_bmm():
    q = torch.randn(2, 4, 10, 16, device="meta", dtype=torch.float16)
    k = torch.randn(2, 4, 12, 16, device="meta", dtype=torch.float16)
    calls = record(lambda: torch.matmul(q, k.transpose(-1, -2)))
    assert calls == {(bmm(8, 12, 16, lay="nt"), 10): 1}  # k^T: a K-contiguous view, in place
    x, y = torch.randn(7, 3, device="meta"), torch.randn(3, 5, device="meta")
    # a 2-D product of activations: the run time serves products of 3-D or more, so no bmm key
    # (it would be measured and never served)
    assert record(lambda: x @ y) == {}
    assert record(lambda: x.unsqueeze(0) @ y.unsqueeze(0)) == {(bmm(1, 5, 3, "fp32"), 7): 1}


def test_weights_reached_through_views_and_casts():
    w = nn.Parameter(torch.randn(96, 32, device="meta"))
    x = torch.randn(5, 32, device="meta", dtype=torch.bfloat16)

    def run():
        q, k, v = w.chunk(3)  # a packed projection split into three
        F.linear(x, q.to(torch.bfloat16))  # an autocast-style cast of a weight slice
        x @ w.to(torch.bfloat16).t()  # a hand-written x @ W^T
        torch.einsum("mk,nk->mn", x, k.to(torch.bfloat16))
    calls = record(run)
    assert calls == {(gemm(32, 32), 5): 2, (gemm(96, 32), 5): 1}


def test_packed_attention_projection_and_lm_head_style_linear():
    mha = nn.MultiheadAttention(64, 4, device="meta", dtype=torch.float16).eval()
    x = torch.randn(10, 2, 64, device="meta", dtype=torch.float16)  # (T, B, D)
    calls = record(lambda: mha(x, x, x, need_weights=False))
    assert calls[(gemm(192, 64), 20)] == 1  # q is k is v: one packed in-projection
    assert calls[(gemm(64, 64), 20)] == 1  # out_proj
    head = nn.Linear(64, 50000, bias=False, device="meta", dtype=torch.float16)
    assert record(lambda: head(x[-1])) == {(gemm(50000, 64), 2): 1}


def test_recorder_counts_repeated_calls_and_resets_per_instance():
    lin = nn.Linear(8, 8, device="meta", dtype=torch.float16)
    x = torch.randn(4, 8, device="meta", dtype=torch.float16)
    with torch.no_grad(), GemmRecorder() as rec:
        for _ in range(3):
            lin(x)
    assert rec.calls == {(gemm(8, 8), 4): 3}
    assert record(lambda: lin(x)) == {(gemm(8, 8), 4): 1}


def test_fused_activation_is_recorded_as_gemm_act():
    lin = nn.Linear(16, 32, device="meta", dtype=torch.bfloat16)
    x = torch.randn(6, 16, device="meta", dtype=torch.bfloat16)
    calls = record(lambda: torch._addmm_activation(lin.bias, x, lin.weight.t(), use_gelu=True))
    sig = Signature.make("gemm", "gemm_act", "half", N=32, K=16, act="gelu_tanh", bias=1)
    assert calls == {(sig, 6): 1}


def test_pure_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, tunedb, tunedb.census, tunedb.census.modes, tunedb.census.censusfile, "
            "tunedb.census.capture, tunedb.census.presets, tunedb.build.partition, tunedb.buckets, tunedb.families.gemm.costmodel; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_stack_of_distinct_weights_is_not_one_gemm():
    """MoE-style experts: bmm(x[E,S,K], W[E,K,N]) is E GEMMs with E weights, not one at M=E*S."""
    w = nn.Parameter(torch.empty(8, 64, 32, device="meta", dtype=torch.half))
    x = torch.empty(8, 16, 64, device="meta", dtype=torch.half)
    calls = record(lambda: torch.bmm(x, w))
    assert {s.op for s, _ in calls} == {"bmm"}
