"""The unseen zoo's second six models (unseen_zoo_models.py documents them and merges ZOO2 into
its ZOO): plain torch, random weights, shapes away from the first eight's and from preset widths.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: weight [in, out], x @ W + b through addmm (optimize()
    leaves it to torch and counts it as unpatched, by this class name)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.size()[:-1] + (self.nf,))


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.attn_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(ffn, d)
        self.mlp_proj = Conv1D(d, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2Conv1D(nn.Module):
    def __init__(self, vocab: int = 7000, d: int = 576, heads: int = 9, ffn: int = 2240, layers: int = 2,
                 ctx: int = 128) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=0.02)  # GPT-2's init: the blocks, not the embedding, dominate

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            h = block(h)
        return F.linear(self.ln_f(h), self.wte.weight)  # GPT-2's tied head, as a functional call


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def _t5_bucket(rel: torch.Tensor, bidirectional: bool, buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's relative-position bucket of key - query offsets."""
    out = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        out = out + (rel > 0).long() * buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    exact = buckets // 2
    large = exact + (torch.log(rel.float() / exact + 1e-6) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return out + torch.where(rel < exact, rel, large)


class T5Attention(nn.Module):
    def __init__(self, d: int, heads: int, d_kv: int, bias: bool = False, bidirectional: bool = True) -> None:
        super().__init__()
        self.heads, self.d_kv, self.bidirectional = heads, d_kv, bidirectional
        self.q = nn.Linear(d, heads * d_kv, bias=False)
        self.k = nn.Linear(d, heads * d_kv, bias=False)
        self.v = nn.Linear(d, heads * d_kv, bias=False)
        self.o = nn.Linear(heads * d_kv, d, bias=False)
        self.rel = nn.Embedding(32, heads) if bias else None

    def position_bias(self, tq: int, tk: int, device: Any) -> torch.Tensor:
        rel = torch.arange(tk, device=device)[None, :] - torch.arange(tq, device=device)[:, None]
        return self.rel(_t5_bucket(rel, self.bidirectional)).permute(2, 0, 1)[None]  # [1, H, tq, tk]

    def forward(self, x: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, tq, _ = x.shape
        q = self.q(x).view(b, tq, self.heads, self.d_kv).transpose(1, 2)
        k = self.k(kv).view(b, kv.shape[1], self.heads, self.d_kv).transpose(1, 2)
        v = self.v(kv).view(b, kv.shape[1], self.heads, self.d_kv).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) + bias  # T5: no 1/sqrt(d) scaling
        probs = scores.float().softmax(-1).to(q.dtype)
        return self.o(torch.matmul(probs, v).transpose(1, 2).reshape(b, tq, -1))


class T5FF(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.wi = nn.Linear(d, ffn, bias=False)
        self.act = nn.ReLU()
        self.wo = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))


class T5EncDec(nn.Module):
    def __init__(self, vocab: int = 3100, d: int = 416, heads: int = 6, d_kv: int = 48, ffn: int = 1184,
                 layers: int = 2) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab, d)  # one embedding for both stacks, as T5's
        self.enc = nn.ModuleList(nn.ModuleDict(dict(
            n1=RMSNorm(d), attn=T5Attention(d, heads, d_kv, bias=i == 0), n2=RMSNorm(d), ff=T5FF(d, ffn)))
            for i in range(layers))
        self.enc_norm = RMSNorm(d)
        self.dec = nn.ModuleList(nn.ModuleDict(dict(
            n1=RMSNorm(d), attn=T5Attention(d, heads, d_kv, bias=i == 0, bidirectional=False),
            n2=RMSNorm(d), cross=T5Attention(d, heads, d_kv), n3=RMSNorm(d), ff=T5FF(d, ffn)))
            for i in range(layers))
        self.dec_norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, enc_ids: torch.Tensor, dec_ids: torch.Tensor) -> torch.Tensor:
        x = self.shared(enc_ids)
        te, td = enc_ids.shape[1], dec_ids.shape[1]
        bias = self.enc[0]["attn"].position_bias(te, te, x.device).to(x.dtype)  # layer 0's, for all layers
        for b in self.enc:
            h = b["n1"](x)
            x = x + b["attn"](h, h, bias)
            x = x + b["ff"](b["n2"](x))
        mem = self.enc_norm(x)
        y = self.shared(dec_ids)
        causal = torch.triu(torch.full((td, td), float("-inf"), device=y.device), 1)
        self_bias = (self.dec[0]["attn"].position_bias(td, td, y.device) + causal).to(y.dtype)
        no_bias = torch.zeros((), device=y.device, dtype=y.dtype)
        for b in self.dec:
            h = b["n1"](y)
            y = y + b["attn"](h, h, self_bias)
            y = y + b["cross"](b["n2"](y), mem, no_bias)
            y = y + b["ff"](b["n3"](y))
        return self.lm_head(self.dec_norm(y))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(nn.GroupNorm(8, cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, padding=1))
        self.emb = nn.Linear(temb, cout)
        self.out_layers = nn.Sequential(nn.GroupNorm(8, cout), nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1))
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x) + self.emb(F.silu(t))[:, :, None, None]
        return self.skip(x) + self.out_layers(h)


