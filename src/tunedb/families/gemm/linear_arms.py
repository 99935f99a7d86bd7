"""Torch-only linear-layer arms (y = x @ W^T): a Problem that needs no kernel family.

The GPU tests and bench/protocol_fidelity.py validate the protocol with these: cuBLAS through
different entry points and layouts, plus deliberately wrong variants for the numerical gate.
torch is imported inside the functions.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tunedb.measure.arms import Arm, Problem
from tunedb.records import Signature

Body = Callable[[Any, Any, Any], Any]  # (x, w, out) -> launches into out


def _mm(x: Any, w: Any, out: Any) -> None:
    import torch

    torch.mm(x, w.t(), out=out)


def _make_mm_wt(args: tuple, kwargs: dict, out: Any) -> Callable[[], Any]:
    import torch

    x, w = args
    wt = w.t().contiguous()  # K x N, row-major: cuBLAS runs the NN variant
    return lambda: torch.mm(x, wt, out=out)


def _make_addmm(args: tuple, kwargs: dict, out: Any) -> Callable[[], Any]:
    import torch

    x, w = args
    bias = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    return lambda: torch.addmm(bias, x, w.t(), out=out)


def _k_truncated(x: Any, w: Any, out: Any) -> None:
    import torch

    half = x.shape[1] // 2
    torch.mm(x[:, :half], w[:, :half].t(), out=out)


def _column_zeroed(x: Any, w: Any, out: Any) -> None:
    _mm(x, w, out)
    out[:, 0].zero_()


BODIES: dict[str, Body] = {"torch": _mm, "k_truncated": _k_truncated, "column_zeroed": _column_zeroed}
FACTORIES = {"mm_wt": _make_mm_wt, "addmm": _make_addmm}


def _arm(cid: str, body: Body | None = None) -> Arm:
    if cid in FACTORIES and body is None:
        return Arm(cid, FACTORIES[cid])
    body = body or BODIES.get(cid) or BODIES.get(cid.split("#")[0])
    if body is None:
        raise ValueError(f"unknown linear arm {cid!r}; known: "
                         f"{', '.join(sorted([*BODIES, *FACTORIES]))} (an '#suffix' makes a twin)")

    def make(args: tuple, kwargs: dict, out: Any, _body: Body = body) -> Callable[[], Any]:
        x, w = args
        return lambda: _body(x, w, out)

    return Arm(cid, make)


def linear_problem(m: int, n: int, k: int, dtype: str = "bf16",
                   arms: Sequence[str] = ("torch", "mm_wt", "addmm"),
                   extra: dict[str, Body] | None = None) -> Problem:
    """Problem of y = x @ W^T (x: M x K, W: N x K) with the named arms (+ `extra` bodies).

    'torch#2' is a second, distinct arm running the same op as 'torch' (for A/A tests).
    """
    import torch

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]

    def make_inputs(device: Any, seed: int) -> tuple[tuple, dict]:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, k, generator=g, device=device, dtype=torch.float32).to(dt)
        w = (torch.randn(n, k, generator=g, device=device, dtype=torch.float32) / k**0.5).to(dt)
        return (x, w), {}

    def reference(args: tuple, kwargs: dict) -> Any:
        x, w = args
        return x.double() @ w.double().t()

    all_arms = [_arm(c) for c in arms] + [_arm(c, b) for c, b in (extra or {}).items()]
    sig = Signature.make("gemm", "gemm", dtype, N=n, K=k)
    return Problem(sig, m, tuple(all_arms), make_inputs=make_inputs, reference=reference,
                   weight_args=(1,), baseline=_arm("torch"))
