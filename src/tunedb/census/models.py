"""Mirror modules: small, faithful stand-ins for the preset architectures (an inherently torch module).

Each mirror has the same Linear shapes, in the same order, as the implementation it mirrors, so a
census never needs the hub, transformers or torchaudio. Parts that change no GEMM shape are kept
simple (no rotary embedding, no dropout, no padding masks); attention is written out as matmuls,
as the "eager" attention of transformers is, so the census sees its products as op=bmm.

- WhisperEncoderMirror: transformers' WhisperEncoder (conv1/conv2 front end, q/k/v/out
  projections, k without bias, fc1/fc2).
- LlamaMirror: transformers' LlamaForCausalLM (separate q/k/v/o projections, grouped KV heads,
  gate/up/down MLP, untied LM head). Like generation, a forward computes the LM head for the last
  ``logits_to_keep`` positions only. No KV cache: a decode step is a forward of one token per
  sequence, which gives every Linear its decode shape (M = batch).
- ConformerMirror: torchaudio.models.Conformer (half-step FFNs, nn.MultiheadAttention with a
  packed in-projection, a depthwise convolution module) behind a Conv2d subsampling front end
  (two stride-2 3x3 convs, then Linear(channels * freq', d_model)).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eager attention on (B, H, T, D) tensors: two matmuls around a softmax."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.matmul(scores.softmax(dim=-1), v)


class _WhisperLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        # a module, as in Hugging Face's layer (activation_fn(fc1(x))): tunedb.optimize fuses it
        # into fc1, so the mirror's census keys are the real model's (gemm_act act=gelu)
        self.activation_fn = nn.GELU()
        self.fc2 = nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.self_attn_layer_norm(x)

        def split(y: torch.Tensor) -> torch.Tensor:
            # contiguous heads, as transformers' WhisperAttention: q @ k^T then reads k^T in place
            # (the bmm family keys that layout, lay=nt)
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2).contiguous()

        a = _attend(split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h)))
        x = x + self.out_proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.activation_fn(self.fc1(self.final_layer_norm(x))))


class WhisperEncoderMirror(nn.Module):
    """Input (B, n_mels, 3000) log-mel frames; output (B, 1500, d_model)."""

    def __init__(self, d_model: int, layers: int, heads: int, ffn: int, n_mels: int,
                 positions: int = 1500) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_model, d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(positions, d_model)
        self.layers = nn.ModuleList(_WhisperLayer(d_model, heads, ffn) for _ in range(layers))
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(features)))).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class _RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _LlamaLayer(nn.Module):
    def __init__(self, d: int, ffn: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.input_layernorm = _RMSNorm(d)
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)
        self.post_attention_layernorm = _RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)
        # a module, as the library's LlamaMLP.act_fn is, so optimize() fuses it into gate_proj
        # in both (the speculative plan takes the mirror's census for the library's)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        a = _attend(q, k, v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(self.act_fn(self.gate_proj(h)) * self.up_proj(h))


class LlamaMirror(nn.Module):
    """Input token ids (B, T); output logits (B, logits_to_keep, vocab)."""

    def __init__(self, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
                 vocab: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(_LlamaLayer(hidden, intermediate, heads, kv_heads) for _ in range(layers))
        self.norm = _RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 1) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x)[:, -logits_to_keep:])


class ConvSubsampling(nn.Module):
    """(B, T, n_mels) -> (B, T', d_model), T' = ((T - 1) // 2 - 1) // 2."""

    def __init__(self, n_mels: int, d_model: int, channels: int | None = None) -> None:
        super().__init__()
        channels = channels or d_model
        self.conv = nn.Sequential(nn.Conv2d(1, channels, 3, 2), nn.ReLU(), nn.Conv2d(channels, channels, 3, 2), nn.ReLU())
        freq = ((n_mels - 1) // 2 - 1) // 2
        self.out = nn.Linear(channels * freq, d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.conv(features.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f))


class _FeedForward(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.sequential = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, ffn), nn.SiLU(), nn.Linear(ffn, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sequential(x)


class _ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d)
        self.sequential = nn.Sequential(
            nn.Conv1d(d, 2 * d, 1), nn.GLU(dim=1), nn.Conv1d(d, d, kernel, padding=(kernel - 1) // 2, groups=d),
            nn.BatchNorm1d(d), nn.SiLU(), nn.Conv1d(d, d, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return self.sequential(self.layer_norm(x).transpose(1, 2)).transpose(1, 2)


class _ConformerLayer(nn.Module):
    """torchaudio's ConformerLayer on (T, B, D), without a padding mask."""

    def __init__(self, d: int, ffn: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ffn1 = _FeedForward(d, ffn)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, heads)
        self.conv_module = _ConvModule(d, kernel)
        self.ffn2 = _FeedForward(d, ffn)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = 0.5 * self.ffn1(x) + x
        h = self.self_attn_layer_norm(x)
        h, _ = self.self_attn(query=h, key=h, value=h, key_padding_mask=key_padding_mask, need_weights=False)
        x = h + x
        x = self.conv_module(x.transpose(0, 1)).transpose(0, 1) + x
        x = 0.5 * self.ffn2(x) + x
        return self.final_layer_norm(x)


class ConformerMirror(nn.Module):
    """The layer stack of torchaudio.models.Conformer: ``conformer_layers`` on (T, B, D)."""

    def __init__(self, input_dim: int, num_heads: int, ffn_dim: int, num_layers: int,
                 depthwise_conv_kernel_size: int) -> None:
        super().__init__()
        self.conformer_layers = nn.ModuleList(
            _ConformerLayer(input_dim, ffn_dim, num_heads, depthwise_conv_kernel_size) for _ in range(num_layers))


class ConformerEncoder(nn.Module):
    """Subsampling front end + a Conformer (the mirror or torchaudio's: both have conformer_layers).

    The layers are called without a padding mask: in a padded batch the mask changes values, never
    shapes, and computing it from lengths needs data (an .item()) that meta tensors do not have."""

    def __init__(self, frontend: nn.Module, conformer: nn.Module) -> None:
        super().__init__()
        self.frontend = frontend
        self.conformer = conformer

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.frontend(features).transpose(0, 1)
        for layer in self.conformer.conformer_layers:
            x = layer(x, None)
        return x.transpose(0, 1)
