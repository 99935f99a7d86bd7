"""Models whose own code reaches a fused Linear from outside the pair's parent, and a parent
whose forward breaks Dynamo's graph between the pair (test_fusion_callers_s53.py). In a file of
their own: fusion rule 2 reads a class's whole source file."""
import operator

import fusion_helpers_s53
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


class TapByGetter(nn.Module):
    """An outer module reads the block's Linear through operator.attrgetter (a graph break)."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.tap = operator.attrgetter("block.fc")

    def forward(self, x):
        return self.block(x) + self.tap(self)(x)


class TapByHelper(nn.Module):
    """An outer module hands the block to a helper in another file, which calls its Linear."""

    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) + fusion_helpers_s53.raw(self.block, x)


class BrokenBlock(nn.Module):
    """The pair's parent breaks Dynamo's graph before the pair: both run in the resume function."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        x = x * 2
        torch._dynamo.graph_break()
        h = self.fc(x)
        h = self.act(h)
        return h


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), BrokenBlock()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x
