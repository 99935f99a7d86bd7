"""The library arms of the small linear-algebra family, with launch.py's contract.

"torch": the forms a CUDA graph can capture (bmm, cholesky_ex, solve_triangular).
"torch_checked": what a user calling the obvious API pays: torch.linalg.cholesky and
torch.cholesky_solve check info on the host (a sync; not capturable; they raise on a non-SPD
input, so info is all zeros when they return). The result is copied into `out` only when the
caller gave one, so a timed torch arm without out= pays no extra copy.
"""
from __future__ import annotations

from typing import Any


def torch_arm(op: str, checked: bool, tensors: tuple, out: Any) -> Any:
    import torch

    a = tensors[0]
    info = None
    if op == "dot":
        res = torch.bmm(a.unsqueeze(1), tensors[1].unsqueeze(2)).view(a.shape[0])
    elif op == "gemv":
        res = torch.bmm(a, tensors[1].unsqueeze(2)).squeeze(2)
    elif op == "gemm":
        res = torch.bmm(a, tensors[1])
    elif op == "trsv":
        res = torch.linalg.solve_triangular(a, tensors[1].unsqueeze(2), upper=False).squeeze(2)
    elif op == "potrf":
        if checked:
            res = torch.linalg.cholesky(a)
            info = torch.zeros(a.shape[0], dtype=torch.int32, device=a.device)
        else:
            res, info = torch.linalg.cholesky_ex(a)
    elif op == "posv":
        b = tensors[1].unsqueeze(2)
        if checked:
            factor = torch.linalg.cholesky(a)
            res = torch.cholesky_solve(b, factor).squeeze(2)
            info = torch.zeros(a.shape[0], dtype=torch.int32, device=a.device)
        else:
            factor, info = torch.linalg.cholesky_ex(a)
            y = torch.linalg.solve_triangular(factor, b, upper=False)
            res = torch.linalg.solve_triangular(factor.mT, y, upper=True).squeeze(2)
    else:
        raise ValueError(f"unknown op {op!r}")
    if out is not None:
        out.copy_(res)
        res = out
    return res if info is None else (res, info)
