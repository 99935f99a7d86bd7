"""Models for test_audit_s43_after_optimize.py, in a file of their own (optimize()'s rules read each
model class's whole source file)."""
import torch
from torch import nn


class TapMLP(nn.Module):
    """fc1 + GELU fuse (gemm rule 2); `tap`, None until the user sets it, is called on the input."""

    def __init__(self, d=16):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)
        self.tap = None

    def forward(self, x):
        y = self.fc2(self.act(self.fc1(x)))
        if self.tap is not None:
            y = y + self.tap(x).sum(-1, keepdim=True)
        return y


class TapSeq(nn.Module):
    """A Sequential whose modules fuse (the GEMM or the conv family's rules); `tap` as in TapMLP."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.tap = None

    def forward(self, x):
        y = self.body(x)
        if self.tap is not None:
            y = y + self.tap(x)
        return y


def tap_sequential(d=16):
    """Linear + ReLU fuse inside the Sequential (gemm rule 1)."""
    return TapSeq(nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)))


def tap_conv1d():
    """Conv1d + BatchNorm1d + ReLU fuse (the conv family, families="all")."""
    return TapSeq(nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU()))


def tap_conv2d():
    """Conv2d + SiLU fuse (the conv family, families="all")."""
    return TapSeq(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.SiLU()))
