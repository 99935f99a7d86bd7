"""Session 41 audit: what a user does with an optimize()d model that changed what it computes.

- Code that walks the model's modules after optimize() (swap every nn.GELU / nn.ReLU for another
  module, hook every activation) met a fused activation as the slot's child `activation`: the
  fusion held, so the swap was ignored and the hooks never fired (fused_pair.FusedPair).
- The gemm_log_softmax head (families="all") blanked its LogSoftmax with a plain nn.Identity:
  module surgery after optimize() (a new Linear, a Softmax in the LogSoftmax's slot) or a walk
  looking for the LogSoftmax got the wrong result; it is now a fused pair as the GEMM's are.
- The tuned GEMM's backward summed the bias gradient in another order than F.linear where the
  input is non-contiguous (x.transpose(0, 1)), and its x gradient under vmap (a vectorized
  jacobian) too: CPU gradients were not bitwise the plain model's (ops_autograd._backward).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from audit_models_s41 import ConvStem, CtcHead, GeluMLP, SeqFirstProjection, SequentialMLP, TinyAttention

pytestmark = pytest.mark.usefixtures("swap_unmeasured")

_INPUTS = {GeluMLP: (3, 16), SequentialMLP: (3, 16), ConvStem: (2, 2, 7, 7), CtcHead: (3, 16)}


def _pair(cls, families="all"):
    torch.manual_seed(0)
    plain = cls().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families=families)
    return plain, tuned


def _fused(cls, tuned):
    """The model's fusion took place (what the tests below then undo)."""
    kinds = {type(m).__name__ for m in tuned.modules()}
    assert "FusedActivation" in kinds, kinds


def _swap_all(module, old, new):
    """What a user's activation swap does: every child of type `old`, found by walking the tree."""
    for name, child in module.named_children():
        if isinstance(child, old):
            setattr(module, name, new())
        else:
            _swap_all(child, old, new)


def _same(plain, tuned, x):
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), plain(x), rtol=0, atol=0)


@pytest.mark.parametrize("cls, old", [(GeluMLP, nn.GELU), (SequentialMLP, nn.ReLU), (ConvStem, nn.ReLU),
                                      (ConvStem, nn.SiLU), (CtcHead, nn.LogSoftmax)])
def test_activations_swapped_by_a_walk_of_the_model_give_the_plain_result(cls, old):
    plain, tuned = _pair(cls)
    _fused(cls, tuned)
    for model in (plain, tuned):
        _swap_all(model, old, nn.Tanh)
    _same(plain, tuned, torch.randn(*_INPUTS[cls]))


@pytest.mark.parametrize("cls, kind", [(GeluMLP, nn.GELU), (ConvStem, nn.ReLU), (CtcHead, nn.LogSoftmax)])
def test_hooks_on_the_activations_a_walk_finds_fire_as_on_the_plain_model(cls, kind):
    plain, tuned = _pair(cls)
    x = torch.randn(*_INPUTS[cls])
    seen = {"plain": [], "tuned": []}
    for name, model in (("plain", plain), ("tuned", tuned)):
        for module in model.modules():
            if isinstance(module, kind):
                module.register_forward_hook(lambda m, i, o, name=name: seen[name].append(o.clone()))
    _same(plain, tuned, x)
    assert len(seen["tuned"]) == len(seen["plain"]) == 1
    torch.testing.assert_close(seen["tuned"][0], seen["plain"][0], rtol=0, atol=0)


@pytest.mark.parametrize("surgery", ["new linear", "softmax in the log-softmax slot", "log-softmax removed"])
def test_module_surgery_on_a_log_softmax_head_gives_the_plain_result(surgery):
    plain, tuned = _pair(CtcHead)
    assert type(tuned._modules["ctc_head"]._modules["1"]).__name__ == "TunedLinearLogSoftmax"
    for model in (plain, tuned):
        slots = model._modules["ctc_head"]._modules
        torch.manual_seed(1)
        if surgery == "new linear":
            slots["1"] = nn.Linear(16, 11)
        elif surgery == "softmax in the log-softmax slot":
            slots["2"] = nn.Softmax(dim=-1)
        else:
            slots["2"] = nn.Identity()
    _same(plain, tuned, torch.randn(3, 16))


def _grads(model, x, out_grad):
    x = x.detach().as_strided(x.shape, x.stride()).requires_grad_()
    model(x).backward(out_grad)
    return [x.grad] + [p.grad for p in model.parameters()]


def test_gradients_of_a_non_contiguous_input_are_the_plain_ones():
    plain, tuned = _pair(SeqFirstProjection, families=None)
    assert type(tuned._modules["proj"]).__name__ == "TunedLinear"
    torch.manual_seed(1)
    x = torch.randn(14, 5, 384)  # sequence first: the projection sees x.transpose(0, 1)
    out_grad = torch.randn(14, 5, 320)
    for got, want in zip(_grads(tuned, x, out_grad), _grads(plain, x, out_grad)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_vectorized_jacobian_is_the_plain_ones():
    plain, tuned = _pair(TinyAttention, families=None)
    assert type(tuned._modules["q"]).__name__ == "TunedLinear"
    x = torch.randn(2, 16)
    want = torch.autograd.functional.jacobian(plain, x, vectorize=True)
    got = torch.autograd.functional.jacobian(tuned, x, vectorize=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_head_unfused_by_surgery_stays_so_through_copies_and_a_fused_one_stays_fused():
    plain, tuned = _pair(CtcHead)
    x = torch.randn(3, 16)
    copied = copy.deepcopy(tuned)  # fused: its copy too
    assert copied._modules["ctc_head"]._modules["1"].__dict__["_tunedb_fused"].intact()
    _same(plain, copied, x)
    for model in (plain, tuned):
        _swap_all(model, nn.LogSoftmax, nn.Tanh)
    for model in (copy.deepcopy(tuned), tuned):
        _same(plain, model, x)


def test_a_pair_pickled_before_s41_still_sees_an_activation_swapped_after_loading(monkeypatch):
    import pickle

    from tunedb.families.gemm import fused_pair

    plain, tuned = _pair(GeluMLP)
    new_state = fused_pair.FusedPair.__getstate__

    def old_state(self):  # what FusedPair pickled before it named the activation
        state = new_state(self)
        return {**state, "refs": state["refs"][:3]}

    monkeypatch.setattr(fused_pair.FusedPair, "__getstate__", old_state)
    loaded = pickle.loads(pickle.dumps(tuned))
    monkeypatch.undo()
    for model in (plain, loaded):
        _swap_all(model, nn.GELU, nn.Tanh)  # before the loaded model's first call
    _same(plain, loaded, torch.randn(3, 16))
