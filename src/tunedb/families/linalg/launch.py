"""Launching the small batched linear-algebra arms: `launch(op, config, *tensors, out=None, inplace=False)`.

Ops on row-major `[batch, n, n]` matrices and `[batch, n]` vectors (n in 2..128, any batch;
a non-contiguous input is made contiguous here, and that copy counts in the arm's time):

  dot(x, y)  -> [batch]              gemv(A, x) -> [batch, n] = A x
  gemm(A, B) -> [batch, n, n] = A B  trsv(L, b) -> x with L x = b (L lower; upper values never used)
  potrf(A)   -> (L, info)            posv(A, b) -> (x, info) with A x = b (A SPD)

fp32 and fp64 everywhere, fp16/bf16 also for dot/gemv/gemm (accumulated in fp32, fp64 in fp64).
potrf and posv read only the lower triangle of A. info is int32 [batch]: 0, or the 1-based
first column whose pivot is not positive (or NaN), as torch.linalg.cholesky_ex reports; the
other problems of the batch are unaffected, and a failed problem's L / x are unspecified for
the Triton arms (finite when its input is finite: a failed pivot is replaced by 1).

Writes (the in-place contract):
  - out=None allocates the result; `out=` writes it into a given contiguous tensor of the
    result's shape and dtype (for potrf/posv `out` is L / x; info is always allocated).
  - trsv: out may be b itself (inplace=True means out=b).
  - potrf: inplace=True writes L over A (out=A).
  - posv: inplace=True writes x over b and MAY overwrite A (the thread, panel and pdot packings
    keep their factor there; the others leave A intact). Without inplace, posv never writes A or b
    (those packings then allocate an [batch, n, n] workspace, counted in their time).
  - dot, gemv, gemm never write their inputs; out must not alias an input.
An in-place call consumes its input: time it against a ring of fresh inputs.

Configs: a Triton config id (`thread_p64_w2`, `warp_p8_w4`, `block_w4`, `lane_p2_w1`, `reg_p32_w1`,
`rows_p2_w1`, `shfl_p1_w1`, `panel_w2`, `pdot_w2`, `pdottf_w2`; see kernels_space), the dependency tier's `nvmath_b1` (potrf and posv
through cuSOLVERDx where nvmath-python is installed; kernels_nvmath), the CUDA C++ tier's
`cuda_p<P>_w<W>` / `cudas_p<P>_w<W>` (potrf and posv to n = 64, trsv to n = 32) and `cudat_t<TS>`
(all three at n = 33..128), compiled by NVRTC where torch has it (kernels_cuda, kernels_cuda_tile),
a KernelConfig, or an object with `.id`; and two library arms: "torch" (the capturable forms:
bmm for dot/gemv/gemm, cholesky_ex, solve_triangular, cholesky_ex + two solve_triangular for
posv) and "torch_checked" (what the obvious API costs: torch.linalg.cholesky and
torch.cholesky_solve, which sync on the host and cannot run inside a CUDA graph; potrf's info
is then all zeros or the call raises, as torch does). CPU tensors take any arm only under the
Triton interpreter; the family serves them the torch arm.
"""
from __future__ import annotations

from typing import Any

from tunedb.families.linalg import kernels_space as space

LIBRARY_ARMS = ("torch", "torch_checked")
# Which inputs are matrices, per op (the rest are vectors).
_ARGS = {"dot": "vv", "gemv": "mv", "gemm": "mm", "potrf": "m", "trsv": "mv", "posv": "mv"}


