"""The tuned quantized GEMMs as torch.library ops, and their Python entry points:

    tunedb::scaled_mm_int8(x, weight, x_scale, w_scale, out_dtype=None) -> y          (bf16 default)
    tunedb::scaled_mm_int8_quant(x, weight, x_scale, w_scale) -> (q int8, s fp32 [..., 1])
    tunedb::scaled_mm_fp8(x, weight, x_scale, w_scale, scale='', out_dtype=None) -> y  (bf16)
    tunedb::scaled_mm_fp8_quant(x, weight, x_scale, w_scale, scale='') -> (q fp8, s)

x [..., K] and weight [N, K] are int8 or float8_e4m3fn; the scales are fp32 in the layouts of
keys.scale_shapes (scale='' infers the fp8 mode from w_scale). A CUDA call resolves through the
selector (user tier, system tier, then the `heuristic` sentinel: torch._scaled_mm for fp8
per-tensor / row-wise scales, a Triton tile otherwise), falls back to the heuristic where the
chosen arm cannot run at this M (torch._int_mm at M <= 16), and launches; CPU tensors
take a torch path that computes the same bits as the CUDA int8 arms (fp8: the fp32 product,
rounded once). No host synchronisation and no Python state change per call: CUDA graphs capture
the launches; the fake kernels give torch.compile the output shapes (the op stays opaque).
Importing this module registers the ops (it imports torch).
"""
from __future__ import annotations

from typing import Any

import torch

from tunedb import families
from tunedb.runtime import grad_form, selector
from tunedb.errors import ArgumentTypeError
from tunedb.families.key_rules import check_mode, check_operands
from tunedb.families.scaled_mm import arms, configs
from tunedb.records import Config, Signature

_lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive for the process
_lib.define("scaled_mm_int8(Tensor x, Tensor weight, Tensor x_scale, Tensor w_scale, "
            "ScalarType? out_dtype=None) -> Tensor")
_lib.define("scaled_mm_int8_quant(Tensor x, Tensor weight, Tensor x_scale, Tensor w_scale) -> (Tensor, Tensor)")
_lib.define("scaled_mm_fp8(Tensor x, Tensor weight, Tensor x_scale, Tensor w_scale, str scale='', "
            "ScalarType? out_dtype=None) -> Tensor")
_lib.define("scaled_mm_fp8_quant(Tensor x, Tensor weight, Tensor x_scale, Tensor w_scale, "
            "str scale='') -> (Tensor, Tensor)")

_HEURISTIC = Config.sentinel("heuristic")
_QUANT_OUT = {configs.INT8_FAMILY: torch.int8, configs.FP8_FAMILY: torch.float8_e4m3fn}


def _key(family: str, op: str, x: Any, weight: Any, x_scale: Any, w_scale: Any,
         scale: str, out_dtype: Any) -> tuple[Signature, int]:
    fam = families.get(family)
    if op == "scaled_mm_quant":
        out_dtype = _QUANT_OUT[family]
    return fam.signature_of(op, x, weight, x_scale, w_scale, out_dtype or torch.bfloat16, scale or None)


def chosen(family: str, sig: Signature, m: int) -> Config:
    """The config a CUDA call of `sig` at M runs: the selector's, or the heuristic where that
    one cannot run at this M (the predicate asked with the exact M)."""
    config = selector.resolve(family, sig, m).config
    if config.id in ("heuristic", "default"):
        return _HEURISTIC
    _, profile = selector.current_arch()
    if profile is not None and families.get(family).invalid_reason(config, sig, m, profile):
        return _HEURISTIC
    return config


def served(family: str, sig: Signature, m: int, sms: int = 132) -> Config:
    """The concrete arm a CUDA call of `sig` at M runs: `chosen`, with the `heuristic` sentinel
    resolved by its rule (configs.heuristic_config: `torch` for fp8 per-tensor / row-wise scales,
    else a tile), as the launcher resolves it (launch._heuristic)."""
    config = chosen(family, sig, m)
    if config.id in ("heuristic", "default"):
        return configs.heuristic_config(sig, max(m, 1), sms)
    return config


def rows_scale(x: Any, x_scale: Any) -> Any:
    """x_scale over x's leading dims ([..., 1], what the `_quant` ops return for an x of more
    than two dims; [...]; or [..., ceil(K/128)] for block scales) as the [M, ...] the keys take;
    any other shape unchanged (the keys name it)."""
    if (isinstance(x, torch.Tensor) and isinstance(x_scale, torch.Tensor) and x.dim() > 2
            and x_scale.dim() >= x.dim() - 1):
        lead = tuple(x.shape[:-1])
        if x.dim() == 3 and x.shape[1] == 1 and x_scale.dim() == 2 and x_scale.shape[0] == x.shape[0] > 0:
            # already the keys' [M, ...] form: x [B, 1, K] with a [B, 1] scale (a row scale, or a
            # block scale at K <= 128) was flattened to [B] and refused as a block scale
            return x_scale
        if tuple(x_scale.shape) == lead:
            return x_scale.reshape(-1)
        if x_scale.dim() == x.dim() and tuple(x_scale.shape[:-1]) == lead:
            return x_scale.reshape(-1, x_scale.shape[-1])
    return x_scale


