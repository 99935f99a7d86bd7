"""torchao, the quantization library a user brings (issue 20: tunedb writes no quantizer of its
own): the schemes `tunedb census --quantization` applies online, the key of a torchao-quantized
Linear, and the census recorder for such Linears.

Schemes (torchao configs, dynamic activation quantization; tested with torchao 0.18.0):
- ``fp8-rowwise``: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()): e4m3 activation
  per token x weight per output channel -> scaled_mm_fp8 scale=row.
- ``fp8-block``: the same config with (PerBlock([1, 128]), PerBlock([128, 128])) -> scale=block.
- ``int8``: Int8DynamicActivationInt8WeightConfig(): int8 per token x per channel -> scaled_mm.

Why the census keys a quantized Linear at `F.linear` (a TorchFunctionMode) rather than at aten:
torchao's paths differ by device. On CUDA the fp8 row-wise path is aten._scaled_mm (the aten rules
see it), but the block path is torchao's own Triton op (ao::blockwise_fp8_gemm) and the int8 path
runs the out_dtype higher-order op; on meta or CPU, int8 becomes a float aten.mm and the block
path refuses to run without a GPU Triton. The weight (a torchao tensor subclass, often not a
Parameter's data the recorder can trace) says what the call is: its qdata is the 8-bit weight,
its scale's shape the scale mode. The aten recorder skips what runs inside such a call
(launch_table.recorded_call), so nothing is counted twice; on meta the call returns an empty
output of the right shape instead of running torchao's kernels.

Quantizing on meta or CPU: torchao refuses fp8 schemes off an sm89+ GPU (a hardware assert in
its config handler, torchao.float8.inference._check_hardware_support). A census only needs shapes,
so off a capable GPU the check is suspended while quantize_ runs (and only then).
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Any, Iterator

from tunedb.errors import CensusError
from tunedb.families.scaled_mm.configs import FP8_FAMILY, INT8_FAMILY, SCALE_BLOCK
from tunedb.families.scaled_mm.keys import make_signature
from tunedb.records import Signature

SCHEMES: tuple[str, ...] = ("fp8-rowwise", "fp8-block", "int8")
TORCHAO_TESTED = "0.18.0"  # the wheel the device carries (.stage/wheels); imports on torch 2.11 and 2.13
_OUT = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
# the census recorders now active: an optimized model's QuantizedLinear (patching.py) does not call
# F.linear, so it adds its own (signature, M) to the innermost one (tunedb census --fused)
ACTIVE: list[Any] = []


def require_torchao(scheme: str) -> Any:
    """The torchao module, or a CensusError naming the scheme and what is missing."""
    if scheme not in SCHEMES:
        raise CensusError(f"unknown quantization scheme {scheme!r}; schemes are {', '.join(SCHEMES)}")
    try:
        import torchao
        from torchao.quantization import quantize_  # noqa: F401 -- the API the schemes use
    except Exception as exc:  # ImportError, or a torchao built for another torch failing on import
        raise CensusError(
            f"--quantization {scheme} quantizes the model with torchao, which does not import here "
            f"({type(exc).__name__}: {str(exc)[:200]}); install it: pip install torchao=={TORCHAO_TESTED} "
            f"(offline: pip install --no-deps .stage/wheels/torchao-{TORCHAO_TESTED}-*.whl)") from exc
    return torchao


def torchao_config(scheme: str) -> Any:
    """The torchao quantization config of a scheme."""
    require_torchao(scheme)
    from torchao import quantization as q

    try:
        if scheme == "int8":
            return q.Int8DynamicActivationInt8WeightConfig()
        if scheme == "fp8-rowwise":
            return q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow())
        return q.Float8DynamicActivationFloat8WeightConfig(granularity=[q.PerBlock([1, SCALE_BLOCK]),
                                                                        q.PerBlock([SCALE_BLOCK, SCALE_BLOCK])])
    except (AttributeError, TypeError) as exc:
        import torchao

        raise CensusError(f"torchao {torchao.__version__} cannot express --quantization {scheme} "
                          f"({type(exc).__name__}: {exc}); tested with torchao {TORCHAO_TESTED}") from exc


def _capable_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@contextlib.contextmanager
def _shape_only_quantization(device: Any) -> Iterator[None]:
    """Off an sm89+ GPU, suspend torchao's fp8 hardware assert (the census runs no kernel)."""
    if str(device).startswith("cuda") and _capable_gpu():
        yield
        return
    import torchao.quantization.quant_api as api

    saved = getattr(api, "_check_hardware_support", None)
    if saved is not None:
        api._check_hardware_support = lambda *a, **k: None
    try:
        yield
    finally:
        if saved is not None:
            api._check_hardware_support = saved


