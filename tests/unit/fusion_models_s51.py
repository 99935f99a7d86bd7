"""A block whose class forward a user patches after optimize() (test_fused_callers_s51.py): its own
file, since fusion rule 2 reads the whole source file of a block's class."""
from __future__ import annotations

from torch import nn


class PatchedLater(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))
