"""The tuned convolutions where a model meets torch.compile and a folded BatchNorm: the fake
kernel gives the real op's shape and layout (unbatched inputs raised IndexError in the fake, and
a channels-last input made Inductor's stride assertion fail), and the Conv + BatchNorm fold
neither caches inference tensors nor loses fp64 precision."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import tunedb
from tunedb.families.conv import ops as conv_ops

CASES = [
    ("conv1d", (8, 20), (6, 8, 3), 1),                       # unbatched
    ("conv1d", (2, 8, 20), (8, 1, 5), 8),                    # depthwise
    ("conv2d", (3, 12, 12), (6, 3, 3, 3), 1),                # unbatched
    ("conv2d", (2, 3, 12, 12), (6, 3, 3, 3), 1),
    ("conv2d", "cl", (6, 3, 3, 3), 1),                       # channels-last input
]


@pytest.mark.parametrize("op,x_shape,w_shape,groups", CASES)
def test_the_fake_gives_the_real_ops_shape_and_strides(op, x_shape, w_shape, groups):
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 12, 12).to(memory_format=torch.channels_last) if x_shape == "cl"
         else torch.randn(*x_shape))
    w = torch.randn(*w_shape)
    fn = getattr(conv_ops, op)
    real = fn(x, w, None, 1, 1, 1, groups, act="relu")
    with FakeTensorMode() as mode:
        fake = fn(mode.from_tensor(x), mode.from_tensor(w), None, 1, 1, 1, groups, act="relu")
    assert fake.shape == real.shape and fake.stride() == real.stride()


def test_a_fold_first_made_under_inference_mode_still_trains():
    m = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4), nn.SiLU()).eval()
    m.requires_grad_(False)
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    opt = tunedb.optimize(copy.deepcopy(m), families="all")
    x = torch.randn(2, 4, 9)
    with torch.inference_mode():
        opt(x)  # the fold is cached here
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    opt(mine).sum().backward()
    m(ref).sum().backward()
    torch.testing.assert_close(mine.grad, ref.grad)


def test_an_fp64_model_folds_in_fp64():
    m = nn.Sequential(nn.Conv1d(4, 4, 3, groups=4), nn.BatchNorm1d(4), nn.SiLU()).eval().double()
    with torch.no_grad():
        m[1].running_var.uniform_(0.5, 2)
        m[1].running_mean.uniform_(-1, 1)
    opt = tunedb.optimize(copy.deepcopy(m), families="all")
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (opt(x) - m(x)).abs().max() < 1e-12  # fp32 folding left about 1e-7