def _serve(family: str, op: str, x: Any, weight: Any, x_scale: Any, w_scale: Any,
           scale: str, out_dtype: Any) -> Any:
    x_scale = rows_scale(x, x_scale)
    sig, m = _key(family, op, x, weight, x_scale, w_scale, scale, out_dtype)
    if not x.is_cuda:
        return _cpu(sig, x, weight, x_scale, w_scale)
    if m == 0:  # an empty batch launches nothing (a vendor GEMM need not take M=0)
        return _fake(family, op, x, weight, x_scale, w_scale, scale, out_dtype)
    fam = families.get(family)
    return fam.launcher(chosen(family, sig, m), sig)(x, *dense(weight, x_scale, w_scale), None)


def dense(weight: Any, x_scale: Any, w_scale: Any) -> tuple[Any, Any, Any]:
    """The weight and scales in the layouts every arm takes: torch._scaled_mm (the fp8
    `heuristic` for per-tensor / row-wise scales) refuses a weight passed as a transposed view
    (mat2 must be column-major) and an expanded row-wise scale, which the Triton lanes copy."""
    w = weight if weight.is_contiguous() else weight.contiguous()
    return w, x_scale.contiguous(), w_scale.contiguous()


def cpu_product(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any) -> Any:
    """The fp32 product [M, N] the CPU path rounds: int8 in exact integer arithmetic with the
    CUDA arms' epilogue order ((acc * x_scale) * w_scale); fp8 of the dequantized operands."""
    if sig.dt == "int8":
        return arms.exact_int8(sig, x, weight, x_scale, w_scale)
    return arms.product(sig, x, weight, x_scale, w_scale).reshape(-1, sig.get("N"))


def _cpu(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any) -> Any:
    """The CPU path: cpu_product rounded once to the output (or quantized per row)."""
    n = sig.get("N")
    y = cpu_product(sig, x, weight, x_scale, w_scale)
    if sig.op == "scaled_mm_quant":
        q, s = arms.quantize_rows(y, sig.get("out"))
        return q.view(*x.shape[:-1], n), s.view(*x.shape[:-1], 1)
    return y.to(arms.torch_dtype(sig.get("out"))).view(*x.shape[:-1], n)


def _int8_impl(x, weight, x_scale, w_scale, out_dtype=None):
    return _serve(configs.INT8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, "", out_dtype)


def _int8_quant_impl(x, weight, x_scale, w_scale):
    return _serve(configs.INT8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, "", None)


def _fp8_impl(x, weight, x_scale, w_scale, scale="", out_dtype=None):
    return _serve(configs.FP8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, scale, out_dtype)


def _fp8_quant_impl(x, weight, x_scale, w_scale, scale=""):
    return _serve(configs.FP8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, scale, None)


for _name, _fn in (("scaled_mm_int8", _int8_impl), ("scaled_mm_int8_quant", _int8_quant_impl),
                   ("scaled_mm_fp8", _fp8_impl), ("scaled_mm_fp8_quant", _fp8_quant_impl)):
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")


def _torch_form(family: str, op: str, x, weight, x_scale, w_scale, scale, out_dtype):
    """Where a gradient is wanted (a learnable scale, an fp8 operand requiring grad; forward-mode
    tangents too): the CPU path's torch math on the inputs' device, which autograd differentiates.
    The served arms have no backward: below autograd the gradient was dropped without a word."""
    x_scale = rows_scale(x, x_scale)
    sig, _ = _key(family, op, x, weight, x_scale, w_scale, scale, out_dtype)
    return _cpu(sig, x, weight, x_scale, w_scale)


grad_form.register(_lib, "scaled_mm_int8", lambda x, weight, x_scale, w_scale, out_dtype=None: _torch_form(
    configs.INT8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, "", out_dtype))
grad_form.register(_lib, "scaled_mm_int8_quant", lambda x, weight, x_scale, w_scale: _torch_form(
    configs.INT8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, "", None))
grad_form.register(_lib, "scaled_mm_fp8", lambda x, weight, x_scale, w_scale, scale="", out_dtype=None: _torch_form(
    configs.FP8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, scale, out_dtype))
grad_form.register(_lib, "scaled_mm_fp8_quant", lambda x, weight, x_scale, w_scale, scale="": _torch_form(
    configs.FP8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, scale, None))


