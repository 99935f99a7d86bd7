"""Launching a group_gemm config: the routing metadata for the config's BM, then one Triton
launch over all experts; a triton_slots config's one launch (no metadata); or the torch arm (`torch` sentinel). Nothing here synchronises with
the host on the Triton path, so a call is captured whole by a CUDA graph."""
from __future__ import annotations

import os
from typing import Any, Callable

from tunedb.families.group_gemm import arms, configs
from tunedb.families.group_gemm.routing import route
from tunedb.records import Config, Signature

Launcher = Callable[..., Any]


def triton_launch(config: Config, sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
                  out: Any = None) -> Any:
    import torch

    from tunedb.families.group_gemm.kernels import group_gemm_kernel

    if config.lane == configs.SLOTS_LANE:
        return slots_launch(config, sig, x, weight, topk_ids, topk_weights, out)
    bm, bn, bk = configs.blocks(config)
    m, top_k = topk_ids.shape
    e, n, k = weight.shape
    per_slot = sig.get("x") == "slot"
    rows = x.reshape(-1, k)
    r = route(topk_ids, e, bm)
    if out is None:
        out = torch.empty((m, top_k, n), dtype=x.dtype, device=x.device)
    y = out.view(m * top_k, n)
    # contiguous: reshape may return a strided view (top_k=1 of a wider tensor); kernels read stride 1
    tw = topk_weights.reshape(-1).contiguous() if topk_weights is not None else r.counts  # the kernel upcasts
    num_blocks_m = r.block_expert.numel()
    grid = (num_blocks_m * -(-n // bn),)
    group_gemm_kernel[grid](
        rows, weight, y, tw, r.sorted_ids, r.block_expert, m * top_k, num_blocks_m, top_k, n, k,
        rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
        y.stride(0), y.stride(1),
        X_PER_SLOT=per_slot, WEIGHTED=topk_weights is not None,
        BM=bm, BN=bn, BK=bk, GROUP_M=config.param("group_m"),
        num_warps=config.param("warps"), num_stages=config.param("stages"))
    return out


def slots_launch(config: Config, sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
                 out: Any = None) -> Any:
    """The routing-free lane: one launch, no metadata ops; ids and weights read as they come."""
    import torch

    from tunedb.families.group_gemm.kernels import slot_gemv_kernel

    _, bn, bk = configs.blocks(config)
    m, top_k = topk_ids.shape
    e, n, k = weight.shape
    rows = x.reshape(-1, k)
    if out is None:
        out = torch.empty((m, top_k, n), dtype=x.dtype, device=x.device)
    slots = m * top_k
    if slots == 0:
        return out
    y = out.view(slots, n)
    ids = topk_ids.reshape(-1).contiguous()  # the kernel reads stride 1
    tw = topk_weights.reshape(-1).contiguous() if topk_weights is not None else ids
    grid = (slots * -(-n // bn),)
    slot_gemv_kernel[grid](
        rows, weight, y, tw, ids, slots, top_k, n, k,
        rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
        y.stride(0), y.stride(1), X_PER_SLOT=sig.get("x") == "slot", WEIGHTED=topk_weights is not None,
        BN=bn, BK=bk, STAGES=config.param("stages"), num_warps=config.param("warps"),
        num_stages=config.param("stages"))
    return out


def launcher(config: Config, sig: Signature) -> Launcher:
    """The callable that runs `config` for `sig`: (x, weight, topk_ids, topk_weights=None, out=None)."""
    if config.id == "torch":
        def run_torch(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None) -> Any:
            return arms.torch_arm(sig, x.device)(sig, x, weight, topk_ids, topk_weights, out)
        return run_torch
    cfg = configs.default_config(sig) if config.id == "default" else config

    def run(x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None) -> Any:
        if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            # Triton runs CPU tensors only under its interpreter: the torch arm serves them
            return arms.torch_arm(sig, x.device)(sig, x, weight, topk_ids, topk_weights, out)
        return triton_launch(cfg, sig, x, weight, topk_ids, topk_weights, out)
    return run


def launch(config: Config, sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
           out: Any = None) -> Any:
    return launcher(config, sig)(x, weight, topk_ids, topk_weights, out)
