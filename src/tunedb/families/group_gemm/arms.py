"""The torch arms, the fp32 reference and random inputs of the grouped GEMM.

- loop: one cuBLAS GEMM per expert that received slots (index_select, F.linear, index_copy):
  what a plain PyTorch MoE layer runs. It reads the per-expert counts back to the host (one
  synchronisation per call), so it cannot be captured in a CUDA graph.
- grouped_mm: torch._grouped_mm over the slots sorted by expert (offsets = cumulative counts),
  no host synchronisation. Present only where this torch has the op and runs it for the dtype
  and device (`grouped_mm_reason`); never emulated.
- torch (the sentinel and the pick rule's fallback): grouped_mm where it runs, else the loop.
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Signature


def torch_dtype(dt: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]


def _version() -> tuple[int, int]:
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def grouped_mm_reason(dt: str, device: Any, n: int | None = None, k: int | None = None) -> str | None:
    """Why torch._grouped_mm cannot serve this call here (None when it can). torch 2.8 has it for
    bf16 on sm90 only; 2.9+ runs sm80+ (torch 2.11 and 2.13 share the schema
    `_grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None)`). Operand rows must be
    16-byte aligned (N, K multiples of 8)."""
    import torch

    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if dt != "bf16":
        return f"torch._grouped_mm serves bf16 here, not {dt}"
    if n is not None and (n % 8 or k % 8):
        return f"torch._grouped_mm needs N and K multiples of 8 (N={n}, K={k})"
    dev = torch.device(device)
    if dev.type == "cuda":
        cap = torch.cuda.get_device_capability(dev)
        if _version() >= (2, 9):
            return None if cap >= (8, 0) else f"torch._grouped_mm needs sm80+, device is sm{cap[0]}{cap[1]}"
        return None if cap[0] == 9 else f"torch {torch.__version__}'s _grouped_mm runs on sm90 only"
    if dev.type == "cpu" and _version() >= (2, 9):
        return None
    return f"torch._grouped_mm does not run on {dev.type} with torch {torch.__version__}"


def _rows(x: Any, sig: Signature) -> tuple[Any, bool]:
    """x as a 2-D row matrix and whether its rows are slots (else tokens)."""
    return x.reshape(-1, x.shape[-1]), sig.get("x") == "slot"


def _finish(ys: Any, order: Any, topk_weights: Any, out: Any, m: int, top_k: int, n: int) -> Any:
    """Rows computed in expert order -> y [M, top_k, N] by slot, times the routing weights.
    Returns `out` itself when given (the `out=` convention the Triton arm and callers rely on)."""
    import torch

    flat = torch.empty((m * top_k, n), dtype=ys.dtype, device=ys.device) if out is None else out.view(m * top_k, n)
    if topk_weights is not None:
        # in place, computed in the wider of the two dtypes and rounded once (one kernel, not
        # the four of upcast, multiply, downcast)
        ys.mul_(topk_weights.reshape(-1)[order].unsqueeze(1))
    flat.index_copy_(0, order, ys)
    return flat.view(m, top_k, n) if out is None else out


def grouped_mm(sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None) -> Any:
    import torch

    m, top_k = topk_ids.shape
    e, n, _ = weight.shape
    rows, per_slot = _rows(x, sig)
    flat = topk_ids.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    # offs[ex] = slots with expert <= ex, read off the sorted ids (no count-and-cumsum kernels)
    offs = torch.searchsorted(sorted_e, torch.arange(1, e + 1, dtype=sorted_e.dtype, device=flat.device),
                              out_int32=True)
    xs = rows.index_select(0, order if per_slot else order // top_k)
    ys = torch._grouped_mm(xs, weight.transpose(1, 2), offs=offs)
    return _finish(ys, order, topk_weights, out, m, top_k, n)


def loop(sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None) -> Any:
    import torch
    import torch.nn.functional as F

    m, top_k = topk_ids.shape
    e, n, _ = weight.shape
    rows, per_slot = _rows(x, sig)
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e).tolist()  # the host sync a Python loop pays
    ys = torch.empty((m * top_k, n), dtype=x.dtype, device=x.device)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            sl = order[start:start + c]
            ys[start:start + c] = F.linear(rows.index_select(0, sl if per_slot else sl // top_k), weight[ex])
            start += c
    return _finish(ys, order, topk_weights, out, m, top_k, n)


def torch_arm(sig: Signature, device: Any) -> Any:
    """The fallback's implementation on this device: grouped_mm where it runs, else the loop."""
    if grouped_mm_reason(sig.dt, device, sig.get("N"), sig.get("K")) is None:
        return grouped_mm
    return loop


def reference(sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
              dtype: Any = None) -> Any:
    """fp32 (or `dtype`) on upcast inputs: every slot's row times its expert's weight, one
    expert at a time (a gathered [M, top_k, N, K] weight would not fit at model sizes)."""
    import torch

    dtype = dtype or torch.float32
    m, top_k = topk_ids.shape
    e, n, k = weight.shape
    rows = x.reshape(-1, k)
    flat = topk_ids.reshape(-1).long()
    y = torch.zeros((m * top_k, n), dtype=dtype, device=x.device)
    for ex in range(e):
        slots = (flat == ex).nonzero().flatten()
        if slots.numel():
            src = slots if sig.get("x") == "slot" else slots // top_k
            y[slots] = rows.index_select(0, src).to(dtype) @ weight[ex].to(dtype).T
    if topk_weights is not None:
        y = y * topk_weights.reshape(-1, 1).to(dtype)
    return y.view(m, top_k, n)


def random_routing(m: int, e: int, top_k: int, gen: Any, device: Any) -> Any:
    """Distinct experts per token, uniformly at random (int32 [m, top_k])."""
    import torch

    scores = torch.rand((m, e), generator=gen)
    return scores.topk(top_k, dim=1).indices.to(torch.int32).to(device)


def make_inputs(sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """x, the stacked weights [E, N, K], a random top-k routing, and for x=slot (the down
    projection, where a MoE layer applies them) softmax-like routing weights."""
    import torch

    e, n, k, top_k = (sig.get(f) for f in ("E", "N", "K", "top_k"))
    gen = torch.Generator().manual_seed(seed)
    # the operands are drawn where they live: a model's stacked experts (1.9 GB for Mixtral's
    # gate/up) would take seconds to draw on the host
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(sig.dt)
    shape = (m, k) if sig.get("x") == "token" else (m, top_k, k)
    x = (torch.randn(shape, generator=dev_gen, device=device) * 0.5).to(dt)
    w = torch.randn((e, n, k), generator=dev_gen, device=device, dtype=dt) / k ** 0.5
    ids = random_routing(m, e, top_k, gen, device)
    if sig.get("x") == "token":
        return (x, w, ids), {}
    tw = torch.softmax(torch.randn((m, top_k), generator=gen), dim=1).to(device)
    return (x, w, ids, tw), {}
