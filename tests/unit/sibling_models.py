"""Module classes for test_gemm_siblings.py, in a file of their own: optimize()'s rules read a
class's whole source file for attribute reads off other objects (fusion_source.outside_reads),
and the tests read `attn.k_proj` freely."""
from __future__ import annotations

import torch
from torch import nn


class Attn(nn.Module):
    """q/k/v and o; `q` narrower than d is one GPU's share of a tensor-parallel attention (few
    weight rows at a deep K: the groups the sibling K split serves)."""

    def __init__(self, d: int = 16, kv: int = 8, bias: bool = False, q: int | None = None) -> None:
        super().__init__()
        q = q or d
        self.q_proj = nn.Linear(d, q, bias=bias)
        self.k_proj = nn.Linear(d, kv, bias=bias)
        self.v_proj = nn.Linear(d, kv, bias=bias)
        self.o_proj = nn.Linear(q, d, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        return self.o_proj(q * (k.sum(-1, keepdim=True) + v.sum(-1, keepdim=True)))


class Cross(nn.Module):
    def forward(self, h, kv=None):
        q = self.q_proj(h)
        if kv is None:
            kv = h
        k = self.k_proj(kv)
        v = self.v_proj(kv)
        return q, k, v


class Rebound(nn.Module):
    def forward(self, h):
        a = self.a(h)
        h = h + 1
        return a + self.b(h)


class Conditional(nn.Module):
    def forward(self, h, c):
        a = self.a(h)
        b = self.b(h) if c else self.c(h)
        return a, b


class CalledTwice(nn.Module):
    def forward(self, h):
        return self.a(h) + self.b(h)

    def other(self, h):
        return self.a(h)


class Block(nn.Module):
    def forward(self, h):
        x = self.a(h)
        for _ in range(2):
            pass
        return x + self.b(h)


class OneExpr(nn.Module):
    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class InPlaceBetween(nn.Module):
    def forward(self, h):
        a = self.a(h)
        h.mul_(2)
        return a + self.b(h)


class Aliased(nn.Module):
    def forward(self, h):
        a = self.a(h)
        g = h
        return a, self.b(h), g


class ShapeRead(nn.Module):
    def forward(self, h):
        shape = h.shape[:-1]
        a = self.a(h).view(*shape, -1)
        b = self.b(h).view(*shape, -1)
        return a, b

