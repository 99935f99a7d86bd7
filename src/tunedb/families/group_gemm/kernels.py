"""The Triton grouped-GEMM kernels: one launch over every expert.

group_gemm_kernel (lane triton_grouped) runs over the slots sorted by expert (routing.py);
slot_gemv_kernel (lane triton_slots, small M) reads each slot's expert from topk_ids directly.

Program p takes one (BM block of sorted token slots, BN block of outputs) tile. The routing
metadata (routing.py) guarantees a BM block holds the slots of one expert only, so the tile
streams that expert's weight [N, K] once for all its rows. Blocks past the last used one carry
expert -1 and return at once: the grid is sized from static shapes (CUDA graphs), not from the
routing. Tiles are visited in GROUP_M-grouped order so that neighbouring programs share weight
columns in L2. Padding rows (slot id == slots) are masked on load and store.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["slots", "num_blocks_m", "top_k"])
def group_gemm_kernel(x_ptr, w_ptr, y_ptr, tw_ptr, sorted_ids_ptr, block_expert_ptr,
                      slots, num_blocks_m, top_k, N, K,
                      stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_ym, stride_yn,
                      X_PER_SLOT: tl.constexpr, WEIGHTED: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_blocks_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_blocks_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = min(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows

    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    offs_r = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ids_ptr + offs_r)
    valid = slot < slots
    if X_PER_SLOT:
        row = slot
    else:
        row = slot // top_k
    row = tl.where(valid, row, 0).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
    b_ptrs = (w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
              + offs_k[:, None] * stride_wk)
    n_ok = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BK)):
        k_left = K - k0 * BK
        a = tl.load(a_ptrs, mask=valid[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[None, :] & (offs_k[:, None] < k_left), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK * stride_xk
        b_ptrs += BK * stride_wk
    if WEIGHTED:
        wt = tl.load(tw_ptr + slot, mask=valid, other=0.0).to(tl.float32)
        acc = acc * wt[:, None]
    y_ptrs = y_ptr + slot.to(tl.int64)[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["slots", "top_k"])
def slot_gemv_kernel(x_ptr, w_ptr, y_ptr, tw_ptr, ids_ptr, slots, top_k, N, K,
                     stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_ym, stride_yn,
                     X_PER_SLOT: tl.constexpr, WEIGHTED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     STAGES: tl.constexpr):
    """The routing-free small-M lane: program p takes slot p % slots and output block
    p // slots, reads the slot's expert from topk_ids itself (no sort, no padding) and streams
    that expert's [BN, K] weight rows like a GEMV. Neighbouring programs are the slots of one BN
    block, so slots that share an expert find its weight rows in L2."""
    pid = tl.program_id(0)
    slot = pid % slots
    pid_n = pid // slots
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    if X_PER_SLOT:
        row = slot
    else:
        row = slot // top_k
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + row.to(tl.int64) * stride_xm + offs_k * stride_xk
    w_ptrs = (w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
              + offs_k[None, :] * stride_wk)
    # products accumulate elementwise and are reduced across K once, after the loop: no
    # cross-thread shuffles inside the weight stream (the predicate bounds BN * BK per thread)
    acc2 = tl.zeros((BN, BK), dtype=tl.float32)
    # a loop without a dot is pipelined (cp.async into shared memory) only when its range asks:
    # STAGES 1 streams through registers, 2+ keeps STAGES - 1 weight chunks in flight
    for k0 in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
        k_ok = offs_k < K - k0 * BK
        xk = tl.load(x_ptrs, mask=k_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc2 += w * xk[None, :]
        x_ptrs += BK * stride_xk
        w_ptrs += BK * stride_wk
    acc = tl.sum(acc2, axis=1)
    if WEIGHTED:
        acc = acc * tl.load(tw_ptr + slot).to(tl.float32)
    y_ptrs = y_ptr + slot.to(tl.int64) * stride_ym + offs_n * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit(do_not_specialize=["slots", "total", "num_blocks"])
def route_kernel(ids_ptr, sorted_ids_ptr, block_expert_ptr, counts_ptr, slots, total, num_blocks,
                 E: tl.constexpr, E_P2: tl.constexpr, BM: tl.constexpr, CHUNK: tl.constexpr):
    """routing.py's metadata in one program (small slot counts): per-expert counts, padded
    offsets, each slot's stable place (its expert's start + how many earlier slots share its
    expert), the padding marks and every BM block's expert. Slots, each expert's padding and the
    tail past the last used block are disjoint ranges, so no position is written twice and no
    barrier is needed."""
    ex = tl.arange(0, E_P2)
    real = ex < E
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, slots, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        e_s = tl.load(ids_ptr + offs, mask=offs < slots, other=-1).to(tl.int32)
        counts += tl.sum((e_s[:, None] == ex[None, :]).to(tl.int32), axis=0)
    padded = (counts + (BM - 1)) // BM * BM
    pends = tl.cumsum(padded, axis=0)
    pstarts = pends - padded
    tl.store(counts_ptr + ex, counts, mask=real)
    used_end = pstarts + counts  # the first padding row of each expert's run
    rows = tl.arange(0, BM)
    for e in range(0, E):  # each expert's padding: fewer than BM rows
        lo = tl.sum(tl.where(ex == e, used_end, 0), axis=0)
        hi = tl.sum(tl.where(ex == e, pends, 0), axis=0)
        tl.store(sorted_ids_ptr + lo + rows, tl.zeros_like(rows) + slots, mask=lo + rows < hi)
    used = tl.sum(padded, axis=0)
    for p0 in range(used, total, CHUNK):  # past the last used block
        pos = p0 + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + pos, tl.zeros_like(pos) + slots, mask=pos < total)
    for b0 in range(0, num_blocks, CHUNK):
        blk = b0 + tl.arange(0, CHUNK)
        owner = tl.sum(((pends[None, :] <= blk[:, None] * BM) & real[None, :]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blk, tl.where(owner < E, owner, -1), mask=blk < num_blocks)
    running = pstarts
    for c0 in range(0, slots, CHUNK):
        offs = c0 + tl.arange(0, CHUNK)
        e_s = tl.load(ids_ptr + offs, mask=offs < slots, other=-1).to(tl.int32)
        hit = (e_s[:, None] == ex[None, :]).to(tl.int32)
        place = tl.cumsum(hit, axis=0) - 1 + running[None, :]
        dest = tl.sum(hit * place, axis=1)
        tl.store(sorted_ids_ptr + dest, offs, mask=offs < slots)
        running += tl.sum(hit, axis=0)