class SpatialAttention(nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(8, c)
        self.q, self.k, self.v, self.proj = (nn.Linear(c, c) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x).flatten(2).transpose(1, 2)  # [B, HW, C]
        d = c // self.heads

        def split(z: torch.Tensor) -> torch.Tensor:  # [B * heads, HW, d]
            return z.view(b, hh * ww, self.heads, d).transpose(1, 2).reshape(b * self.heads, hh * ww, d)

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.bmm(q, k.transpose(1, 2)).mul(d ** -0.5).softmax(-1)
        y = torch.bmm(att, v).view(b, self.heads, hh * ww, d).transpose(1, 2).reshape(b, hh * ww, c)
        return x + self.proj(y).transpose(1, 2).reshape(b, c, hh, ww)


class UNet(nn.Module):
    def __init__(self, cin: int = 4, ch: int = 88, temb: int = 360) -> None:
        super().__init__()
        self.ch = ch
        self.time = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.inp = nn.Conv2d(cin, ch, 3, padding=1)
        self.d1 = ResBlock(ch, ch, temb)
        self.down1 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)  # 48 -> 24
        self.d2 = ResBlock(ch, 2 * ch, temb)
        self.down2 = nn.Conv2d(2 * ch, 2 * ch, 3, stride=2, padding=1)  # 24 -> 12
        self.mid = ResBlock(2 * ch, 2 * ch, temb)
        self.attn = SpatialAttention(2 * ch, heads=4)
        self.up2 = nn.ConvTranspose2d(2 * ch, 2 * ch, 4, stride=2, padding=1)  # 12 -> 24
        self.u2 = ResBlock(4 * ch, 2 * ch, temb)
        self.up1 = nn.Conv2d(2 * ch, ch, 3, padding=1)  # after nearest 24 -> 48
        self.u1 = ResBlock(2 * ch, ch, temb)
        self.out = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, cin, 3, padding=1))

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.ch // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device, dtype=torch.float32) / half)
        ang = timesteps.float()[:, None] * freqs[None]
        t = self.time(torch.cat([ang.cos(), ang.sin()], -1).to(x.dtype))
        h1 = self.d1(self.inp(x), t)
        h2 = self.d2(self.down1(h1), t)
        h = self.attn(self.mid(self.down2(h2), t))
        h = self.u2(torch.cat([self.up2(h), h2], 1), t)
        h = self.up1(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(self.u1(torch.cat([h, h1], 1), t))


class MambaLike(nn.Module):
    def __init__(self, d: int = 352, expand: int = 2, state: int = 12, dt_rank: int = 22, layers: int = 2) -> None:
        super().__init__()
        inner = expand * d
        self.state, self.dt_rank = state, dt_rank
        self.layers = nn.ModuleList(nn.ModuleDict(dict(
            norm=RMSNorm(d), in_proj=nn.Linear(d, 2 * inner, bias=False),
            conv=nn.Conv1d(inner, inner, 4, groups=inner, padding=3),
            x_proj=nn.Linear(inner, dt_rank + 2 * state, bias=False), dt_proj=nn.Linear(dt_rank, inner),
            out_proj=nn.Linear(inner, d, bias=False))) for _ in range(layers))
        self.A_log = nn.ParameterList(nn.Parameter(torch.log(torch.arange(1, state + 1).float().repeat(inner, 1)))
                                      for _ in range(layers))
        self.D = nn.ParameterList(nn.Parameter(torch.ones(inner)) for _ in range(layers))
        self.norm_f = RMSNorm(d)

    def scan(self, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor) -> torch.Tensor:
        """Mamba's selective_scan_ref in fp32: u, delta [b, t, d]; A [d, n]; B, C [b, t, n]."""
        u, delta, B, C = u.float(), delta.float(), B.float(), C.float()
        dA = torch.exp(delta[..., None] * A.float())  # [b, t, d, n]
        dBu = delta[..., None] * B[:, :, None, :] * u[..., None]
        h = u.new_zeros(u.shape[0], u.shape[2], A.shape[1])
        ys = []
        for i in range(u.shape[1]):  # the recurrence, one step a time
            h = dA[:, i] * h + dBu[:, i]
            ys.append(torch.einsum("bdn,bn->bd", h, C[:, i]))
        return torch.stack(ys, 1) + u * D.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        for layer, A_log, D in zip(self.layers, self.A_log, self.D):
            xz = layer["in_proj"](layer["norm"](x))
            u, z = xz.chunk(2, -1)
            u = F.silu(layer["conv"](u.transpose(1, 2))[..., :t].transpose(1, 2))  # causal: pad 3, keep first t
            dt, B, C = layer["x_proj"](u).split([self.dt_rank, self.state, self.state], -1)
            delta = F.softplus(layer["dt_proj"](dt))
            y = self.scan(u, delta, -torch.exp(A_log), B, C, D).to(x.dtype)
            x = x + layer["out_proj"](y * F.silu(z))
        return self.norm_f(x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pwconv1 = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(0.1 * torch.ones(c))  # layer scale (ConvNeXt's 1e-6 would hide the block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).permute(0, 2, 3, 1))  # NHWC
        h = self.pwconv2(self.act(self.pwconv1(h)))  # Linears on a 4-D tensor
        return x + (self.gamma * h).permute(0, 3, 1, 2)


class MixerConvNeXt(nn.Module):
    def __init__(self, c: int = 168, c2: int = 264, tokens: int = 64, token_hidden: int = 232,
                 channel_hidden: int = 1056, classes: int = 101) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)  # patchify: 64 -> 16
        self.block = ConvNeXtBlock(c)
        self.down_norm = nn.LayerNorm(c)
        self.down = nn.Conv2d(c, c2, 2, stride=2)  # 16 -> 8: 64 tokens
        self.n1 = nn.LayerNorm(c2)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.n2 = nn.LayerNorm(c2)
        self.channel_mlp = nn.Sequential(nn.Linear(c2, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, c2))
        self.norm = nn.LayerNorm(c2)
        self.head = nn.Linear(c2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(self.stem(x))
        h = self.down(self.down_norm(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        h = h.flatten(2).transpose(1, 2)  # [B, tokens, C]
        h = h + self.token_mlp(self.n1(h).transpose(1, 2)).transpose(1, 2)  # token mixing on a strided view
        h = h + self.channel_mlp(self.n2(h))
        return self.head(self.norm(h).mean(1))


class Float32Linear(nn.Linear):
    """A head kept in fp32 in a bf16 model: .to(dtype) casts its weight, its forward computes in
    fp32 all the same (an nn.Linear subclass: optimize() must leave it as it is)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())


class SharedHeads(nn.Module):
    def __init__(self, d_in: int = 200, d: int = 336, classes: int = 97, pair: int = 52) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.mix = nn.Linear(d, d)
        self.act = nn.SiLU()
        self.proj = nn.Linear(d, d)
        self.again = self.proj  # one module under two names: one Linear, two holders
        self.norm = nn.LayerNorm(d)
        self.head = Float32Linear(d, classes)
        self.pair = nn.Bilinear(d, d_in, pair)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for _ in range(2):  # one Linear (and its activation) applied twice
            h = h + self.act(self.mix(h))
        h = self.norm(self.again(F.gelu(self.proj(h))))  # the other, once under each of its names
        return torch.cat([self.head(h), self.pair(h, x).float()], -1)


def _randn(*shape: int) -> Callable[[Any, Any], tuple[torch.Tensor, ...]]:
    return lambda device, dtype: (torch.randn(*shape, device=device, dtype=dtype),)


ZOO2: dict[str, tuple[type[nn.Module], Callable[[Any, Any], tuple[torch.Tensor, ...]], bool]] = {
    "gpt2_conv1d": (GPT2Conv1D, lambda device, dtype: (torch.randint(0, 7000, (3, 37), device=device),), True),
    "t5_encdec": (T5EncDec, lambda device, dtype: (torch.randint(0, 3100, (2, 50), device=device),
                                                   torch.randint(0, 3100, (2, 9), device=device)), True),
    "unet": (UNet, lambda device, dtype: (torch.randn(2, 4, 48, 48, device=device, dtype=dtype),
                                          torch.randint(0, 1000, (2,), device=device)), True),
    "mamba_like": (MambaLike, _randn(2, 24, 352), True),
    "mixer_convnext": (MixerConvNeXt, _randn(4, 3, 64, 64), True),
    "shared_heads": (SharedHeads, _randn(64, 200), True),
}
