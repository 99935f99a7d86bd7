"""What a tuned Linear keeps for backward, and a bias added to the fused log-softmax head: a frozen
layer's input written in place after the call, features made under inference_mode with only the
biases training, and a frozen weight edited before backward all train as nn.Linear does (session
57: the autograd formula saved x, weight and bias whatever the gradients wanted)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.adapter = nn.Linear(16, 16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.adapter(x)
        h += self.fc(h)  # in place on the frozen layer's input
        return h


def _pair(model):
    tuned = tunedb.optimize(copy.deepcopy(model), inplace=False, families="all")
    assert any(type(m).__name__ == "TunedLinear" for m in tuned.modules())
    return tuned


def test_frozen_layer_input_written_in_place_after_the_call():
    torch.manual_seed(0)
    plain = _Residual()
    plain.fc.requires_grad_(False)
    tuned = _pair(plain)
    x = torch.randn(4, 16)
    for m in (plain, tuned):
        m(x).sum().backward()
    assert torch.equal(plain.adapter.weight.grad, tuned.adapter.weight.grad)
    assert tuned.fc.weight.grad is None


def test_bias_only_training_on_inference_features():
    with torch.inference_mode():
        feats = torch.randn(4, 16)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4))
    for name, p in plain.named_parameters():
        p.requires_grad_(name.endswith("bias"))
    tuned = _pair(plain)
    for m in (plain, tuned):
        m(feats).sum().backward()
    for a, b in zip(plain.parameters(), tuned.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)


def test_frozen_weight_edited_before_backward():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 8))
    plain[0].weight.requires_grad_(False)
    tuned = _pair(plain)
    x = torch.randn(4, 16)
    for m in (plain, tuned):
        y = m(x).sum()
        with torch.no_grad():
            m[0].weight.mul_(0.5)
        y.backward()
    assert torch.equal(plain[0].bias.grad, tuned[0].bias.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 16)])
def test_gradients_still_plain_when_everything_trains(dtype, shape):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 8, dtype=dtype))
    tuned = _pair(plain)
    x0 = torch.randn(*shape, dtype=dtype)
    outs = []
    for m in (plain, tuned):
        x = x0.clone().requires_grad_(True)
        y = m(x)
        (gx,) = torch.autograd.grad(y.abs().sum(), x, create_graph=True)
        gx.abs().sum().backward()  # a double backward through the saved weight
        outs.append((y, x.grad, m[0].weight.grad, m[0].bias.grad))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_bias_added_to_the_fused_head_later():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 8, bias=False), nn.LogSoftmax(-1))
    tuned = tunedb.optimize(copy.deepcopy(plain), inplace=False, families="all")
    assert type(tuned[0]).__name__ == "TunedLinearLogSoftmax"
    assert "bias" in tuned[0]._parameters
    for m in (plain, tuned):
        m[0].register_parameter("bias", nn.Parameter(torch.zeros(8)))
    x = torch.randn(3, 16)
    assert torch.allclose(plain(x), tuned(x))
    assert list(plain.state_dict()) == list(tuned.state_dict())


def test_recommend_names_a_float_n_as_not_an_int():
    from tunedb.errors import SignatureError
    from tunedb.families.linalg.plan import recommend

    with pytest.raises(SignatureError, match=r"n=16\.0 must be an int >= 0"):
        recommend("potrf", "fp32", 16.0, 64)


def test_the_slot_takes_its_linears_decision(monkeypatch):
    """A process-wide hook added between the Linear's call and its slot's (another thread running
    torch's ModuleTracker) left the two halves deciding apart: the activation applied twice. The
    slot now takes the Linear's decision for that call."""
    from torch.nn.modules.module import register_module_forward_hook

    from tunedb.families.gemm import fused_pair

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 4))
    tuned = tunedb.optimize(copy.deepcopy(plain), inplace=False, families="all")
    assert type(tuned[1]) is fused_pair.FusedActivation
    handles = []
    run_by = fused_pair.run_by

    def then_hook(parent, depth):
        got = run_by(parent, depth + 1)
        handles.append(register_module_forward_hook(lambda *a: None))  # as the other thread did
        return got

    monkeypatch.setattr(fused_pair, "run_by", then_hook)
    x = torch.randn(3, 8)
    try:
        with torch.no_grad():
            torch.testing.assert_close(tuned(x), plain(x))
    finally:
        for h in handles:
            h.remove()
    assert handles  # the Linear asked, and the hook came between the halves
    with torch.no_grad():  # a caller of its own still gets the slot's activation
        torch.testing.assert_close(tuned[1](x[:, :1].expand(3, 16)), plain[1](x[:, :1].expand(3, 16)))
