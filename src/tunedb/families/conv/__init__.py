"""The convolution family (issue 25, spec 000's conv1d table and conv2d ops): conv1d (depthwise,
pointwise and dense, with stride, padding, dilation and groups in the key) and conv2d (+ a fused
activation), size axis M = B * T_out (conv2d: B * H_out * W_out). See docs/conv.md.

One family, two ops: both ops share the arms (torch/cuDNN with and without its autotuner,
channels-last variants, Triton's implicit GEMM), the config grammar, the validity predicate and
one database file (`conv.json`); only the direct depthwise kernel is conv1d's alone, and the
predicate says so. Importing this package touches neither torch nor triton.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from tunedb.families.config_methods import ConfigMethods
from tunedb.families.conv import configs, keys
from tunedb.families.contract import source_hash
from tunedb.records import Config, Signature

# What decides the compiled kernels, their grids and the torch arms' GPU work: the soft validator.
KERNEL_SOURCES = ("kernels.py", "launch.py", "arms.py")


@lru_cache(maxsize=1)
def impl_hash() -> str:
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)


class ConvFamily(ConfigMethods):
    """See tunedb.families.KernelFamily."""

    configs = configs  # ConfigMethods' six protocol members answer from this module
    name = keys.FAMILY
    ops = keys.OPS
    lanes = configs.LANES

    @property
    def schema(self) -> Any:
        from tunedb.families.contract import SignatureSchema

        return _schema()

    def verify(self, sig: Signature) -> Any:
        """4x the fallback arm's own relative error against the fp32 convolution."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        """torch (cuDNN as the process runs it) is the fallback and `cudnn_bench` (cuDNN with its
        autotuner) its peer: the faster of the two as measured serves (no gate between cuDNN and
        itself), and any other arm must beat that faster one by 1.05x. So a pick is never slower
        than torch's default nor than cudnn.benchmark=True, as measured."""
        from tunedb.families.contract import PickRule

        return PickRule(fallback="torch", simplicity=configs.simplicity, peers=configs.FALLBACK_PEERS)

    def input_policy(self, sig: Signature) -> Any:
        """RING: every arm is timed without an out buffer (torch's convolutions have no out=, so
        with one the cuDNN arms would pay a copy a model never pays), each timed call on a fresh
        input slot refreshed outside the events."""
        from tunedb.families.contract import InputPolicy

        return InputPolicy.RING

    def weight_bytes(self, sig: Signature) -> int:
        return sig.get("Cout") * (sig.get("Cin") // sig.get("g")) * configs.taps(sig) * keys.ELEM_BYTES

    def census_rules(self) -> tuple[Any, ...]:
        from tunedb.families.conv.census import rules

        return rules()

    def serving_keys(self, sig: Signature) -> tuple[Signature, ...]:
        """dt then half; a fused-activation key then its act=none entry (the census cannot see
        the activation after a conv; every arm applies it in its own epilogue)."""
        out = list(sig.lookup_keys())
        if sig.get("act", "none") != "none":
            plain = Signature(sig.family, sig.op, sig.dt,
                              tuple((k, "none" if k == "act" else v) for k, v in sig.params))
            out += [k for k in plain.lookup_keys() if k not in out]
        return tuple(out)

    def register_ops(self) -> None:
        from tunedb.families.conv import ops  # noqa: F401 -- importing registers tunedb::conv1d / conv2d

    def patch_rules(self) -> tuple[str, ...]:
        from tunedb.families.conv.patching import PATCH_RULES

        return PATCH_RULES

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        from tunedb.families.conv.patching import optimize

        return optimize(model, approximate)

    # --- signatures
    def make_signature(self, op: str, dt: str, cin: int, cout: int, kernel: Any, **kw: Any) -> Signature:
        return keys.make_signature(op, dt, cin, cout, kernel, **kw)

    def signature_of(self, op: str, x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: int = 1, act: str = "none") -> tuple[Signature, int]:
        return keys.signature_of(op, x, weight, bias, stride, padding, dilation, groups, act)

    def check_key(self, sig: Signature) -> None:
        from tunedb.errors import SignatureError

        why = keys.sig_reason(sig)
        if why:
            raise SignatureError(f"{sig}: {why}")

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return keys.work(sig, m)

    # --- configs

    # --- tensors (torch imported lazily)
    def launch(self, config: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        from tunedb.families.conv.launch import launch

        return launch(config, sig, *args, out=out, **kwargs)

    def launcher(self, config: Config, sig: Signature) -> Any:
        from tunedb.families.conv.launch import launcher

        return launcher(config, sig)

    def reference(self, sig: Signature, *args: Any, **kwargs: Any) -> Any:
        from tunedb.families.conv.arms import reference

        return reference(sig, *args)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.conv.arms import make_inputs

        return make_inputs(sig, m, device, seed)

    impl_hash = staticmethod(impl_hash)  # the module function: the protocol member


@lru_cache(maxsize=1)
def _schema() -> Any:
    from tunedb.families.contract import SignatureSchema

    return SignatureSchema(
        key=(("Cin", int), ("Cout", int), ("k", int), ("s", int), ("p", int), ("d", int), ("g", int),
             ("bias", int), ("act", str), ("lay", str), ("W", int), ("kw", int), ("sw", int), ("pw", int),
             ("dw", int)),
        size="M", ladder="m", optional=("W", "kw", "sw", "pw", "dw"),
        choices=(("bias", (0, 1)), ("act", keys.ACTS), ("lay", ("nct", "ntc", "nchw", "nhwc"))),
        dtypes=keys.DTYPES)


FAMILY = ConvFamily()

__all__ = ["FAMILY", "ConvFamily", "impl_hash"]
