"""optimize() on models written in ways its rules had not read (session 48's review): a layer
whose forward is replaced on the instance or that carries callables and tensors as plain
attributes, and code that runs a module's children one by one through `self.children()`, a
local name or a literal `get_submodule` / `_modules[...]`. Each must keep the plain model's
results, on the CPU bitwise, and its gradients."""
from __future__ import annotations

import copy
import types

import torch
from torch import nn

import tunedb
from tunedb.families.gemm.patching import TunedLinear


class Attention(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


class MLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))

    def taps(self, x):
        """Every child's output in turn: fc's own output is the first."""
        outs = []
        for m in self.children():
            x = m(x)
            outs.append(x)
        return outs


class ByLocalName(nn.Module):
    """Calls a block's fc alone through a local name and a literal path."""

    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([MLP(d), MLP(d)])

    def forward(self, x):
        y = 0
        for blk in self.blocks:
            y = y + blk(x) + blk.get_submodule("fc")(x)
        return y


class PlainMLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


class ByModulesKey(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = PlainMLP(d)

    def forward(self, x):
        return self.mlp(x) + self.mlp._modules["fc"](x)


class WalksLayersChildren(nn.Module):
    """Runs each layer's children in a comprehension, as a feature-tap helper does."""

    def __init__(self, d=8):
        super().__init__()
        self.layers = nn.ModuleList([PlainMLP(d)])

    def forward(self, x):
        outs = [m(x) for layer in self.layers for m in layer.children()]
        return sum(outs) + self.layers[0](x)


def _same(plain, x, **kw):
    tuned = tunedb.optimize(copy.deepcopy(plain), **kw)
    with torch.no_grad():
        assert torch.equal(plain(x), tuned(x))
    return tuned


def test_a_linear_whose_forward_is_set_on_the_instance_is_left_as_written():
    plain = Attention().eval()
    plain.q.forward = types.MethodType(lambda self, x: nn.Linear.forward(self, x) * 0.5, plain.q)
    x = torch.randn(2, 3, 8)
    for kw in ({}, {"families": "all"}):
        tuned = _same(plain, x, **kw)
        assert type(tuned.q) is nn.Linear


def test_a_linear_carrying_a_callable_or_a_tensor_attribute_keeps_it():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.fc.post = torch.tanh
            self.fc.scale = torch.tensor(0.5)

        def forward(self, x):
            return self.fc.post(self.fc(x) * self.fc.scale)

    tuned = _same(Scaled(), torch.randn(2, 8), families="all")
    assert tuned.fc.post is torch.tanh and type(tuned.fc) is nn.Linear


def test_a_conv_whose_forward_is_set_on_the_instance_keeps_its_activation():
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    plain[0].forward = types.MethodType(lambda self, x: nn.Conv2d.forward(self, x) - 1.0, plain[0])
    tuned = _same(plain, torch.randn(1, 3, 6, 6), families="all")
    assert type(tuned[1]) is nn.ReLU


def test_a_class_running_its_own_children_one_by_one_is_not_fused():
    plain = MLP().eval()
    tuned = _same(plain, torch.randn(2, 8), families="all")
    with torch.no_grad():
        assert torch.equal(plain.taps(torch.ones(2, 8))[0], tuned.taps(torch.ones(2, 8))[0])
    assert tuned.fc.__dict__.get("act", "none") == "none"


def test_children_run_through_a_local_name_or_a_literal_path_are_not_fused():
    x = torch.randn(2, 8)
    for cls in (ByLocalName, ByModulesKey, WalksLayersChildren):
        torch.manual_seed(0)
        plain = cls().eval()
        tuned = _same(plain, x, families="all")
        assert not any(isinstance(m, TunedLinear) and m.__dict__["act"] != "none" for m in tuned.modules()), cls
        plain.train()
        tuned.train()
        plain(x).sum().backward()
        tuned(x).sum().backward()
        for a, b in zip(plain.parameters(), tuned.parameters()):
            assert torch.equal(a.grad, b.grad)

