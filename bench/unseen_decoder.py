"""The decoder bench/unseen_model.py times: pre-norm blocks with grouped-query attention (biased
q/k/v), a SiLU-gated MLP, SDPA, widths no shipped table names. In a file of its own that imports
only torch, as a user's model file would: optimize()'s bmm hook reads a model's source files (and
the user modules they import) for products, and a bench helper's `@` must not count as the model's."""
from __future__ import annotations

import torch
from torch import nn

WIDTH, FFN, HEADS, KV_HEADS = 2560, 6912, 20, 4


class Mlp(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, d: int, f: int, heads: int, kv: int) -> None:
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv, d // heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, kv * self.hd)
        self.v = nn.Linear(d, kv * self.hd)
        self.o = nn.Linear(d, d, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.mlp = Mlp(d, f)

    def forward(self, x):
        b, t, d = x.shape
        y = self.norm1(x)
        q = self.q(y).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def build(layers: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(WIDTH, FFN, HEADS, KV_HEADS) for _ in range(layers)])
    for p in model.parameters():
        p.data.mul_(0.5)  # keep the residual stream's scale sane over random layers
    return model.to("cuda", torch.bfloat16).eval()