def launch(op: str, config: Any, *tensors: Any, out: Any = None, inplace: bool = False) -> Any:
    """Run `op` with `config` on `tensors`; see the module docstring for shapes and writes."""
    cid = config if isinstance(config, str) else getattr(config, "id", config)
    n, batch, dtype = _check(op, tensors)
    if inplace:
        if op not in ("potrf", "trsv", "posv"):
            raise ValueError(f"{op} has no in-place form (only potrf, trsv and posv do)")
        if out is not None:
            raise ValueError("pass either out= or inplace=True, not both")
        out = tensors[1] if op in ("trsv", "posv") else tensors[0]
    if cid in LIBRARY_ARMS:
        from tunedb.families.linalg.kernels_torch import torch_arm

        if out is not None:
            _out(op, tensors, n, batch, out)
        return torch_arm(op, cid == "torch_checked", tensors, out)
    out = _out(op, tensors, n, batch, out)
    if cid.startswith("nvmath"):  # the optional dependency tier (kernels_nvmath.py)
        from tunedb.families.linalg import kernels_nvmath

        bpb = kernels_nvmath.parse_bpb(cid)
        if bpb is None:
            raise ValueError(f"unknown config {cid!r}: the dependency tier's ids are nvmath_b<B>")
        return kernels_nvmath.launch(op, bpb, tensors, out, n, batch, dtype)
    if cid.startswith("cuda"):  # the CUDA C++ tier (kernels_cuda.py), compiled by NVRTC
        from tunedb.families.linalg import kernels_cuda

        return kernels_cuda.launch(op, cid, tensors, out, n, batch, dtype)
    cfg = space.parse_config(cid)
    why = space.invalid_reason(op, cfg.packing, cfg.problems, cfg.warps, n, dtype)
    if why:
        raise ValueError(f"config {cid!r} cannot run {op} at n={n}, {dtype}: {why}")
    return _triton(op, cfg, tensors, out, n, batch, inplace)


def _check(op: str, tensors: tuple) -> tuple[int, int, str]:
    import torch

    if op not in _ARGS:
        raise ValueError(f"unknown op {op!r}; ops: {', '.join(space.OPS)}")
    kinds = _ARGS[op]
    if len(tensors) != len(kinds):
        raise ValueError(f"{op} takes {len(kinds)} tensors, got {len(tensors)}")
    first = tensors[0]
    if not isinstance(first, torch.Tensor) or first.dim() < 2:
        raise ValueError(f"{op}: first argument must be a [batch, n{', n' if kinds[0] == 'm' else ''}] tensor")
    batch, n = first.shape[0], first.shape[-1]
    names = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
    for t, kind in zip(tensors, kinds):
        want = (batch, n, n) if kind == "m" else (batch, n)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            raise ValueError(f"{op}: expected shape {list(want)}, got {list(getattr(t, 'shape', [type(t).__name__]))}")
        if t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"{op}: all tensors must share dtype and device ({first.dtype}, {first.device}); "
                             f"got {t.dtype}, {t.device}")
    dtype = names.get(first.dtype)
    if dtype is None or (dtype in ("fp16", "bf16") and op not in space.HALF_OPS):
        allowed = "fp32, fp64, fp16, bf16" if op in space.HALF_OPS else "fp32, fp64"
        raise ValueError(f"{op}: dtype {first.dtype} not supported (allowed: {allowed})")
    if not space.N_MIN <= n <= space.N_MAX:
        raise ValueError(f"{op}: n={n} is outside {space.N_MIN}..{space.N_MAX}")
    return n, batch, dtype


def _out(op: str, tensors: tuple, n: int, batch: int, out: Any) -> Any:
    import torch

    a = tensors[0]
    shape = (batch,) if op == "dot" else (batch, n) if op in ("gemv", "trsv", "posv") else (batch, n, n)
    if out is None:
        return torch.empty(shape, dtype=a.dtype, device=a.device)
    if tuple(out.shape) != shape or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous():
        raise ValueError(f"{op}: out must be a contiguous {list(shape)} {a.dtype} tensor on {a.device}, "
                         f"got {list(out.shape)} {out.dtype} on {out.device} (contiguous={out.is_contiguous()})")
    if op in ("dot", "gemv", "gemm") and any(out.data_ptr() == t.data_ptr() for t in tensors):
        raise ValueError(f"{op}: out must not alias an input")
    return out