def _fake(family: str, op: str, x, weight, x_scale, w_scale, scale, out_dtype):
    x_scale = rows_scale(x, x_scale)
    sig, _ = _key(family, op, x, weight, x_scale, w_scale, scale, out_dtype)
    n = weight.shape[0]
    out = arms.torch_dtype(sig.get("out"))
    y = x.new_empty((*x.shape[:-1], n), dtype=out)
    if op == "scaled_mm_quant":
        return y, x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
    return y


@torch.library.register_fake("tunedb::scaled_mm_int8", lib=_lib)
def _int8_fake(x, weight, x_scale, w_scale, out_dtype=None):
    return _fake(configs.INT8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, "", out_dtype)


@torch.library.register_fake("tunedb::scaled_mm_int8_quant", lib=_lib)
def _int8_quant_fake(x, weight, x_scale, w_scale):
    return _fake(configs.INT8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, "", None)


@torch.library.register_fake("tunedb::scaled_mm_fp8", lib=_lib)
def _fp8_fake(x, weight, x_scale, w_scale, scale="", out_dtype=None):
    return _fake(configs.FP8_FAMILY, "scaled_mm", x, weight, x_scale, w_scale, scale, out_dtype)


@torch.library.register_fake("tunedb::scaled_mm_fp8_quant", lib=_lib)
def _fp8_quant_fake(x, weight, x_scale, w_scale, scale=""):
    return _fake(configs.FP8_FAMILY, "scaled_mm_quant", x, weight, x_scale, w_scale, scale, None)


# --- Python entry points (the ops through the dispatcher) ---------------------------------

_INT8 = object()  # the int8 ops take no scale mode
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DTYPE = torch.dtype


def _check_args(what: str, x: Any, weight: Any, x_scale: Any, w_scale: Any, scale: Any) -> None:
    """ArgumentTypeError naming an argument of the wrong Python type before the op's schema refuses
    it in its own words (a number where a tensor belongs, scale=1; out_dtype: _check_out, on every
    path). Plain tensors (every good call) cost four type reads."""
    if (type(x) not in _PLAIN or type(weight) not in _PLAIN or type(x_scale) not in _PLAIN
            or type(w_scale) not in _PLAIN):
        check_operands(what, x=x, weight=weight, x_scale=x_scale, w_scale=w_scale)
    if scale is not _INT8 and type(scale) is not str:
        check_mode(what, "scale", scale, ("", *configs.SCALES[configs.FP8_FAMILY]))


def _check_out(what: str, out_dtype: Any) -> None:
    if out_dtype is not None and type(out_dtype) is not _DTYPE:
        raise ArgumentTypeError(f"{what}'s out_dtype must be a torch.dtype or None, got "
                                f"{type(out_dtype).__name__} {out_dtype!r}")


def scaled_mm_int8(x: Any, weight: Any, x_scale: Any, w_scale: Any, out_dtype: Any = None) -> Any:
    """(x @ weight.T) * x_scale[row] * w_scale[col], int32-exact, rounded once to out_dtype."""
    _check_out("scaled_mm_int8", out_dtype)  # every path (the direct one too): one TypeError everywhere
    if grad_form.direct((x, weight, x_scale, w_scale)):  # the eager hot path: no dispatcher hop
        return _int8_impl(x, weight, x_scale, w_scale, out_dtype)
    _check_args("scaled_mm_int8", x, weight, x_scale, w_scale, _INT8)
    return torch.ops.tunedb.scaled_mm_int8(x, weight, x_scale, w_scale, out_dtype)


def scaled_mm_int8_quant(x: Any, weight: Any, x_scale: Any, w_scale: Any) -> tuple[Any, Any]:
    _check_args("scaled_mm_int8_quant", x, weight, x_scale, w_scale, _INT8)
    return torch.ops.tunedb.scaled_mm_int8_quant(x, weight, x_scale, w_scale)


def scaled_mm_fp8(x: Any, weight: Any, x_scale: Any, w_scale: Any, scale: str | None = "",
                  out_dtype: Any = None) -> Any:
    """scale: "tensor", "row", "block", or "" / None to infer it from w_scale's shape."""
    if scale is None:  # inferred, as "" (the direct path took None so; the dispatcher's schema did not)
        scale = ""
    _check_out("scaled_mm_fp8", out_dtype)
    if grad_form.direct((x, weight, x_scale, w_scale)):
        return _fp8_impl(x, weight, x_scale, w_scale, scale, out_dtype)
    _check_args("scaled_mm_fp8", x, weight, x_scale, w_scale, scale)
    return torch.ops.tunedb.scaled_mm_fp8(x, weight, x_scale, w_scale, scale, out_dtype)


def scaled_mm_fp8_quant(x: Any, weight: Any, x_scale: Any, w_scale: Any,
                        scale: str | None = "") -> tuple[Any, Any]:
    if scale is None:
        scale = ""
    _check_args("scaled_mm_fp8_quant", x, weight, x_scale, w_scale, scale)
    return torch.ops.tunedb.scaled_mm_fp8_quant(x, weight, x_scale, w_scale, scale)
