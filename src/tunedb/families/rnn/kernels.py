"""The Triton sequence-persistent LSTM kernel (lane `triton_persistent`): one program owns BB
batch rows and walks all T steps of one layer and direction in a single launch, so the per-step
launches of cuDNN's standard algorithm and of torch's native path disappear.

The input projection x_t @ W_ih^T + b_ih + b_hh of every step is one GEMM before the launch
(launch.py); per step the program computes h_{t-1} @ W_hh^T block by block (BH gate columns x BK
inputs, W_hh read from L2: it stays resident across steps, 4*H*H*2 bytes), applies the cell and
writes h_t into the output, which is also where step t+1 reads h_t from (a block barrier orders
the two). The cell state lives in a fp32 scratch row per batch row. No torch import.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _sigmoid(v):
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _tanh(v):
    return 2.0 * _sigmoid(2.0 * v) - 1.0


@triton.jit
def _lstm_seq_kernel(xp_ptr, whh_ptr, h0_ptr, y_ptr, c_ptr, B, T, H,
                     stride_xb, stride_xt, stride_yb, stride_yt,
                     REVERSE: tl.constexpr, BB: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr):
    """xp [B, T, 4H] fp32 (input projection + both biases), whh [4H, H], h0 [B, H], y [B, T, *]
    (this direction's H columns), c [B, H] fp32 (the cell state: c0 in, c_T out)."""
    offs_b = tl.program_id(0) * BB + tl.arange(0, BB)
    b_ok = offs_b < B
    rows = offs_b.to(tl.int64)
    for t_i in range(0, T):
        t = T - 1 - t_i if REVERSE else t_i
        t_prev = t + 1 if REVERSE else t - 1
        for j0 in range(0, H, BH):
            offs_j = j0 + tl.arange(0, BH)
            j_ok = offs_j < H
            acc_i = tl.zeros((BB, BH), tl.float32)
            acc_f = tl.zeros((BB, BH), tl.float32)
            acc_g = tl.zeros((BB, BH), tl.float32)
            acc_o = tl.zeros((BB, BH), tl.float32)
            for k0 in range(0, H, BK):
                offs_k = k0 + tl.arange(0, BK)
                k_ok = offs_k < H
                hm = b_ok[:, None] & k_ok[None, :]
                if t_i == 0:
                    h = tl.load(h0_ptr + rows[:, None] * H + offs_k[None, :], mask=hm, other=0.0)
                else:
                    h = tl.load(y_ptr + rows[:, None] * stride_yb + t_prev * stride_yt + offs_k[None, :],
                                mask=hm, other=0.0)
                h = h.to(whh_ptr.dtype.element_ty)
                wm = k_ok[:, None] & j_ok[None, :]
                w_base = whh_ptr + offs_k[:, None] + offs_j[None, :].to(tl.int64) * H
                acc_i = tl.dot(h, tl.load(w_base, mask=wm, other=0.0), acc_i)
                acc_f = tl.dot(h, tl.load(w_base + H * H, mask=wm, other=0.0), acc_f)
                acc_g = tl.dot(h, tl.load(w_base + 2 * H * H, mask=wm, other=0.0), acc_g)
                acc_o = tl.dot(h, tl.load(w_base + 3 * H * H, mask=wm, other=0.0), acc_o)
            m = b_ok[:, None] & j_ok[None, :]
            xp = xp_ptr + rows[:, None] * stride_xb + t * stride_xt + offs_j[None, :]
            gi = _sigmoid(acc_i + tl.load(xp, mask=m, other=0.0))
            gf = _sigmoid(acc_f + tl.load(xp + H, mask=m, other=0.0))
            gg = _tanh(acc_g + tl.load(xp + 2 * H, mask=m, other=0.0))
            go = _sigmoid(acc_o + tl.load(xp + 3 * H, mask=m, other=0.0))
            c_ptrs = c_ptr + rows[:, None] * H + offs_j[None, :]
            c = gf * tl.load(c_ptrs, mask=m, other=0.0) + gi * gg
            tl.store(c_ptrs, c, mask=m)
            h_new = go * _tanh(c)
            tl.store(y_ptr + rows[:, None] * stride_yb + t * stride_yt + offs_j[None, :],
                     h_new.to(y_ptr.dtype.element_ty), mask=m)
        tl.debug_barrier()  # every column of h_t is written before step t+1 reads it
