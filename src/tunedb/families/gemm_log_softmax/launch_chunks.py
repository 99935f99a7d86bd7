"""The chunked linear_rows launch (docs/glsm_gap.md, "Chunks in L2"): M split into chunks of R
rows; for each chunk cuBLAS writes the logits straight into the output's rows (torch.addmm with
out=: no separate logits buffer) and the linear_rows row pass (launch.rows_pass) normalises
them in place right after, while the chunk's R x N logits are still in L2 (the validity
predicate sizes R so that they fit): the pass's read hits L2 and its write lands on dirty L2
lines, so HBM sees the logits about once instead of three times (GEMM write, pass read, pass
write).

streams=1 runs chunk after chunk on the caller's stream (the row pass may be a programmatic
dependent of its chunk's GEMM: `pdl`); streams=2 forks each chunk's row pass onto one side stream
(an event edge from the chunk's GEMM) so it overlaps the next chunk's GEMM, and joins the side
stream back at the end. Both are legal inside CUDA-graph capture (the fork/join becomes parallel
branches of the graph). Where there is no CUDA (CPU tensors, the interpreter) streams=2 runs as
streams=1. Imports torch lazily.
"""
from __future__ import annotations

from typing import Any

_SIDE: dict[Any, Any] = {}


def side_stream(device: Any) -> Any:
    """One side stream per device for the forked row passes, made on first use (a warm-up call
    makes it before any capture; a first call inside a capture takes one from torch's pool)."""
    import torch

    key = torch.device(device)
    s = _SIDE.get(key)
    if s is None:
        s = _SIDE[key] = torch.cuda.Stream(device=key)
    return s


def chunk_gemm(x: Any, weight: Any, bias: Any, y: Any) -> None:
    """y = x @ weight^T (+ bias), cuBLAS through aten (addmm: F.linear's own call) into y's rows."""
    import torch

    if bias is None:
        torch.mm(x, weight.t(), out=y)
    else:
        torch.addmm(bias, x, weight.t(), out=y)


def chunked_rows(x2: Any, weight: Any, bias: Any, y: Any, chunk_rows: int, streams: int, rows: int, chunk: int,
                 warps: int, pdl: bool = False, persist: int | None = None, vec: int | None = None) -> Any:
    """log_softmax(x2 @ weight^T + bias) into y [M, N] (contiguous rows), `chunk_rows` rows at a
    time; the row pass's own config is (rows, chunk, warps, pdl, persist) as linear_rows'. `pdl`
    applies on one stream only (a row pass on the side stream depends on its GEMM through an
    event, not as a programmatic dependent). Returns y."""
    import torch

    from tunedb.families.gemm_log_softmax.launch import rows_pass

    m = x2.shape[0]
    # one chunk (M <= R) has nothing to overlap: no fork
    side = side_stream(y.device) if streams > 1 and y.is_cuda and m > chunk_rows else None
    main = torch.cuda.current_stream(y.device) if side is not None else None
    for r0 in range(0, m, chunk_rows):
        yc = y[r0:r0 + chunk_rows]
        chunk_gemm(x2[r0:r0 + chunk_rows], weight, bias, yc)
        if side is None:
            rows_pass(yc, yc, rows, chunk, warps, pdl=pdl, vec=vec, persist=persist)
            continue
        side.wait_stream(main)  # this chunk's GEMM (and everything before it) precedes its pass
        with torch.cuda.stream(side):
            rows_pass(yc, yc, rows, chunk, warps, vec=vec, persist=persist)
    if side is not None:
        main.wait_stream(side)  # the caller's stream sees every pass done (and a capture joins)
    return y


def chunked_arm(config: Any, x: Any, weight: Any, bias: Any = None, out: Any = None, vec: int | None = None) -> Any:
    """The chunked_rows lane (configs_chunks.py): chunked_call with the config's parameters."""
    return chunked_call(x, weight, bias, out, config.param("chunk_rows"), config.param("streams"),
                        config.param("rows"), config.param("chunk"), config.param("warps"),
                        pdl=config.param("launch") == "pdl", persist=config.param("persist"), vec=vec)


def chunked_call(x: Any, weight: Any, bias: Any, out: Any, chunk_rows: int, streams: int, rows: int, chunk: int,
                 warps: int, pdl: bool = False, persist: int | None = None, vec: int | None = None) -> Any:
    """chunked_rows over x [..., K] into `out` [..., N] (allocated when None): the op's shapes."""
    import torch

    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    y = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    chunked_rows(x2, w, bias, y, chunk_rows, streams, rows, chunk, warps, pdl=pdl, persist=persist, vec=vec)
    return out if out is not None else y.view(*lead, n)
