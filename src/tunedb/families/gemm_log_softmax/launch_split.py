"""The split_rows lane's launch (configs_split.py says the design): cuBLAS writes the logits into
the output (launch_chunks.chunk_gemm: addmm with out=, F.linear's own call), then
kernels_rowfix._chunk_stats_kernel stores every (row, chunk)'s max and sum of exp and
kernels_rowfix._fix_kernel combines each row's partials and subtracts its log-sum-exp in place.
Imports torch lazily; the kernels are imported on the first launch.
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Config


def split_arm(config: Config, x: Any, weight: Any, bias: Any = None, out: Any = None,
              vec: int | None = None) -> Any:
    """log_softmax(x @ weight^T + bias) into `out` (or a new tensor in x's dtype). `vec` None:
    launch.row_vec's divisibility hint over the output."""
    import torch

    from tunedb.families.gemm_log_softmax import kernels_rowfix as kr
    from tunedb.families.gemm_log_softmax.launch import row_vec
    from tunedb.families.gemm_log_softmax.launch_chunks import chunk_gemm
    from tunedb.families.gemm_log_softmax.launch_rowfix import _interpreting, stat_block

    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    chunk_gemm(x2, weight, bias, y)
    if m:
        c, warps = config.param("chunk"), config.param("warps")
        t = -(-n // c)
        pmax = torch.empty((m, t), dtype=torch.float32, device=x.device)
        psum = torch.empty((m, t), dtype=torch.float32, device=x.device)
        vec = row_vec(n, y) if vec is None else vec
        gdc = config.param("launch", "plain") == "pdl" and not _interpreting()
        extra = {"launch_pdl": True} if gdc else {}
        kr._chunk_stats_kernel[(m * t,)](y, pmax, psum, m, n, t, y.stride(0), FN=c, GDC=gdc, VEC=vec,
                                         num_warps=warps, **extra)
        kr._fix_kernel[(m * t,)](y, pmax, psum, m, n, t, y.stride(0), FN=c, TB=stat_block(t), GDC=gdc, VEC=vec,
                                 num_warps=warps, **extra)
    return out if out is not None else y.view(*lead, n)
