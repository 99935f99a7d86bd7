"""The launches of gemm_log_softmax: the torch arm (F.linear then log_softmax, the fallback),
the fp32 reference, random inputs, the two fused Triton designs and the linear_rows lane
(F.linear, then kernels._rows_kernel over the logits); triton_rowfix launches in launch_rowfix.py,
chunked_rows in launch_chunks.py. Imports torch
lazily; the Triton kernels are imported on the first Triton launch.
"""
from __future__ import annotations

from typing import Any

from tunedb.families.gemm_log_softmax.configs import blocks, one_pass
from tunedb.records import Config, Signature

FIX_ROWS, FIX_COLS = 4, 1024  # the in-place fixup's program: 4 rows x 1024 columns
COMBINE_ROWS = 16  # rows a combine program reduces
STAT_CHUNK = 64  # partial statistics the combine reads per row and step


def torch_arm(x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """torch's own: linear (cuBLAS, logits in x's dtype) then log_softmax (fp32 inside, x's dtype out)."""
    import torch

    logits = torch.nn.functional.linear(x, weight, bias)
    if out is None:
        return torch.log_softmax(logits, dim=-1)
    torch.ops.aten._log_softmax.out(logits, -1, False, out=out.view(logits.shape))
    return out


def reference(x: Any, weight: Any, bias: Any = None, dtype: Any = None) -> Any:
    """log_softmax of the fp32 (or `dtype`) product of the upcast operands; fp32 out."""
    import torch

    dtype = dtype or torch.float32
    logits = torch.nn.functional.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return torch.log_softmax(logits, dim=-1)


def make_inputs(sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """((x [M, K], weight [N, K], bias [N] or None), {}): normal data, logits with a spread of a
    few units (a trained head's scale), so the softmax is neither flat nor one-hot."""
    import torch

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[sig.dt]
    n, k = sig.get("N"), sig.get("K")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x = torch.randn((m, k), generator=gen, device=device).to(dt)
    w = (torch.randn((n, k), generator=gen, device=device) * (3.0 * k ** -0.5)).to(dt)
    b = (torch.randn((n,), generator=gen, device=device) * 0.5).to(dt) if sig.get("bias") else None
    return (x, w, b), {}


def triton_arm(config: Config, x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """One of the fused designs: `triton_recompute` or `triton_fixup` (kernels.py)."""
    import torch

    from tunedb.families.gemm_log_softmax import kernels

    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    y = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk = blocks(config)
    t = -(-n // bn)
    pmax = torch.empty((m, t), dtype=torch.float32, device=x.device)
    psum = torch.empty((m, t), dtype=torch.float32, device=x.device)
    b = bias if bias is not None else w  # a placeholder pointer: HAS_BIAS=False never reads it
    grid = (-(-m // bm) * t,)
    opts = dict(num_warps=config.param("warps"), num_stages=config.param("stages"))
    fixup = config.lane == "triton_fixup"
    kernels._stats_kernel[grid](x2, w, b, y, pmax, psum, m, n, k, t, x2.stride(0), w.stride(0), y.stride(0),
                                HAS_BIAS=bias is not None, WRITE=fixup, BM=bm, BN=bn, BK=bk, **opts)
    lse = torch.empty((m,), dtype=torch.float32, device=x.device)
    kernels._combine_kernel[(-(-m // COMBINE_ROWS),)](pmax, psum, lse, m, t, RB=COMBINE_ROWS, TB=STAT_CHUNK,
                                                      num_warps=4)
    if fixup:
        kernels._fixup_kernel[(-(-m // FIX_ROWS), -(-n // FIX_COLS))](
            y, lse, m, n, y.stride(0), RB=FIX_ROWS, FN=FIX_COLS, num_warps=4)
    else:
        kernels._recompute_kernel[grid](x2, w, b, y, lse, m, n, k, x2.stride(0), w.stride(0), y.stride(0),
                                        HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, **opts)
    return out if out is not None else y.view(*lead, n)


def row_vec(n: int, *tensors: Any) -> int:
    """The widest VEC in 8/4/2/1 elements such that N and every tensor's row stride are
    multiples of it and every data pointer is VEC-element aligned: the kernels' divisibility hint
    (Triton specialises an int only when it divides by 16: N=5000 would otherwise get 2-byte loads)."""
    for vec in (8, 4, 2):
        if n % vec == 0 and all(t.stride(0) % vec == 0 and t.data_ptr() % (vec * t.element_size()) == 0
                                for t in tensors):
            return vec
    return 1


def rows_pass(logits: Any, y: Any, rows: int, chunk: int, warps: int, pdl: bool = False,
              vec: int | None = None, persist: int | None = None) -> None:
    """The row pass over [M, N] logits into y (may be the logits: in place): kernels._rows_kernel,
    or with `persist` P kernels._rows_stream_kernel on min(row blocks, P x SMs) programs (the
    interpreter counts 2 SMs: programs that each walk several blocks). `vec` None: row_vec's; 1
    reproduces the kernel before the hint (the bench's old arm). `pdl` waits on the previous
    kernel (F.linear's GEMM) under programmatic dependent launch; never under the interpreter."""
    from tunedb.families.gemm_log_softmax import kernels
    from tunedb.families.gemm_log_softmax.launch_rowfix import _interpreting, _sms

    m, n = logits.shape
    vec = row_vec(n, logits, y) if vec is None else vec
    interp = _interpreting()
    gdc = bool(pdl) and not interp
    extra = {"launch_pdl": True} if gdc else {}
    blocks_ = -(-m // rows)
    if persist:
        grid = min(blocks_, persist * (2 if interp else _sms(logits.device)))
        kernels._rows_stream_kernel[(grid,)](logits, y, m, n, logits.stride(0), y.stride(0), R=rows, C=chunk,
                                             VEC=vec, GDC=gdc, num_warps=warps, num_stages=1, **extra)
        return
    kernels._rows_kernel[(blocks_,)](logits, y, m, n, logits.stride(0), y.stride(0), R=rows, C=chunk,
                                     ONE=one_pass(chunk, n), VEC=vec, GDC=gdc, num_warps=warps, **extra)


def rows_arm(config: Config, x: Any, weight: Any, bias: Any = None, out: Any = None, vec: int | None = None) -> Any:
    """linear_rows: cuBLAS's logits (in x's dtype, as torch's arm rounds them), then one Triton
    pass subtracting each row's log-sum-exp in place. Without `out` the logits are F.linear's
    own tensor; with `out` cuBLAS writes them straight into it (addmm with out=, F.linear's
    call on 2-D input), so the pass reads and rewrites one buffer either way: a separate logits
    buffer made the pass write lines it had not read, which cost 3-10% at N = 5000 (s19 A,
    bench/glsm_l2.py), and the build times the arm with `out`."""
    import torch

    rp = dict(pdl=config.param("launch") == "pdl", vec=vec, persist=config.param("persist"))
    if out is None:
        logits = torch.nn.functional.linear(x, weight, bias)
        n = logits.shape[-1]
        lg = logits.reshape(-1, n)
        rows_pass(lg, lg, config.param("rows"), config.param("chunk"), config.param("warps"), **rp)
        return logits
    from tunedb.families.gemm_log_softmax.launch_chunks import chunk_gemm

    n, k = weight.shape
    x2 = x.reshape(-1, k)
    y = out.view(x2.shape[0], n)
    chunk_gemm(x2, weight, bias, y)
    rows_pass(y, y, config.param("rows"), config.param("chunk"), config.param("warps"), **rp)
    return out


def launch(config: Config, sig: Signature, x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    if config.is_sentinel:  # default and torch: the framework's own two ops
        return torch_arm(x, weight, bias, out)
    if config.lane == "linear_rows":
        return rows_arm(config, x, weight, bias, out)
    if config.lane == "triton_rowfix":
        from tunedb.families.gemm_log_softmax.launch_rowfix import rowfix_arm

        return rowfix_arm(config, x, weight, bias, out)
    if config.lane == "chunked_rows":
        from tunedb.families.gemm_log_softmax.launch_chunks import chunked_arm

        return chunked_arm(config, x, weight, bias, out)
    return triton_arm(config, x, weight, bias, out)
