"""Blocks whose forward also runs their Linear alone by a name the AST cannot read (a computed
getattr, __getattr__, a child bound from children() and then called): optimize()'s fusion rule 2
must not fuse them (test_fused_callers_s50.py). Each class in this file reads its own source."""
from __future__ import annotations

import torch.nn as nn


class TapBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.ReLU()
        self.taps = ["fc"]

    def forward(self, x):
        y = self.act(self.fc(x))
        for name in self.taps:
            y = y + getattr(self, name)(x)
        return y


class DunderBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.GELU()
        self.tap = "fc"

    def forward(self, x):
        return self.act(self.fc(x)) + self.__getattr__(self.tap)(x)


class FirstChildBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.ReLU()

    def forward(self, x):
        y = self.act(self.fc(x))
        first = next(iter(self.children()))
        return y + first(x)

