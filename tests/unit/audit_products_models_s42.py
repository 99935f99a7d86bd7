"""Models for the s42 audit of the bmm, gemm_log_softmax and group_gemm families as optimize()
applies them (tests/unit/test_audit_s42_products.py). Kept in their own file, importing only
torch: optimize() reads each model class's source file (bmm's product scan)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Head(nn.Module):
    """A CTC-style head: nn.Sequential(Linear, LogSoftmax(dim)) called whole."""

    def __init__(self, k=16, n=33, dim=-1, bias=True):
        super().__init__()
        self.enc = nn.Linear(k, k)
        self.head = nn.Sequential(nn.Linear(k, n, bias=bias), nn.LogSoftmax(dim=dim))

    def forward(self, x):
        return self.head(torch.relu(self.enc(x)))


class OnlyHead(nn.Module):
    """The head alone: its input is the caller's tensor (bad inputs reach the fused module)."""

    def __init__(self, k=16, n=33):
        super().__init__()
        self.head = nn.Sequential(nn.Linear(k, n), nn.LogSoftmax(dim=-1))

    def forward(self, x):
        return self.head(x)


class CodeHead(nn.Module):
    """Linear then log_softmax written in forward: F / torch / Tensor method / nn module,
    optionally with a temperature and a dtype argument."""

    def __init__(self, how="F", dim=-1, temp=None, dtype=None):
        super().__init__()
        self.proj = nn.Linear(16, 33)
        self.lsm = nn.LogSoftmax(dim=dim)
        self.how, self.dim, self.temp, self.dtype = how, dim, temp, dtype

    def forward(self, x):
        y = self.proj(x)
        if self.temp is not None:
            y = y / self.temp
        if self.how == "F":
            return F.log_softmax(y, dim=self.dim, dtype=self.dtype)
        if self.how == "torch":
            return torch.log_softmax(y, self.dim, dtype=self.dtype)
        if self.how == "method":
            return y.log_softmax(self.dim, dtype=self.dtype)
        return self.lsm(y)


class Attention(nn.Module):
    """Eager attention whose products are written four ways."""

    def __init__(self, d=16, h=2, how="matmul"):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.h, self.how = h, how

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, -1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        if self.how == "matmul":
            p = (torch.matmul(q, k.transpose(-1, -2)) / (d // self.h) ** 0.5).softmax(-1)
            y = torch.matmul(p, v)
        elif self.how == "at":
            y = (q @ k.mT).softmax(-1) @ v
        elif self.how == "einsum":
            s = torch.einsum("bhqd,bhkd->bhqk", q, k)
            y = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)
        else:  # baddbmm / bmm on folded heads
            q3, k3, v3 = (z.reshape(b * self.h, t, -1) for z in (q, k, v))
            s = torch.baddbmm(torch.zeros(b * self.h, t, t, dtype=x.dtype), q3, k3.mT, alpha=0.5)
            y = torch.bmm(s.softmax(-1), v3).view(b, self.h, t, -1)
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class OddProducts(nn.Module):
    """Products torch broadcasts or types specially: batch broadcasting, 1-D operands, integer
    and complex tensors, a product under no_grad."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))
        self.v = nn.Parameter(torch.randn(8))
        self.m = nn.Parameter(torch.randn(1, 8, 8))

    def forward(self, x):
        y = x @ self.w                                  # [B, T, 16] @ [16, 8]
        z = torch.matmul(y, self.v)                     # 1-D right operand
        u = torch.matmul(self.v, y.mT)                  # 1-D left operand
        g = y @ self.m                                  # broadcast batch
        with torch.no_grad():
            gram = torch.bmm(y.detach().mT, y.detach())
        idx = torch.arange(6).view(2, 3) @ torch.arange(3).view(3, 1)
        c = torch.complex(y, y) @ torch.complex(self.m, self.m)
        return z, u, g, gram, idx, c


class TinyMHA(nn.Module):
    def __init__(self, d=16, h=2):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.mha = nn.MultiheadAttention(d, h, batch_first=True)

    def forward(self, x):
        x = self.inp(x)
        return self.mha(x, x, x, need_weights=False)[0]


class TinyEncoder(nn.Module):
    def __init__(self, d=16, h=2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, h, dim_feedforward=32, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(d, 11), nn.LogSoftmax(dim=-1))

    def forward(self, x):
        return self.head(self.enc(x))


class Expert(nn.Module):
    def __init__(self, h, i, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class UserMoE(nn.Module):
    """A Mixtral / Qwen-MoE style block written by a user: router, topk, a loop over experts,
    index_add_; optional expert biases and a gated shared expert."""

    def __init__(self, h=16, i=24, e=4, k=2, bias=False, shared=False):
        super().__init__()
        self.top_k, self.num_experts = k, e
        self.gate = nn.Linear(h, e, bias=False)
        self.experts = nn.ModuleList([Expert(h, i, bias) for _ in range(e)])
        self.shared_expert = Expert(h, i, bias) if shared else None
        self.shared_expert_gate = nn.Linear(h, 1, bias=False) if shared else None

    def forward(self, hidden_states):
        b, t, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        logits = self.gate(x)
        w = F.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(w, self.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros((b * t, h), dtype=x.dtype, device=x.device)
        mask = F.one_hot(sel, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(mask[e])
            y = self.experts[e](x[top_x]) * w[top_x, idx, None]
            out.index_add_(0, top_x, y.to(x.dtype))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.view(b, t, h), logits
