"""The public conv entry points on unusual arguments: an activation the op does not fuse is a
clear error on every device (the CPU path skipped it silently), torch's string paddings work
as in F.conv1d / F.conv2d or are refused by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tunedb.errors import SignatureError
from tunedb.families.conv import keys, ops


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_unknown_activation_is_refused_not_skipped(device):
    x, w = torch.randn(2, 8, 20, device=device), torch.randn(8, 1, 5, device=device)
    with pytest.raises(SignatureError, match="act='gelu'.*none, relu, silu"):
        ops.conv1d(x, w, None, 1, 2, 1, 8, act="gelu")
    with pytest.raises(SignatureError, match="act='tanh'"):
        ops.conv2d(torch.randn(1, 3, 8, 8, device=device), torch.randn(4, 3, 3, 3, device=device), act="tanh")


@pytest.mark.parametrize("kernel, dilation", [(5, 1), (3, 2), (1, 1)])
def test_string_paddings_match_torch(kernel, dilation):
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 17, dtype=torch.float64), torch.randn(6, 3, kernel, dtype=torch.float64), None
    for padding in ("same", "valid"):
        got = ops.conv1d(x, w, b, 1, padding, dilation, 2, act="relu")
        want = torch.relu(F.conv1d(x, w, b, 1, padding, dilation, 2))
        torch.testing.assert_close(got, want)
    x2, w2 = torch.randn(1, 2, 9, 7, dtype=torch.float64), torch.randn(4, 2, kernel, 3, dtype=torch.float64)
    torch.testing.assert_close(ops.conv2d(x2, w2, None, 1, "same", dilation),
                               F.conv2d(x2, w2, None, 1, "same", dilation))


def test_same_padding_with_an_even_kernel_pads_as_torch_does():
    # k=4: torch pads 1 before and 2 after (the op refused it before session 35)
    torch.manual_seed(0)
    x, w = torch.randn(1, 4, 16, dtype=torch.float64), torch.randn(4, 2, 4, dtype=torch.float64)
    torch.testing.assert_close(ops.conv1d(x, w, None, 1, "same", 1, 2), F.conv1d(x, w, None, 1, "same", 1, 2))
    x2, w2 = torch.randn(2, 3, 9, 8, dtype=torch.float64), torch.randn(4, 3, 2, 3, dtype=torch.float64)
    b2 = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(ops.conv2d(x2, w2, b2, 1, "same", (1, 2)), F.conv2d(x2, w2, b2, 1, "same", (1, 2)))


def test_string_paddings_the_op_cannot_pad_are_refused():
    x, w = torch.randn(1, 4, 16), torch.randn(4, 4, 4)
    with pytest.raises(SignatureError, match="stride 1"):
        ops.conv1d(x, torch.randn(4, 4, 3), None, 2, "same")
    with pytest.raises(SignatureError, match="'full'.*'valid' or 'same'"):
        ops.conv1d(x, w, None, 1, "full")
    with pytest.raises(SignatureError, match="stride="):
        ops.conv1d(x, w, None, "2", 0)