def _triton(op: str, cfg: space.KernelConfig, tensors: tuple, out: Any, n: int, batch: int, inplace: bool) -> Any:
    import torch
    import triton
    import triton.language as tl

    from tunedb.families.linalg import kernels_thread as kt
    from tunedb.families.linalg import kernels_tile as kw

    args = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    acc = tl.float64 if args[0].dtype == torch.float64 else tl.float32
    info = torch.empty((batch,), dtype=torch.int32, device=args[0].device) if op in ("potrf", "posv") else None
    if batch == 0:
        return (out, info) if info is not None else out
    grid = (triton.cdiv(batch, cfg.problems),)
    meta: dict[str, Any] = {"N": n, "P": cfg.problems, "num_warps": cfg.warps}
    if cfg.packing == "lane":
        from tunedb.families.linalg import kernels_lane as kl

        kern = {"potrf": kl.potrf_lane, "posv": kl.posv_lane}[op]
        meta["NP"] = space.next_pow2(n)
        meta["COLS"] = space.lane_columns(cfg.problems, cfg.warps, n)
    elif cfg.packing == "reg":
        from tunedb.families.linalg import kernels_reg as kr

        kern = {"potrf": kr.potrf_reg, "posv": kr.posv_reg}[op]
        meta["NP"] = space.next_pow2(n)
    elif cfg.packing == "rows":
        from tunedb.families.linalg import kernels_rows as kw_rows

        kern = {"potrf": kw_rows.potrf_rows, "posv": kw_rows.posv_rows}[op]
        meta["NP"] = space.next_pow2(n)
    elif cfg.packing == "shfl":
        from tunedb.families.linalg import kernels_shfl as ks

        kern = {"potrf": ks.potrf_shfl, "posv": ks.posv_shfl, "trsv": ks.trsv_shfl}[op]
        meta["NP"] = space.next_pow2(n)
        meta["CH"] = space.shfl_chunk(n)
    elif cfg.packing == "panel":
        from tunedb.families.linalg import kernels_panel as kp

        kern = {"potrf": kp.potrf_panel, "posv": kp.posv_panel, "trsv": kp.trsv_panel}[op]
        meta.pop("P")
        meta["NP"] = space.panel_rows(n, op)
        meta["B"], meta["KC"] = space.panel_shape("fp64" if args[0].dtype == torch.float64 else "fp32")
    elif cfg.packing in space.PDOT_PACKINGS:
        from tunedb.families.linalg import kernels_pdot as kd

        kern = {"potrf": kd.potrf_pdot, "posv": kd.posv_pdot}[op]
        meta.pop("P")
        meta.update(NP=space.panel_rows(n), B=space.PDOT_B, KC=space.PDOT_KC,
                    PREC="tf32x3" if cfg.packing == "pdottf" else "ieee")
    elif cfg.packing == "thread":
        kern = {"dot": kt.dot_thread, "gemv": kt.gemv_thread, "gemm": kt.gemm_thread,
                "potrf": kt.potrf_thread, "trsv": kt.trsv_thread, "posv": kt.posv_thread}[op]
    else:
        kern = {"dot": kw.dot_tile, "gemv": kw.gemv_tile, "gemm": kw.gemm_tile,
                "potrf": kw.potrf_tile, "trsv": kw.trsv_tile, "posv": kw.posv_tile}[op]
        meta["NP"] = space.next_pow2(n)
    if op in ("dot", "gemv", "gemm"):
        kern[grid](args[0], args[1], out, batch, ACC=acc, **meta)
        return out
    if op == "trsv":
        kern[grid](args[0], args[1], out, batch, **meta)
        return out
    if op == "potrf":
        kern[grid](args[0], out, info, batch, **meta)
        return out, info
    if cfg.packing in ("thread", "panel", *space.PDOT_PACKINGS):
        work = args[0] if inplace else torch.empty_like(args[0])
        kern[grid](args[0], args[1], out, work, info, batch, **meta)
    else:
        kern[grid](args[0], args[1], out, info, batch, **meta)
    return out, info
