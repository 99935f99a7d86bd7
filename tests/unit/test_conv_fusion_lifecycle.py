"""The Conv1d + BatchNorm1d + activation fusion after optimize(): module surgery un-fuses (each
module then runs as written), the fold cache ends where parameters or statistics move without a
version bump (a training-mode forward, a fused optimizer step), a deep copy of the conv alone
is unfused while a copy of the model stays fused, and a padding mode set later is honoured."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from tunedb.families.conv import ops, patching


def _pair(act=nn.SiLU):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4), act(), nn.Conv1d(4, 2, 1))
    with torch.no_grad():  # statistics and affine terms far from the identity
        plain[1].running_mean.uniform_(-1, 1)
        plain[1].running_var.uniform_(0.5, 2)
        plain[1].weight.uniform_(0.5, 2)
        plain[1].bias.uniform_(-1, 1)
    opt = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert "_tunedb_fusion" in opt[0].__dict__
    return plain.eval(), opt.eval()


def _served(model, x):
    """What the CUDA fp16/bf16 branch computes (the fold, then one conv with the activation)."""
    conv = model[0]
    fusion = conv.__dict__["_tunedb_fusion"]
    w, b = patching._folded(conv, fusion.bn, fusion)
    y = ops.conv1d(x, w, b, conv.stride, conv.padding, conv.dilation, conv.groups, conv.tunedb_act)
    return model[3](y)


@pytest.mark.parametrize("surgery", ["sync batch norm", "norm slot to Identity", "activation replaced",
                                     "new norm, train()"])
def test_module_surgery_after_optimize_runs_every_module_as_written(surgery):
    plain, opt = _pair()
    x = torch.randn(2, 4, 9)
    for model in (plain, opt):
        if surgery == "sync batch norm":
            converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            assert converted is model
        elif surgery == "norm slot to Identity":
            model[1] = nn.Identity()
        elif surgery == "activation replaced":
            model[2] = nn.ReLU()
        else:
            model[1] = nn.BatchNorm1d(4)
            model.train()
    if surgery == "sync batch norm":  # SyncBatchNorm needs a process group to run: its class is enough
        assert type(opt[1]) is nn.SyncBatchNorm and patching._fusion(opt[0]) is None
        assert patching._fusion(opt[2]) is None
        return
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x), rtol=1e-5, atol=1e-6)


def test_a_conv_copied_alone_is_unfused_and_a_copied_model_stays_fused():
    plain, opt = _pair()
    x = torch.randn(2, 4, 9)
    alone = copy.deepcopy(opt[0])  # torch.nn.utils.fusion.fuse_conv_bn_eval copies the conv this way
    assert patching._fusion(alone) is None
    torch.testing.assert_close(alone(x), plain[0](x))  # the conv's own output, no hidden norm
    again = copy.deepcopy(opt)
    fusion = patching._fusion(again[0])
    assert fusion is not None and fusion.seq is again and fusion.bn is again[1]
    with torch.no_grad():
        torch.testing.assert_close(again(x), plain(x), rtol=1e-5, atol=1e-6)


def test_the_fold_follows_running_statistics_updated_in_training_mode():
    plain, opt = _pair()
    x = torch.randn(2, 4, 9)
    with torch.no_grad():
        torch.testing.assert_close(_served(opt, x), plain(x), rtol=1e-5, atol=1e-5)  # cached now
        shifted = torch.randn(64, 4, 9) * 3 + 2
        opt.train(), plain.train()
        opt(shifted), plain(shifted)  # running statistics move in place, versions unchanged
        opt.eval(), plain.eval()
        torch.testing.assert_close(_served(opt, x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_the_fold_follows_an_optimizer_step(fused):
    plain, opt = _pair()
    x = torch.randn(2, 4, 9)
    with torch.no_grad():
        _served(opt, x)  # cached
    kwargs = {"fused": True} if fused else {}
    try:
        step = torch.optim.AdamW(opt.parameters(), lr=0.1, **kwargs)
    except (RuntimeError, ValueError) as exc:  # a torch without the fused CPU AdamW
        pytest.skip(f"no fused AdamW here: {exc}")
    opt(x).square().sum().backward()
    step.step()  # the fused step writes the parameters without a version bump
    plain.load_state_dict(opt.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(_served(opt, x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("conv", [nn.Conv1d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 3, padding=1)])
def test_a_padding_mode_set_after_optimize_is_honoured(conv):
    torch.manual_seed(0)
    plain = nn.Sequential(conv)
    opt = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(opt[0]).__name__.startswith("Tuned")
    for model in (plain, opt):
        model[0].padding_mode = "reflect"
    x = torch.randn(2, 3, 9) if isinstance(conv, nn.Conv1d) else torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(opt(x), plain(x))


@pytest.mark.parametrize("drop", ["both", "track_running_stats"])
def test_statistics_dropped_after_optimize_unfuse(drop):
    """Test-time adaptation sets a BN's running statistics to None (eval then normalises with the
    batch's): the fusion, which folds them into the conv, no longer holds (the GPU path read None)."""
    plain, opt = _pair()
    fusion = opt[0].__dict__["_tunedb_fusion"]
    assert fusion.intact()
    for model in (plain, opt):
        if drop == "both":
            model[1].running_mean = model[1].running_var = None
        else:
            model[1].track_running_stats = False
    assert not fusion.intact()
    x = torch.randn(2, 4, 9)
    with torch.no_grad():
        assert torch.equal(opt(x), plain(x))
