"""optimize() on models written in ways its rules had not read (session 48's review): a layer
whose forward is replaced on the instance or that carries callables and tensors as plain
attributes, and code that runs a module's children one by one through `self.children()`, a
local name or a literal `get_submodule` / `_modules[...]`. Each must keep the plain model's
results, on the CPU bitwise, and its gradients."""
from __future__ import annotations

import copy
import types

import pytest
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


MLP = """
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))
"""

# Each model's source is a file of its own: the fusion rules read a class's whole source file
CASES = {
    # a class running its own children one by one: fc's own output is the first tap
    "taps": MLP + """

    def taps(self, x):
        outs = []
        for m in self.children():
            x = m(x)
            outs.append(x)
        return torch.stack(outs)


class Model(MLP):
    def forward(self, x):
        return super().forward(x) + self.taps(x).sum(0)
""",
    # a block's fc called alone through a local name
    "local": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([MLP(d), MLP(d)])

    def forward(self, x):
        y = 0
        for blk in self.blocks:
            y = y + blk(x) + blk.get_submodule("fc")(x)
        return y
""",
    # a literal path from self down into a child block
    "path": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = MLP(d)

    def forward(self, x):
        return self.mlp(x) + self.get_submodule("mlp.fc")(x)
""",
    # each layer's children run in a comprehension
    "comprehension": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.layers = nn.ModuleList([MLP(d)])

    def forward(self, x):
        return sum(m(x) for layer in self.layers for m in layer.children()) + self.layers[0](x)
""",
    # a layer fetched by name from named_modules() and run alone (a feature-probing API)
    "by_name": MLP + """

class Model(MLP):
    def feature(self, name, x):
        return dict(self.named_modules())[name](x)

    def forward(self, x):
        return super().forward(x) + self.feature("fc", x)
""",
    # a descendant fetched by its dotted name from a recursive walk of the holder and run alone
    "deep_name": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = MLP(d)

    def forward(self, x):
        return self.mlp(x) + dict(self.named_modules())["mlp.fc"](x)
""",
    # every module of a recursive walk run on a tensor it fits (a probing loop)
    "deep_loop": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = MLP(d)

    def forward(self, x):
        y = self.mlp(x)
        for name, m in self.named_modules():
            if name == "mlp.fc":
                y = y + m(x)
        return y
""",
    # a Sequential subclass that iterates itself, keeping each child's output
    "iterates": MLP + """

class Taps(nn.Sequential):
    def __init__(self, d=8):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        outs = []
        for m in self:
            x = m(x)
            outs.append(x)
        return outs[0] + self.act(self.fc(x))


class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.taps = Taps(d)

    def forward(self, x):
        return self.taps(x)
""",
    # the class's own walk, wrapped in enumerate, calling forward
    "enumerate": MLP + """

    def first(self, x):
        for i, m in enumerate(self.children()):
            return m.forward(x)


class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = MLP(d)

    def forward(self, x):
        return self.mlp(x) + self.mlp.first(x)
""",
    # a block's children handed to a lambda that runs them, and indexed out of a list
    "map": MLP + """

def run_each(block, x):
    return list(map(lambda m: m(x), block.children()))[0] + list(block.children())[0](x)


class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.blk = MLP(d)

    def forward(self, x):
        return self.blk(x) + run_each(self.blk, x)
""",
    # a look at the children (a count through a local name) runs none alone: the pair fuses
    "look": MLP + """

class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.mlp = MLP(d)
        m = self.mlp
        self.depth = len(list(m.children()))
        for sub in self.modules():  # an initialisation walk: a look, no module run
            if isinstance(sub, nn.Linear):
                nn.init.zeros_(sub.bias)
        self.names = [name for name, _ in self.named_modules()]

    def forward(self, x):
        return self.mlp(x)
""",
}


def _model(tmp_path, name):
    import importlib.util
    import sys

    path = tmp_path / f"unseen_s48_{name}.py"
    path.write_text(CASES[name])
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # where inspect finds the source, as for any imported model
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.Model().eval()


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


def _fused(model):
    return [name for name, m in model.named_modules() if isinstance(m, TunedLinear) and m.__dict__["act"] != "none"]


@pytest.mark.parametrize("name", ["taps", "local", "path", "comprehension", "iterates", "enumerate", "map", "by_name",
                                  "deep_name", "deep_loop"])
def test_children_run_one_by_one_are_not_fused(tmp_path, name):
    plain = _model(tmp_path, name)
    x = torch.randn(2, 8)
    tuned = _same(plain, x, families="all")
    assert not _fused(tuned)
    plain.train()
    tuned.train()
    plain(x).sum().backward()
    tuned(x).sum().backward()
    for a, b in zip(plain.parameters(), tuned.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_a_look_at_the_children_leaves_the_pair_fused(tmp_path):
    tuned = _same(_model(tmp_path, "look"), torch.randn(2, 8), families="all")
    assert _fused(tuned) == ["mlp.fc"]
