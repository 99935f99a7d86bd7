"""A small model whose attention is written as matmuls between two Linears (the products the
bmm family's product mode serves), shared by the CPU and GPU optimize() tests."""
from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    """Eager attention written as matmuls, between two Linears."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
