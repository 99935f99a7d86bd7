"""The batched product's Triton kernel (no torch import): c[b] = a[b] @ b[b] for every batch b.

Grid (tiles of one product, B): program_id(1) is the batch, program_id(0) walks one product's
tiles in grouped order (GROUP_M row tiles share a column sweep). Every operand and the output
come with their three strides, so a transposed operand (attention's k^T), an expanded batch
(stride 0: grouped KV heads) or a strided view runs in place; Triton specialises a stride of 1,
so the contiguous dimension still loads vectorised. fp32 operands multiply in IEEE fp32 (no
TF32: torch.bmm's default precision), 16-bit ones on tensor cores with an fp32 accumulator.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tunedb.families.gemm.kernels_common import tile_coords


# M changes every call; N and K only bound masks and loops: not specialising them keeps one
# binary per layout and stride alignment (the strides stay specialised: vector loads need them)
@triton.jit(do_not_specialize=("M", "N", "K"))
def bmm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
               s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_cm, s_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               IEEE: tl.constexpr):
    pid_m, pid_n = tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    # wrapped indices keep edge-tile loads in bounds without masks; the store masks instead
    rows_in = (rows % M).to(tl.int64)
    cols_in = (cols % N).to(tl.int64)
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + batch * s_ab + rows_in[:, None] * s_am + offs_k[None, :] * s_ak
    b_ptrs = b_ptr + batch * s_bb + offs_k[:, None] * s_bk + cols_in[None, :] * s_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BK)):
        k_left = K - kt * BK
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    c_ptrs = c_ptr + batch * s_cb + rows.to(tl.int64)[:, None] * s_cm + cols.to(tl.int64)[None, :] * s_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
