"""Routing metadata of a grouped GEMM: token slots sorted by expert, each expert's run padded to
a multiple of the tile height BM, and the expert of every BM block.

Everything is sized from static shapes (M, top_k, E, BM) and computed with device ops that never
read a value back to the host, so the metadata is part of a captured CUDA graph and of the op's
time as a user pays it. The padded length is bounded by slots + min(slots, E) * (BM - 1): at most
that many experts receive slots, each wasting under BM rows.
"""
from __future__ import annotations

from typing import Any, NamedTuple


class Routing(NamedTuple):
    sorted_ids: Any  # int32 [padded]: slot id (t * top_k + j) per padded row; `slots` marks padding
    block_expert: Any  # int32 [padded // BM]: the expert of each BM block, -1 past the last used
    counts: Any  # int32 [E]: slots per expert
    order: Any  # int64 [slots]: the slots sorted by expert (stable)


def padded_len(slots: int, e: int, bm: int) -> int:
    """The static upper bound of the padded row count, rounded up to whole BM blocks."""
    bound = slots + min(slots, e) * (bm - 1)
    return -(-bound // bm) * bm


def route(topk_ids: Any, e: int, bm: int) -> Routing:
    import torch

    flat = topk_ids.reshape(-1)
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
    return Routing(sorted_ids, block_expert, counts, order)


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
