"""A child that an instance attribute of the same name shadows is not what the parent's code
calls (`self.activation` finds the instance attribute first): optimize() does not fuse it
(session 53: nn.TransformerDecoderLayer's __setstate__, run by the deepcopy in _get_clones,
sets activation = F.relu over a GELU child; the fused Linear applied GELU, and the slot it left
had no child, so a hook on the Linear then raised KeyError). And a bias-less swapped Linear keeps
nn.Linear's None entry of _parameters (a bias added later was refused)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from tunedb.families.gemm.fused_pair import FusedActivation


def _decoder():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 4, 32, activation=nn.GELU(), dropout=0.0)
    return nn.TransformerDecoder(layer, 2).eval()


def test_a_shadowed_activation_child_is_not_fused_and_the_model_gives_the_plain_output():
    plain = _decoder()
    assert plain.layers[0].__dict__["activation"] is torch.nn.functional.relu  # torch's own shadow
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    layer = tuned.layers[0]
    assert layer.linear1.__dict__.get("act", "none") == "none"
    assert not any(isinstance(m, FusedActivation) for m in tuned.modules())
    x = torch.randn(5, 2, 16)
    layer.linear1.register_forward_hook(lambda m, i, o: None)
    with torch.no_grad():
        torch.testing.assert_close(tuned(x, x), plain(x, x), rtol=0, atol=0)



def test_a_biasless_swapped_linear_takes_a_bias_as_nn_linear_does():
    torch.manual_seed(0)
    tuned = tunedb.optimize(nn.Sequential(nn.Linear(8, 8, bias=False), nn.Tanh()), families="all")
    lin = tuned[0]
    assert type(lin).__name__ == "TunedLinear" and list(lin._parameters) == ["weight", "bias"]
    with pytest.raises(TypeError):
        lin.bias = torch.ones(8)  # a plain tensor where a Parameter belongs, refused as by nn.Linear
    lin.register_parameter("bias", nn.Parameter(torch.ones(8)))  # BitFit-style
    x = torch.randn(2, 8)
    torch.testing.assert_close(lin(x), x @ lin.weight.T + 1)
    assert set(tuned.state_dict()) == {"0.weight", "0.bias"}
