"""The tuned GEMM ops under torch.autocast compute what the plain model's nn.Linear computes:
an fp32 model run under autocast (the usual mixed-precision recipe) gives the same dtype and
values, a bf16 activation meeting an fp32 weight is cast as autocast casts it (it raised
ValueError before), and gradients, torch.compile and the ops called directly agree."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from tunedb.families.gemm import ops

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


class CastsItsInput(nn.Module):
    """A block that hands a bf16 activation to an fp32 Linear (what autocast's own linear output
    does to the next layer of an fp32 model)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 16)
        self.out = nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.out(self.proj(x.to(torch.bfloat16)))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16), nn.SiLU(), nn.Linear(16, 8, bias=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make", [_mlp, CastsItsInput])
def test_an_fp32_model_under_autocast_matches_the_plain_model(make, dtype):
    plain = make().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    assert any(type(m).__name__ == "TunedLinear" for m in tuned.modules())
    x = torch.randn(3, 5, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        want, got = plain(x), tuned(x)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_gradients_under_autocast_match():
    plain = _mlp()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    x = torch.randn(4, 32)
    for model in (plain, tuned):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).float().square().sum().backward()
    for (name, p), q in zip(plain.named_parameters(), tuned.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)


def test_the_ops_called_directly_take_autocasts_dtype():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    w, b = torch.randn(8, 32), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.silu(torch.nn.functional.linear(x, w, b))
        for got in (ops.gemm_act(x, w, b, "silu"), torch.ops.tunedb.gemm_act(x, w, b, "silu")):
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert ops.gemm(x, w).dtype == torch.bfloat16
        assert torch.ops.tunedb.gemm(x, w).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="differs from weight dtype"):  # outside autocast, as before
        ops.gemm(x, w)


def test_a_compiled_model_under_autocast_matches():
    plain = _mlp().eval()
    tuned = torch.compile(tunedb.optimize(copy.deepcopy(plain), families="gemm"), backend="aot_eager")
    x = torch.randn(4, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = plain(x), tuned(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_already_in_autocasts_dtype_keeps_the_tuned_op(monkeypatch, dtype):
    """A bf16 model run under bf16 autocast (autocast casts nothing there) is served by the tuned
    op, not by F.linear: autocast on must not silently turn tunedb off for a model already cast."""
    served = []
    real = ops._serve
    monkeypatch.setattr(ops, "_serve", lambda *a: served.append(a[0]) or real(*a))
    plain = _mlp().to(dtype).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    x = torch.randn(4, 32, dtype=dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        want, got = plain(x), tuned(x)
        assert served, "no call reached the tuned op"
        served.clear()
        w32 = torch.randn(8, 32)  # an fp32 weight is cast by autocast: F.linear's call, not the op
        assert ops.gemm(x, w32).dtype == dtype and not served
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want)
