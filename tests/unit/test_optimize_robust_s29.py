"""tunedb.optimize() on models a user might give it (session 29 audit, CPU): a fusion must not
change a call the model makes elsewhere (a parent calling the child's activation, a forward set
on the instance); a Linear that a backward pre-hook or a state-dict hook watches, or that
carries a buffer, stays as it is (bare or inside a model); a swapped Linear keeps the user's plain
attributes and the model's eval flag; the conv + BatchNorm fold notices a replaced parameter."""
import copy
import sys

import pytest
import torch
from torch import nn

import tunedb

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from fusion_models_s29 import MLP, Block  # noqa: E402

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _same(model, x):
    model.eval()
    with torch.no_grad():
        ref = model(x)
        out = tunedb.optimize(model)(x)
    return torch.equal(ref, out)


def test_an_activation_called_from_another_module_is_not_fused_away():
    torch.manual_seed(0)
    m = Block()
    assert _same(m, torch.randn(4, 32))
    assert isinstance(m.mlp.act, nn.ReLU)


def test_a_forward_set_on_the_instance_is_not_fused():
    torch.manual_seed(0)
    m = MLP()
    m.forward = lambda x: m.fc(x) - 1.0  # the class's forward is not what runs
    assert _same(m, torch.randn(4, 32))
    assert isinstance(m.act, nn.ReLU)


def test_a_linear_with_a_backward_pre_hook_keeps_it():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    fired = []

    def hook(module, grad_output):
        fired.append("pre")
        return (torch.zeros_like(grad_output[0]),)
    m[1].register_full_backward_pre_hook(hook)
    tunedb.optimize(m)
    assert type(m[1]) is nn.Linear
    m(torch.randn(3, 8)).sum().backward()
    assert fired == ["pre"] and bool((m[0].weight.grad == 0).all())


def test_a_linear_with_more_state_keeps_it_and_its_checkpoint():
    lin = nn.Linear(8, 4)
    lin.register_buffer("scale", torch.ones(4))
    calls = []
    other = nn.Linear(8, 4)
    other.register_state_dict_post_hook(lambda *a: calls.append("sd"))
    m = nn.Sequential(lin, nn.ReLU(), nn.Linear(4, 8), other)
    keys = set(m.state_dict())
    tunedb.optimize(m)
    assert type(m[0]) is nn.Linear and type(m[3]) is nn.Linear
    assert set(m.state_dict()) == keys and calls
    fresh = nn.Sequential(copy.deepcopy(lin), nn.ReLU(), nn.Linear(4, 8), nn.Linear(8, 4))
    fresh.load_state_dict(m.state_dict(), strict=True)


def test_a_bare_hooked_linear_is_returned_unchanged():
    lin = nn.Linear(8, 4)
    fired = []
    lin.register_forward_hook(lambda *a: fired.append("fwd"))
    out = tunedb.optimize(lin)
    assert out is lin
    out(torch.randn(2, 8))
    assert fired == ["fwd"]


def test_a_swapped_linear_keeps_plain_attributes_and_the_eval_flag():
    m = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 32)).eval()
    m[0].tag = "encoder"
    tunedb.optimize(m)
    assert type(m[0]).__name__ == "TunedLinear" and m[0].tag == "encoder"
    assert isinstance(m[1], nn.Identity)  # fused
    assert not any(sub.training for sub in m.modules())


def test_the_conv_bn_fold_notices_a_replaced_weight():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU()).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned[0]).__name__.startswith("Tuned")
    x = torch.randn(2, 4, 12)
    with torch.no_grad():
        for step in range(40):
            for net in (plain, tuned):
                for k in range(2):  # the second replacement may land at the first one's freed address
                    net[0].weight = nn.Parameter(torch.full((4, 4, 3), float(step % 5 + k)))
            assert torch.allclose(plain(x), tuned(x), atol=1e-4), step
