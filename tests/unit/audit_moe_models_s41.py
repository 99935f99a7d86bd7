"""MoE variants for the s41 MoE / grouped-GEMM audit (tests/unit/test_audit_moe_s41.py). Kept in
their own file: optimize() reads each model class's source file (bmm's product scan)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FusedMoE(nn.Module):
    """A user's MoE written as ONE module: router, top-k and stacked experts named as transformers
    names them (gate_up_proj [E, 2I, H], down_proj [E, H, I], act_fn), forward(x) only."""

    def __init__(self, h=16, i=24, e=4, k=2):
        super().__init__()
        self.top_k = k
        self.router = nn.Linear(h, e, bias=False)
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.2)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = self.router(x).float().softmax(-1)
        w, idx = probs.topk(self.top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        for e in range(self.gate_up_proj.shape[0]):
            tok, pos = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            g, u = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act_fn(g) * u, self.down_proj[e]) * w[tok, pos, None]
            out.index_add_(0, tok, y)
        return out.reshape(shape)


class UpGateExperts(nn.Module):
    """transformers' experts interface (hidden, top_k_index, top_k_weights), but the stacked
    projection holds the UP rows first, then the gate rows (act on the second half)."""

    def __init__(self, h=16, i=24, e=4):
        super().__init__()
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.2)
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def expert(e, h):
            up, gate = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
            return F.linear(self.act_fn(gate) * up, self.down_proj[e])
        return _routed(hidden_states, top_k_index, top_k_weights, self.num_experts, expert)


class BiasedExperts(nn.Module):
    """transformers' layout and interface plus per-expert biases (no has_bias attribute)."""

    def __init__(self, h=16, i=24, e=4):
        super().__init__()
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.2)
        self.gate_up_proj_bias = nn.Parameter(torch.randn(e, 2 * i) * 0.5)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.2)
        self.down_proj_bias = nn.Parameter(torch.randn(e, h) * 0.5)
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def expert(e, h):
            g, u = F.linear(h, self.gate_up_proj[e], self.gate_up_proj_bias[e]).chunk(2, dim=-1)
            return F.linear(self.act_fn(g) * u, self.down_proj[e], self.down_proj_bias[e])
        return _routed(hidden_states, top_k_index, top_k_weights, self.num_experts, expert)


class Block(nn.Module):
    """A router + experts block around any experts module of transformers' interface.
    mode: 'mixtral' (softmax, top-k, renormalise), 'deepseek' (top-k of logits, softmax over
    them, times a routed scaling factor, plus a shared expert)."""

    def __init__(self, experts, h=16, e=4, k=2, mode="mixtral", scale=2.5):
        super().__init__()
        self.top_k = k
        self.mode = mode
        self.scale = scale
        self.gate = nn.Linear(h, e, bias=False)
        self.experts = experts
        self.shared = nn.Linear(h, h) if mode == "deepseek" else None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.gate(x).float()
        if self.mode == "mixtral":
            w, idx = logits.softmax(-1).topk(self.top_k, dim=-1)
            w = w / w.sum(-1, keepdim=True)
        else:
            top, idx = logits.topk(self.top_k, dim=-1)
            w = top.softmax(-1) * self.scale
        y = self.experts(x, idx, w.to(x.dtype))
        if self.shared is not None:
            y = y + self.shared(x)
        return y.reshape(shape)


def _routed(hidden_states, top_k_index, top_k_weights, num_experts, expert):
    """transformers' experts loop: each expert's tokens through `expert(e, h)`, weighted, summed."""
    out = torch.zeros_like(hidden_states)
    for e in range(num_experts):
        tok, pos = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        y = expert(e, hidden_states[tok]) * top_k_weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out
