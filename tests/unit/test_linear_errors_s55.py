"""A swapped Linear answers operands the tuned op refuses as the nn.Linear it replaced: torch's own
error word for word (a caller matching nn.Linear's message, a test asserting it), and torch's
result where torch takes them (a bias parameter of shape [1] that F.linear broadcasts). Session
55 probe: the swapped layer raised tunedb's OperandMismatchError with its own wording."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _pair():
    torch.manual_seed(0)
    plain = _Net().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned.fc2) is not nn.Linear and tuned.fc1.act == "silu"  # swapped, and the pair fused
    return plain, tuned


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("layer", ["fc1", "fc2"])
@pytest.mark.parametrize("make_x", [
    lambda k: torch.randn(3, k + 1),                     # K does not fit
    lambda k: torch.randn(3, k, dtype=torch.float64),    # another dtype
    lambda k: torch.ones(3, k, dtype=torch.long),        # an integer input
    lambda k: torch.tensor(1.0),                         # 0-d
    lambda k: torch.randn(3, k, device="meta"),          # another device
], ids=["K", "fp64", "int", "0-d", "meta"])
def test_refused_operands_raise_nn_linears_own_error(layer, make_x):
    plain, tuned = _pair()
    k = getattr(plain, layer).in_features
    x = make_x(k)
    want = _error(lambda: getattr(plain, layer)(x))
    got = _error(lambda: getattr(tuned, layer)(x))
    assert got[1] == want[1] and issubclass(got[0], want[0]), (got, want)


def test_a_bias_torch_broadcasts_serves_torchs_result():
    plain, tuned = _pair()
    for model in (plain, tuned):
        model.fc2.bias = nn.Parameter(torch.full((1,), 0.5))  # F.linear broadcasts it
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(tuned(x), plain(x))


def test_the_swapped_log_softmax_head_answers_as_torchs_pair():
    from tunedb.families.gemm_log_softmax.module import TunedLinearLogSoftmax

    torch.manual_seed(0)
    lin = nn.Linear(16, 300).bfloat16()
    head = TunedLinearLogSoftmax(lin)
    for x in (torch.randn(2, 17).bfloat16(), torch.randn(2, 16)):  # K, dtype
        want = _error(lambda x=x: torch.log_softmax(lin(x), -1))
        got = _error(lambda x=x: head(x))
        assert got[1] == want[1] and issubclass(got[0], want[0]), (got, want)
    lin.bias = head.bias = nn.Parameter(torch.zeros(1).bfloat16())  # broadcast by F.linear
    x = torch.randn(2, 16).bfloat16()
    assert torch.equal(head(x), torch.log_softmax(lin(x), -1))
