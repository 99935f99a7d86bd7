"""The conv entry points name a bad `act` in the family's words (None used to reach the op's
schema and fail as "Expected a value of type 'str'")."""
import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.conv.ops import conv1d, conv2d


@pytest.mark.parametrize("act", [None, "gelu", 1])
def test_a_bad_act_is_named_with_the_allowed_ones(act):
    with pytest.raises(SignatureError, match=r"conv1d act=.* allowed: none, relu, silu"):
        conv1d(torch.randn(1, 4, 10), torch.randn(4, 4, 3), act=act)
    with pytest.raises(SignatureError, match=r"conv2d act=.* allowed: none, relu, silu"):
        conv2d(torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), act=act)


def test_a_fused_act_still_runs():
    x, w = torch.randn(1, 4, 10), torch.randn(4, 4, 3)
    assert torch.equal(conv1d(x, w, act="relu"), torch.relu(torch.nn.functional.conv1d(x, w)))
