"""The triton_tma lane (sm90+): device-side tensor descriptors, a persistent grid, optional
warp specialisation. No torch import.

Each CTA walks tiles tile = pid, pid + grid, ... in grouped order; operands arrive by TMA
(out-of-range rows and K columns read as zero), and the epilogue is stored through a
descriptor in two column halves when BN >= 128 to halve its shared-memory buffer.
Descriptors need 16-byte-aligned row strides: K*2 and N*2 bytes (the validity predicate checks).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE, epilogue, tile_coords


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gemm_tma_kernel(x_ptr, w_ptr, y_ptr, b_ptr, M, N, K, HAS_BIAS, ACT,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                    SUBTILE: tl.constexpr, WS: tl.constexpr, FLATTEN: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    EPI_BN: tl.constexpr = BN // 2 if SUBTILE else BN
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, EPI_BN])
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    out_ty = y_ptr.dtype.element_ty
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN,
                         warp_specialize=WS):
        pid_m, pid_n = tile_coords(tile, M, N, BM, BN, GROUP_M)
        om = pid_m * BM
        on = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(k_tiles):
            a = x_desc.load([om, kt * BK])
            b = w_desc.load([on, kt * BK])
            acc = tl.dot(a, b.T, acc)
        if SUBTILE:
            halves = tl.reshape(acc, (BM, 2, BN // 2))
            lo, hi = tl.split(tl.permute(halves, (0, 2, 1)))
            cols = on + tl.arange(0, BN // 2)
            lo = epilogue(lo, b_ptr, cols, N, HAS_BIAS, ACT)
            y_desc.store([om, on], lo.to(out_ty))
            hi = epilogue(hi, b_ptr, cols + BN // 2, N, HAS_BIAS, ACT)
            y_desc.store([om, on + BN // 2], hi.to(out_ty))
        else:
            cols = on + tl.arange(0, BN)
            acc = epilogue(acc, b_ptr, cols, N, HAS_BIAS, ACT)
            y_desc.store([om, on], acc.to(out_ty))
