"""A decoder layer as one GPU of a tensor-parallel group holds it (Megatron-style column and row
shards): Llama-3-8B's widths over `tp` GPUs, q/k/v and gate/up column-sharded, o and down
row-sharded (the all-reduce left out: one GPU's GEMMs are what tunedb serves). In a file of its own
that imports only torch, as a user's model file would (optimize()'s bmm hook reads a model's
source files for products)."""
from __future__ import annotations

import torch
from torch import nn
from unseen_decoder import Mlp  # gate, up, down: a SiLU-gated MLP (imports only torch too)

WIDTH, FFN, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128


class ShardBlock(nn.Module):
    def __init__(self, tp: int) -> None:
        super().__init__()
        self.heads, self.kv = HEADS // tp, max(1, KV_HEADS // tp)
        self.q_proj = nn.Linear(WIDTH, self.heads * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(WIDTH, self.kv * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(WIDTH, self.kv * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(self.heads * HEAD_DIM, WIDTH, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(WIDTH), nn.RMSNorm(WIDTH)
        self.mlp = Mlp(WIDTH, FFN // tp)

    def forward(self, x):
        b, t, _ = x.shape
        y = self.norm1(x)
        q = self.q_proj(y).view(b, t, self.heads, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(y).view(b, t, self.kv, HEAD_DIM).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        v = self.v_proj(y).view(b, t, self.kv, HEAD_DIM).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, self.heads * HEAD_DIM))
        return x + self.mlp(self.norm2(x))


def build(layers: int, tp: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[ShardBlock(tp) for _ in range(layers)])
    for p in model.parameters():
        p.data.mul_(0.5)
    return model.to("cuda", torch.bfloat16).eval()