def quantize_model(model: Any, scheme: str, device: Any = "meta") -> int:
    """Quantize every nn.Linear of `model` in place with torchao's config for `scheme`; returns
    how many Linears now hold a torchao weight. A model held as `.model` (a runner) works too."""
    import torch

    module = model if isinstance(model, torch.nn.Module) else getattr(model, "model", None)
    if not isinstance(module, torch.nn.Module):
        raise CensusError(f"--quantization needs a torch.nn.Module (or a runner holding one as .model); "
                          f"got {type(model).__name__}")
    config = torchao_config(scheme)
    from torchao.quantization import quantize_

    try:
        with _shape_only_quantization(device):
            quantize_(module, config)
    except Exception as exc:  # torchao's own checks (PerRow fp8 takes bf16 only): named, not a traceback
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in module.parameters()})
        raise CensusError(f"--quantization {scheme}: torchao could not quantize {type(module).__name__} "
                          f"(parameters {', '.join(dtypes) or 'none'}): {type(exc).__name__}: {exc}") from exc
    n = sum(1 for m in module.modules() if isinstance(m, torch.nn.Linear) and is_quantized(m.weight))
    if not n:
        raise CensusError(f"--quantization {scheme}: torchao quantized no Linear of {type(module).__name__}")
    return n


def is_quantized(weight: Any) -> bool:
    """Whether `weight` is a torchao W8A8 tensor as the ops compute it: 8-bit qdata and a scale,
    activations quantized dynamically and symmetrically, no activation pre-scale (SmoothQuant /
    AWQ) and no weight zero point other than zeros."""
    qdata = getattr(weight, "qdata", None)
    act = getattr(weight, "act_quant_kwargs", None)
    if qdata is None or getattr(weight, "scale", None) is None or act is None:
        return False
    if str(qdata.dtype) not in ("torch.float8_e4m3fn", "torch.int8"):
        return False
    if getattr(weight, "act_pre_scale", None) is not None or getattr(weight, "act_quant_scale", None) is not None:
        return False  # a pre-scaled or statically quantized activation is another op
    if "ASYMMETRIC" in str(getattr(act, "mapping_type", "")):
        return False
    zp = getattr(weight, "zero_point", None)
    if zp is not None and zp.device.type != "meta" and bool(zp.any()):
        return False
    return True


def scale_mode(weight: Any) -> str | None:
    """tensor / row / block from a torchao fp8 weight's scale shape (None: not one we serve)."""
    n, k = (int(d) for d in weight.qdata.shape)
    shape = tuple(int(d) for d in weight.scale.shape)
    if math.prod(shape) == 1:
        return "tensor"
    if shape in ((n, 1), (n,)):
        return "row"
    if shape == (-(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK)):
        return "block"
    return None


def linear_key(x: Any, weight: Any) -> tuple[Signature, int] | None:
    """(signature, M) of F.linear(x, weight) with a torchao W8A8 weight, or None when the call is
    not one the quantized families serve (weight-only, 3-D weights, an fp32 activation...)."""
    if not is_quantized(weight) or len(weight.qdata.shape) != 2:
        return None
    n, k = (int(d) for d in weight.qdata.shape)
    out = _OUT.get(str(x.dtype))
    if out is None or int(x.shape[-1]) != k:
        return None
    m = math.prod(int(d) for d in x.shape[:-1])
    if m < 1:
        return None
    if str(weight.qdata.dtype) == "torch.int8":
        return make_signature(INT8_FAMILY, "scaled_mm", n, k, out), m
    mode = scale_mode(weight)
    if mode is None or out != "bf16":
        return None
    return make_signature(FP8_FAMILY, "scaled_mm", n, k, "bf16", mode), m


def _function_mode() -> type:
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    from tunedb.runtime.launch_table import recorded_call

    class QuantizedLinearRecorder(TorchFunctionMode):
        """Counts (signature, M) of every F.linear with a torchao W8A8 weight (see the module doc)."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: Counter[tuple[Signature, int]] = Counter()

        def __enter__(self) -> Any:
            ACTIVE.append(self)  # QuantizedLinear (optimize()'s swap) records itself here
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            ACTIVE.remove(self)
            return super().__exit__(*exc)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear and len(args) >= 2:
                key = linear_key(args[0], args[1])
                if key is not None:
                    self.calls[key] += 1
                    x = args[0]
                    with recorded_call():
                        if x.device.type == "meta":
                            return torch.empty((*x.shape[:-1], key[0].get("N")), dtype=x.dtype, device=x.device)
                        return func(*args, **kwargs)
            return func(*args, **kwargs)

    return QuantizedLinearRecorder


def family_of(scheme: str) -> str | None:
    """The family a scheme's layers are keyed under (None: not a scheme of ours)."""
    return {"int8": INT8_FAMILY, "fp8-rowwise": FP8_FAMILY, "fp8-block": FP8_FAMILY}.get(scheme)


class Quantizer:
    """What `tunedb census --quantization SCHEME` asks of a family (the census_quantizer hook)."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        self.family = family_of(scheme)  # the family whose calls the census must find

    def require(self) -> None:
        require_torchao(self.scheme)

    def quantize(self, model: Any, device: Any) -> int:
        return quantize_model(model, self.scheme, device)

    def recorder(self) -> Any:
        return recorder()


def quantizer(scheme: str) -> Quantizer:
    return Quantizer(scheme)


def recorder() -> Any:
    """A fresh QuantizedLinearRecorder (a TorchFunctionMode: `with recorder() as rec:`)."""
    return _function_mode()()
