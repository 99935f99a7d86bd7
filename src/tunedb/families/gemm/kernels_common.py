"""Triton helpers every GEMM lane shares: grouped tile order and the fused epilogue.

Imports triton but never torch, so `tunedb prebuild` can compile these kernels in an
environment that has only Triton installed.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Activation codes passed to the kernels as a runtime int (one binary serves every activation).
ACT_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}

# Runtime scalars that must not be specialised: M changes every call, and the epilogue flags
# would otherwise turn value 1 into a constant and fork the binary per activation.
NO_SPECIALIZE = ("M", "HAS_BIAS", "ACT")


@triton.jit
def tile_coords(tile, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row tiles share each column sweep, so W tiles are reused from L2."""
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    group = tile // per_group
    first_m = group * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + ((tile % per_group) % rows)
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


@triton.jit
def epilogue(acc, b_ptr, offs_n, N, HAS_BIAS, ACT):
    """acc (fp32) + bias, then the activation, all in fp32 before the one rounding to the output."""
    if HAS_BIAS != 0:
        bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 2:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    elif ACT == 3:
        # 0.5*x*(1+tanh(u)) == x*sigmoid(2u), u = sqrt(2/pi)*(x + 0.044715 x^3)
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * u)
    elif ACT == 4:
        acc = acc * tl.sigmoid(acc)
    return acc
