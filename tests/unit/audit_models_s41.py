"""Models for test_audit_s41.py, in a file of their own (optimize()'s rules read each model class's
whole source file, and a test's own `model.head[2]` would count as a read of the head)."""
import torch
from torch import nn

from fusion_models_s40 import FusedMLP as GeluMLP  # noqa: F401  (fc1 and act fuse: gemm rule 2)


class SequentialMLP(nn.Module):
    """Linear + ReLU fuse inside the Sequential (gemm rule 1)."""

    def __init__(self, d=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return self.body(x)


class ConvStem(nn.Module):
    """Conv2d + ReLU and Conv2d + SiLU fuse inside the Sequential (the conv family, families="all")."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.SiLU())

    def forward(self, x):
        return self.features(x)


class CtcHead(nn.Module):
    """A Linear + LogSoftmax(dim=-1) head in a Sequential (gemm_log_softmax, families="all")."""

    def __init__(self, d=16, v=11):
        super().__init__()
        self.enc = nn.Linear(d, d)
        self.ctc_head = nn.Sequential(nn.Dropout(0.0), nn.Linear(d, v), nn.LogSoftmax(dim=-1))

    def forward(self, x):
        return self.ctc_head(self.enc(x))


class SeqFirstProjection(nn.Module):
    """A sequence-first model's projection of a batch-first view: the Linear meets a non-contiguous
    input, and its output's gradient comes back non-contiguous (transposed again)."""

    def __init__(self, k=384, n=320):
        super().__init__()
        self.proj = nn.Linear(k, n)

    def forward(self, x):
        return self.proj(x.transpose(0, 1)).transpose(0, 1)


class TinyAttention(nn.Module):
    """q, k, v and o, none fused: every projection runs the tuned op's own autograd."""

    def __init__(self, d=16):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x):
        q = self.q(x)
        k = self.k(x)
        v = self.v(x)
        return self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
