"""Models for test_runtime_patching.py's reached-children rules, in a file of their own
(optimize()'s rules read each model class's whole source file for attribute reads off other
objects, and a test's own `tuned.head[3]` would count as one)."""
import torch
from torch import nn


class ReachesIntoItsSequential(nn.Module):
    """Keeps the logits beside the log-probabilities by running a head's children one by one,
    reached through a method of the Sequential (children(), get_submodule, _modules)."""

    def __init__(self, d=32, how="children"):
        super().__init__()
        self.how = how
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 8), nn.LogSoftmax(-1))

    def forward(self, x):
        if self.how == "children":
            layers = list(self.head.children())
        elif self.how == "get_submodule":
            layers = [self.head.get_submodule(str(i)) for i in range(4)]
        else:
            layers = list(self.head._modules.values())
        outs = []
        for layer in layers:
            x = layer(x)
            outs.append(x)
        return torch.cat(outs, -1)


class WalkedBlock(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


class WalksABlocksChildren(nn.Module):
    """A block whose own code fuses (rule 2) but whose children its holder runs one by one."""

    def __init__(self, d=32):
        super().__init__()
        self.block = WalkedBlock(d)

    def forward(self, x):
        pre = None
        for layer in self.block.children():
            x = layer(x)
            pre = x if pre is None else pre
        return torch.cat([x, pre], -1)


class FusedMLP(nn.Module):
    """fc1 and act fuse (rule 2); the tests do surgery on it through setattr and _modules."""

    def __init__(self, d=16):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class LoraLike(nn.Module):
    """A wrapper set in a Linear's slot after optimize(), as PEFT's LoRA layers are: it calls the
    module it wraps and adds a low-rank term."""

    def __init__(self, base, d_in, d_out, r=2):
        super().__init__()
        self.base = base
        self.a = nn.Linear(d_in, r, bias=False)
        self.b = nn.Linear(r, d_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


class EveryFamily(nn.Module):
    """A conv2d front end, a conv1d + norm + activation, an LSTM and a log-softmax head."""

    def __init__(self):
        super().__init__()
        self.c2 = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.ReLU())
        self.c1 = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4), nn.SiLU())
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8, 10), nn.LogSoftmax(-1))

    def forward(self, x):
        h = self.c1(self.c2(x).mean(-1))
        h, _ = self.lstm(h.transpose(1, 2))
        return self.head(self.ff(h))


class InitsWithModules(nn.Module):
    """Initialises its block through modules() (a recursive walk, not a forward's): still fuses."""

    def __init__(self, d=32):
        super().__init__()
        self.mlp = WalkedBlock(d)
        self.register_module("spare", None)  # a slot holding no module
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x):
        return self.mlp(x)
