"""Routing metadata of a grouped GEMM: token slots sorted by expert, each expert's run padded to
a multiple of the tile height BM, and the expert of every BM block.

Everything is sized from static shapes (M, top_k, E, BM) and computed with device ops that never
read a value back to the host, so the metadata is part of a captured CUDA graph and of the op's
time as a user pays it. The padded length is bounded by slots + min(slots, E) * (BM - 1): at most
that many experts receive slots, each wasting under BM rows.

Two implementations give the same metadata: one Triton program (kernels.route_kernel) where the
slot count is small enough for one program (slots * E rounded up to a power of two <=
FUSED_WORK, 2^18), a launch instead of some 25 small torch kernels that cost more than a decode GEMM;
and the torch ops below (any size, any device).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

# slots x experts (rounded up to a power of two) one routing program takes: its two passes over
# the slots cost about that many int ops over 256 threads (a few microseconds at this bound)
FUSED_WORK = 1 << 18


class Routing(NamedTuple):
    sorted_ids: Any  # int32 [padded]: slot id (t * top_k + j) per padded row; `slots` marks padding
    block_expert: Any  # int32 [padded // BM]: the expert of each BM block, -1 past the last used
    counts: Any  # int32 [E]: slots per expert


def padded_len(slots: int, e: int, bm: int) -> int:
    """The static upper bound of the padded row count, rounded up to whole BM blocks."""
    bound = slots + min(slots, e) * (bm - 1)
    return -(-bound // bm) * bm


def _e_p2(e: int) -> int:
    return max(16, 1 << (e - 1).bit_length())


def fused_fits(slots: int, e: int, device: Any) -> bool:
    """Whether route() takes the one-program Triton path for this many slots here."""
    on_triton = getattr(device, "type", device) == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return on_triton and 0 < slots and slots * _e_p2(e) <= FUSED_WORK


def route(topk_ids: Any, e: int, bm: int, fused: bool | None = None) -> Routing:
    """The metadata for tile height `bm`; `fused` None picks the Triton program where it fits."""
    import torch

    flat = topk_ids.reshape(-1).contiguous()  # reshape may return a strided view; the program reads stride 1
    if fused if fused is not None else fused_fits(flat.numel(), e, flat.device):
        return _route_fused(flat, e, bm)
    slots = flat.numel()
    dev = flat.device
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order].long()
    counts = torch.zeros(e, dtype=torch.int32, device=dev)
    counts.index_add_(0, flat.long(), torch.ones(slots, dtype=torch.int32, device=dev))
    starts = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    padded = (counts + (bm - 1)) // bm * bm
    pends = torch.cumsum(padded, 0, dtype=torch.int32)
    pstarts = pends - padded
    rank = torch.arange(slots, dtype=torch.int32, device=dev) - starts[sorted_e]
    total = padded_len(slots, e, bm)
    sorted_ids = torch.full((total,), slots, dtype=torch.int32, device=dev)
    sorted_ids.index_copy_(0, (pstarts[sorted_e] + rank).long(), order.to(torch.int32))
    block_starts = torch.arange(0, total, bm, dtype=torch.int32, device=dev)
    be = torch.searchsorted(pends, block_starts, right=True).to(torch.int32)
    block_expert = torch.where(be < e, be, torch.full_like(be, -1))
    return Routing(sorted_ids, block_expert, counts)


def _route_fused(flat: Any, e: int, bm: int) -> Routing:
    import torch

    from tunedb.families.group_gemm.kernels import route_kernel

    slots = flat.numel()
    total = padded_len(slots, e, bm)
    dev = flat.device
    sorted_ids = torch.empty((total,), dtype=torch.int32, device=dev)
    block_expert = torch.empty((total // bm,), dtype=torch.int32, device=dev)
    counts = torch.empty((e,), dtype=torch.int32, device=dev)
    e_p2 = _e_p2(e)
    route_kernel[(1,)](flat, sorted_ids, block_expert, counts, slots, total, total // bm,
                       E=e, E_P2=e_p2, BM=bm, CHUNK=max(16, min(256, 8192 // e_p2)), num_warps=8)
    return Routing(sorted_ids, block_expert, counts)


def reference_route(topk_ids: Any, e: int, bm: int) -> tuple[list[int], list[int]]:
    """The same metadata by plain Python loops (for tests): (sorted_ids, block_expert)."""
    flat = [int(v) for v in topk_ids.reshape(-1).tolist()]
    slots = len(flat)
    rows: list[int] = []
    experts: list[int] = []
    for ex in range(e):
        mine = [s for s, v in enumerate(flat) if v == ex]
        if not mine:
            continue
        pad = -(-len(mine) // bm) * bm
        rows += mine + [slots] * (pad - len(mine))
        experts += [ex] * (pad // bm)
    total = padded_len(slots, e, bm)
    rows += [slots] * (total - len(rows))
    experts += [-1] * (total // bm - len(experts))
    return rows, experts
