"""Session 43 audit: changes a user makes to a model after optimize().

- The same fused Linear (or its activation's slot) set into a second place of the model after
  optimize() (`model.tap = model.fc1`) kept its fusion: called from there, the Linear returned
  GELU(x W^T + b) and the slot passed its input through, where the plain model's modules give
  x W^T + b and the activation (fused_pair: a fused module registered in any slot other than its
  own ends the fusion, as module surgery does); likewise the conv family's Conv2d + activation and
  Conv1d + BatchNorm1d + activation (conv/patching.py _Fusion).
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import tunedb
from audit_models_s43_after import TapMLP, tap_conv1d, tap_conv2d, tap_sequential

pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _pair(cls, fused="FusedActivation"):
    torch.manual_seed(0)
    plain = cls().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert fused in {type(m).__name__ for m in tuned.modules()}  # the fusion took place
    return plain, tuned


def _same(plain, tuned, x):
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("cls, share", [
    (TapMLP, lambda m: m.fc1),
    (TapMLP, lambda m: nn.Sequential(m.fc1, m.act)),
    (tap_sequential, lambda m: m.body[0]),
    (tap_sequential, lambda m: nn.Sequential(nn.Linear(16, 16), m.body[1])),
])
def test_a_fused_module_shared_into_a_second_place_gives_the_plain_result(cls, share):
    plain, tuned = _pair(cls)
    x = torch.randn(3, 16)
    for m in (plain, tuned):
        torch.manual_seed(1)
        m.tap = share(m)
    _same(plain, tuned, x)


@pytest.mark.parametrize("cls, fused, share, shape", [
    (tap_conv1d, "AbsorbedBatchNorm1d", lambda m: m.body[0], (2, 4, 9)),
    (tap_conv1d, "AbsorbedBatchNorm1d", lambda m: nn.Sequential(m.body[1], m.body[2]), (2, 4, 9)),
    (tap_conv2d, "FusedActivation", lambda m: m.body[0], (2, 4, 5, 5)),
])
def test_a_fused_conv_module_shared_into_a_second_place_gives_the_plain_result(cls, fused, share, shape):
    plain, tuned = _pair(cls, fused)
    x = torch.randn(*shape)
    for m in (plain, tuned):
        m.tap = share(m)
    _same(plain, tuned, x)


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_shared_fused_linear_stays_unfused_in_a_copy(copier):
    plain, tuned = _pair(TapMLP)
    plain.tap, tuned.tap = plain.fc1, tuned.fc1
    x = torch.randn(3, 16)
    _same(copier(plain), copier(tuned), x)


def test_the_fusion_holds_where_its_modules_stay_in_their_own_slots():
    plain, tuned = _pair(TapMLP)
    tuned.fc1 = tuned.fc1  # set again into its own slot
    tuned.tap = nn.Linear(16, 4)
    assert tuned.fc1.__dict__["_tunedb_fused"].intact()
    plain.tap = copy.deepcopy(tuned.tap)
    _same(plain, tuned, torch.randn(3, 16))
