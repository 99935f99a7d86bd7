"""The conv family's Triton kernels (imports triton: loaded lazily by launch.py).

- dw_conv1d_kernel: direct depthwise conv1d. One program owns a [BC channels x BT output steps]
  tile of one batch row and walks the K taps (unrolled), reading x through its strides, so
  the model's [B, C, T] tensor is read where it lies: time-fastest (nct) or channels-fastest
  (ntc, the Conformer's transposed [B, T, C] activations). fp32 accumulation, bias and the
  activation in the epilogue.
- igemm_kernel: implicit GEMM for dense (g = 1) conv1d / conv2d. Rows M = (b, oh, ow), columns
  N = Cout, reduction K = (ci, kh, kw) in the weight's own [Cout, Cin, KH, KW] order; the A tile
  is gathered from x through its strides with the padding as a mask (no im2col buffer); conv1d
  runs as a conv2d of height 1. fp32 accumulation in tl.dot, bias and activation fused.
Offsets are int32: the validity predicate refuses sizes past 2**31 elements.
"""
from __future__ import annotations

import triton
import triton.language as tl

ACT_CODES = {"none": 0, "relu": 1, "silu": 2}


@triton.jit
def _activate(v, ACT: tl.constexpr):
    if ACT == 1:
        v = tl.maximum(v, 0.0)
    elif ACT == 2:
        v = v / (1.0 + tl.exp(-v))
    return v


@triton.jit
def dw_conv1d_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, T, T_out,
                     sxb, sxc, sxt, syb, syc, syt,
                     KSIZE: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, DIL: tl.constexpr,
                     HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2)
    t = pid_t * BT + tl.arange(0, BT)
    c = pid_c * BC + tl.arange(0, BC)
    cmask = c < C
    tmask = t < T_out
    x_row = x_ptr + b * sxb + c[:, None] * sxc
    acc = tl.zeros((BC, BT), dtype=tl.float32)
    for j in tl.static_range(KSIZE):
        ti = t * STRIDE - PAD + j * DIL
        inside = (ti >= 0) & (ti < T)
        xv = tl.load(x_row + ti[None, :] * sxt, mask=cmask[:, None] & inside[None, :], other=0.0)
        wv = tl.load(w_ptr + c * KSIZE + j, mask=cmask, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)[:, None]
    acc = _activate(acc, ACT)
    y_ptrs = y_ptr + b * syb + c[:, None] * syc + t[None, :] * syt
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=cmask[:, None] & tmask[None, :])


@triton.jit
def igemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, H, W, H_out, W_out,
                 sxb, sxc, sxh, sxw, syb, syc, syh, syw,
                 KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                 PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
                 HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mmask = rm < M
    nmask = rn < N
    ow = rm % W_out
    rest = rm // W_out
    oh = rest % H_out
    bb = rest // H_out
    ih0 = oh * SH - PH
    iw0 = ow * SW - PW
    x_rows = x_ptr + bb * sxb
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        kmask = rk < K
        kw = rk % KW
        kr = rk // KW
        kh = kr % KH
        ci = kr // KH
        ih = ih0[:, None] + kh[None, :] * DH
        iw = iw0[:, None] + kw[None, :] * DW
        amask = mmask[:, None] & kmask[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_rows[:, None] + ci[None, :] * sxc + ih * sxh + iw * sxw, mask=amask, other=0.0)
        wt = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc = tl.dot(a, wt, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    acc = _activate(acc, ACT)
    y_ptrs = y_ptr + (bb * syb + oh * syh + ow * syw)[:, None] + rn[None, :] * syc
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
