"""Models no preset, census or table names, of the kinds our users run, written in plain torch
(random weights; imports torch only, so the device can build them without transformers).

Each entry of ZOO builds (model, inputs) on a device and dtype: the model in eval mode, the
inputs a tuple for model(*inputs). Shapes are chosen away from every shipped table's keys (and
from each other) so what serves is tunedb's default path on unseen shapes:

- vit: a ViT-S/16-style encoder (conv2d patch embedding, nn.MultiheadAttention, GELU MLP in an
  nn.Sequential, a classifier head), batch 8 at 224x224.
- txenc: torch's own nn.TransformerEncoder (pre-norm, GELU), batch 4 x 200 tokens, width 640.
- convnet: a small ResNet-like conv net (7x7 stem, depthwise + pointwise, strided 3x3, BatchNorm),
  batch 16 at 96x96.
- speech: strided conv1d, depthwise conv1d (kernel 15), a 2-layer GRU, a bidirectional LSTM and a
  CTC-style log-softmax head over 700 symbols, batch 4 x 300 frames.
- tied_lm: a decoder step of a small LM with the output projection tied to the embedding (vocab
  24000, width 768) and a SiLU MLP: one token at batch 4.
- einsum_attn: attention written with einsum and @ (the bmm family's products), batch 6 x 77.
- weightnorm: an MLP whose first Linear is weight-normed (a parametrization), rows 300.
- moe: a top-1 mixture of 6 experts routed with boolean masks (data-dependent shapes: eager only).

The next six live in unseen_zoo_models2.py (ZOO2, merged into ZOO below):

- gpt2_conv1d: GPT-2 blocks whose projections are Hugging Face-style Conv1D modules (weight
  [in, out], torch.addmm), causal SDPA, tanh-GELU, a functional tied head (vocab 7000); batch 3 x
  37 tokens, width 576, MLP 2240.
- t5_encdec: a T5-like encoder-decoder (hand-written RMSNorm, bias-free Linears, bucketed relative
  position bias added to torch.matmul scores, cross-attention, one embedding for both stacks);
  int inputs: encoder ids [2, 50], decoder ids [2, 9]; width 416, 6 heads of 48, FFN 1184.
- unet: a small diffusion UNet (GroupNorm + SiLU conv residual blocks, stride-2 conv down,
  ConvTranspose2d and nearest + conv up, torch.bmm self-attention on [B, HW, C] at 12x12 with
  nn.Linear q/k/v, a timestep MLP); input [2, 4, 48, 48] and int timesteps [2]; widths 88/176,
  timestep MLP 360.
- mamba_like: two gated blocks (Linear in-projection to 2x width, causal depthwise conv1d kernel 4
  padded 3 and sliced, SiLU gating, a selective scan as a Python loop over 24 steps with an einsum
  per step, x/dt projections of widths 46 and 22, Linear out-projection); input [2, 24, 352].
- mixer_convnext: a patchify conv, a ConvNeXt block (depthwise 7x7, LayerNorm and Linears on a 4-D
  NHWC tensor, layer scale), a 2x2 downsampling conv and an MLP-Mixer block whose token-mixing
  Linears run on a transposed (strided) view; input [4, 3, 64, 64]; widths 168/672, 264/1056,
  tokens 64 -> 232.
- shared_heads: one Linear (+ SiLU) applied twice in a loop, one held under two names, an fp32
  head (an nn.Linear subclass computing in fp32 in a bf16 model) and nn.Bilinear; input [64, 200],
  width 336.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from unseen_zoo_models2 import ZOO2


class ViT(nn.Module):
    def __init__(self, d: int = 384, heads: int = 6, layers: int = 2, patch: int = 16, img: int = 224,
                 classes: int = 1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            n1=nn.LayerNorm(d), attn=nn.MultiheadAttention(d, heads, batch_first=True), n2=nn.LayerNorm(d),
            mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)))) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            h = b["n1"](x)
            x = x + b["attn"](h, h, h, need_weights=False)[0]
            x = x + b["mlp"](b["n2"](x))
        return self.head(self.norm(x[:, 0]))


class TxEncoder(nn.Module):
    def __init__(self, d: int = 640, heads: int = 10, ffn: int = 2560, layers: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(x)


class ConvNet(nn.Module):
    def __init__(self, classes: int = 37) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 48, 7, 2, 3, bias=False), nn.BatchNorm2d(48), nn.ReLU())
        self.block = nn.Sequential(
            nn.Conv2d(48, 48, 3, 1, 1, groups=48), nn.Conv2d(48, 96, 1), nn.BatchNorm2d(96), nn.ReLU(),
            nn.Conv2d(96, 160, 3, 2, 1), nn.BatchNorm2d(160), nn.ReLU())
        self.fc = nn.Linear(160, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(self.stem(x)).mean((2, 3)))


class Speech(nn.Module):
    def __init__(self, mels: int = 40, d: int = 144, hidden: int = 200, vocab: int = 700) -> None:
        super().__init__()
        self.sub = nn.Conv1d(mels, d, 5, stride=2, padding=2)
        self.dw = nn.Conv1d(d, d, 15, padding=7, groups=d)
        self.gru = nn.GRU(d, hidden, num_layers=2, batch_first=True)
        self.lstm = nn.LSTM(hidden, 96, batch_first=True, bidirectional=True)
        self.out = nn.Linear(192, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.dw(self.sub(x))).transpose(1, 2)
        h, _ = self.gru(h)
        h, _ = self.lstm(h)
        return F.log_softmax(self.out(h), -1)


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 24000, d: int = 768, ffn: int = 2304, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlps = nn.ModuleList(nn.ModuleDict(dict(
            norm=nn.LayerNorm(d), up=nn.Linear(d, ffn), act=nn.SiLU(), down=nn.Linear(ffn, d))) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        for b in self.mlps:
            h = h + b["down"](b["act"](b["up"](b["norm"](h))))
        return self.lm_head(self.norm(h))


class EinsumAttention(nn.Module):
    def __init__(self, d: int = 320, heads: int = 5) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) * (d // self.heads) ** -0.5
        y = att.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class WeightNormMLP(nn.Module):
    def __init__(self, d: int = 272, hidden: int = 1088) -> None:
        super().__init__()
        self.a = nn.utils.parametrizations.weight_norm(nn.Linear(d, hidden))
        self.act = nn.GELU(approximate="tanh")
        self.b = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


class MoE(nn.Module):
    def __init__(self, d: int = 448, ffn: int = 896, experts: int = 6) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, ffn, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(ffn, d, bias=False) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.gate(x).float().softmax(-1)
        top = p.argmax(-1)
        out = torch.zeros_like(x)
        for i in range(len(self.w1)):
            rows = top == i
            if rows.any():
                out[rows] = (self.w2[i](F.silu(self.w1[i](x[rows]))) * p[rows][:, i:i + 1]).to(x.dtype)
        return out


def _randn(*shape: int) -> Callable[[Any, Any], tuple[torch.Tensor, ...]]:
    return lambda device, dtype: (torch.randn(*shape, device=device, dtype=dtype),)


# name -> (model class, inputs(device, dtype), capturable in a CUDA graph)
ZOO: dict[str, tuple[type[nn.Module], Callable[[Any, Any], tuple[torch.Tensor, ...]], bool]] = {
    "vit": (ViT, _randn(8, 3, 224, 224), True),
    "txenc": (TxEncoder, _randn(4, 200, 640), True),
    "convnet": (ConvNet, _randn(16, 3, 96, 96), True),
    "speech": (Speech, _randn(4, 40, 300), True),
    "tied_lm": (TiedLM, lambda device, dtype: (torch.randint(0, 24000, (4, 1), device=device),), True),
    "einsum_attn": (EinsumAttention, _randn(6, 77, 320), True),
    "weightnorm": (WeightNormMLP, _randn(300, 272), True),
    "moe": (MoE, _randn(200, 448), False),
}
ZOO.update(ZOO2)


def build(name: str, device: Any = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0
          ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ZOO[name]'s model (eval mode, on device, in dtype) and its inputs, from a fixed seed."""
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; allowed: {', '.join(ZOO)}")
    cls, inputs, _ = ZOO[name]
    torch.manual_seed(seed)
    model = cls().to(device=device, dtype=dtype).eval()
    return model, inputs(device, dtype)
