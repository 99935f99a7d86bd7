"""optimize()'s fusions where a model reaches into what they fuse (a session 35 audit, CPU,
families='all', every unmeasured module swapped): a Sequential held by a ModuleList whose
children the model calls one by one, a conv Sequential walked layer by layer or of a subclass
with its own forward, a log-softmax head whose logits the model takes, a Linear shared with
another path; and a folded Conv1d + BatchNorm1d + act that no kernel serves (CPU) computed as
written. Each optimized model's outputs must be the plain model's, bit for bit."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from tunedb import settings

from fusion_models_s35 import (ConvFeatures, ConvInOwnSequential, InModuleList, LogitsWanted,  # noqa: E402
                               SharedProjection)


def _outputs(model, x):
    with torch.no_grad():
        y = model(x)
    return list(y) if isinstance(y, (tuple, list)) else [y]


@pytest.mark.parametrize("make, shape", [(InModuleList, (2, 8)), (ConvFeatures, (1, 3, 8, 8)),
                                         (ConvInOwnSequential, (1, 3, 8, 8)), (LogitsWanted, (2, 8)),
                                         (SharedProjection, (2, 8))])
def test_a_model_reaching_into_a_fusable_pair_gets_its_own_outputs(make, shape):
    torch.manual_seed(0)
    plain = make().eval()
    x = torch.randn(*shape)
    with settings.override(LEAVE_UNMEASURED="0", USER_DB="off"):
        tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    for a, b in zip(_outputs(plain, x), _outputs(tuned, x)):
        assert torch.equal(a, b)


def test_a_shared_projection_stays_one_module():
    with settings.override(LEAVE_UNMEASURED="0", USER_DB="off"):
        tuned = tunedb.optimize(SharedProjection(), families="all")
    assert tuned.ctc[0] is tuned.proj


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_folded_conv_norm_act_no_kernel_serves_runs_as_written(dtype):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv1d(8, 8, 31, padding=15, groups=8), nn.BatchNorm1d(8), nn.SiLU()).eval()
    with torch.no_grad():
        plain[1].running_mean.normal_()
        plain[1].running_var.uniform_(0.5, 2.0)
    plain = plain.to(dtype)
    with settings.override(USER_DB="off"):
        tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned[1]).__name__ == "AbsorbedBatchNorm1d"  # fused: on a GPU the fold serves
    x = torch.randn(2, 8, 40, dtype=dtype)
    assert torch.equal(_outputs(plain, x)[0], _outputs(tuned, x)[0])
    with pytest.raises(Exception):
        _outputs(tuned, torch.randn(8, 40, dtype=dtype))  # unbatched: BatchNorm1d's own refusal stays


def test_a_fused_head_keeps_the_linears_sizes_and_mode():
    with settings.override(USER_DB="off"):
        tuned = tunedb.optimize(nn.Sequential(nn.Linear(8, 10), nn.LogSoftmax(-1)).eval(), families="all")
    assert type(tuned[0]).__name__ == "TunedLinearLogSoftmax"
    assert (tuned[0].in_features, tuned[0].out_features) == (8, 10)
    assert not tuned[0].training and not tuned[1].training
