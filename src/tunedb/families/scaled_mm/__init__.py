"""The quantized W8A8 GEMM families (spec 000): `scaled_mm` (int8 x int8, per-token x
per-channel scales, bf16/fp16 out) and `scaled_mm_fp8` (fp8 e4m3, per-tensor / row-wise /
128-block scales, bf16 out), each with a `_quant` op whose output is quantized per row for the
next GEMM. One package, two registry entries: the families share their kernels, lanes, config
grammar and launch path; they differ in signatures, scale modes, the vendor arm and the
numerical gate (int8: exact bits; fp8: tolerance). See docs/scaled_mm.md.

Lanes: triton_mma (data-parallel tl.dot tiles, scales in the epilogue or per K block),
triton_tma (sm90 tensor descriptors, persistent), triton_splitk (deep K, fixed-order reduction),
triton_decode (M <= 16: one weight-streaming kernel, split-K reduced inside it, optional PDL), torch (torch._int_mm + epilogue / torch._scaled_mm).
The untuned choice is the `heuristic` sentinel (configs.heuristic_config: torch._scaled_mm for
fp8 per-tensor / row-wise scales, the half-wave Triton tile otherwise). Importing this
package touches neither torch nor triton.
"""
from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Sequence

from tunedb.families.config_methods import ConfigMethods
from tunedb.families.scaled_mm import configs, keys
from tunedb.families.contract import source_hash
from tunedb.records import ArchProfile, Config, Signature

# What decides the compiled kernels, their grids and the torch arms' GPU work: the soft validator.
KERNEL_SOURCES = ("kernels.py", "kernels_gemv.py", "arms.py", "launch.py", "../gemm/kernels_common.py")


@lru_cache(maxsize=None)
def impl_hash(family: str = configs.INT8_FAMILY) -> str:
    """A family's soft validator: the hash over KERNEL_SOURCES (families.contract.source_hash),
    and, from the rule's second revision on, the revision of the `heuristic` rule (configs.
    HEURISTIC_RULE): a region naming `heuristic` means the rule it was measured under, so an
    entry measured under another revision reads stale (int8's rule 1 keeps its old hash)."""
    base = source_hash(Path(__file__).parent, KERNEL_SOURCES)
    rule = configs.HEURISTIC_RULE[family]
    if rule == 1:
        return base
    import hashlib

    return hashlib.sha256(f"{base}|heuristic-rule-{rule}".encode()).hexdigest()[:12]


class ScaledMMFamily(ConfigMethods):
    """One quantized family (int8 or fp8); see tunedb.families.KernelFamily."""

    configs = configs  # ConfigMethods' six protocol members answer from this module
    ops = configs.OPS
    lanes = configs.LANES

    def __init__(self, name: str) -> None:
        self.name = name
        self.dt = "int8" if name == configs.INT8_FAMILY else "fp8"
        self.scales = configs.SCALES[name]

    # --- the contract's data and hooks (tunedb.families.contract)
    @cached_property
    def schema(self) -> Any:
        """Derived once per family: its key fields, the out/scale choices of its name."""
        from tunedb.families.contract import SignatureSchema

        outs = tuple(sorted({o for (fam, _), allowed in configs.OUTS.items() if fam == self.name for o in allowed}))
        if self.dt == "int8":
            return SignatureSchema(key=(("N", int), ("K", int), ("out", str)), size="M", ladder="m",
                                   choices=(("out", outs),), dtypes=("int8",))
        return SignatureSchema(key=(("N", int), ("K", int), ("scale", str), ("out", str)), size="M",
                               ladder="m", choices=(("scale", self.scales), ("out", outs)), dtypes=("fp8",))

    def verify(self, sig: Signature) -> Any:
        """int8: exact bits (every arm accumulates exactly and scales in one order: the gate
        compares with the heuristic's output bit for bit); fp8: 4x the baseline arm's error
        against the fp32 product of the dequantized operands."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="exact") if self.dt == "int8" else VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        """The heuristic is the fallback: a measured arm replaces it only beyond the 1.05x gate."""
        from tunedb.families.contract import PickRule

        return PickRule(fallback="heuristic", simplicity=simplicity)

    def cost_model(self, profile: ArchProfile, params: Any = None) -> Any:
        """The pruning model (pruning.py): ranks configs so a build measures its top-k (plus each
        lane's best); it serves nothing (pick is None: unmeasured shapes keep the heuristic)."""
        from tunedb.families.scaled_mm.pruning import PruningModel

        return PruningModel(profile)

    def heuristic(self, sig: Signature, m: int | None, arch: ArchProfile | None = None) -> Config:
        """The concrete arm the `heuristic` sentinel runs at M (configs.heuristic_config: the
        vendor op for fp8 per-tensor / row-wise scales, else a tile); at m=None (the selector's
        default tier, asked once per signature) the sentinel itself, which the op resolves per
        call's M: a concrete tile here would serve the largest tile at M=1 too."""
        if m is None:
            return Config.sentinel("heuristic")
        return configs.heuristic_config(sig, m, arch.sms if arch else 132)

    def weight_args(self, sig: Signature) -> tuple[int, ...]:
        return (1, 3)  # (x, weight, x_scale, w_scale): the weight and its scales are the cold bytes

    def weight_bytes(self, sig: Signature) -> int:
        """Bytes of weights one call reads: the one-byte weight and its fp32 scales."""
        from tunedb.families.scaled_mm.keys import scale_shapes

        _, ws = scale_shapes(sig.get("scale", "row"), 1, sig.get("N"), sig.get("K"))
        n_scales = 1
        for d in ws[0]:
            n_scales *= d
        return sig.get("N") * sig.get("K") + 4 * n_scales

    def make_out(self, sig: Signature, args: Any, kwargs: Any, reference: Any) -> Any:
        """An empty output for a measured launch, what `reference` describes: y [M, N] in the
        output dtype, or q [M, N] for op=scaled_mm_quant (its row scales go to a new buffer)."""
        import torch

        from tunedb.families.scaled_mm.arms import torch_dtype

        x = args[0]
        m, n = x.numel() // sig.get("K"), sig.get("N")
        return torch.empty((m, n), dtype=torch_dtype(sig.get("out")), device=x.device)

    def census_rules(self) -> tuple[Any, ...]:
        """Which dispatched aten calls are this family's: aten::_int_mm (int8) or
        aten::_scaled_mm (fp8); see census.py."""
        from tunedb.families.scaled_mm.census import rules

        return rules(self.name)

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        """Serve the model's torchao-quantized Linears of this family through the tuned op
        (patching.py; the activation is quantized as the torchao scheme does)."""
        from tunedb.families.scaled_mm import ops  # noqa: F401 -- the ops the layers call
        from tunedb.families.scaled_mm.patching import optimize

        return optimize(model, self.name)

    def census_quantizer(self, scheme: str) -> Any:
        """torchao's online quantization for `tunedb census --quantization` (torchao_bridge.py):
        int8 for this family's int8 object, fp8-rowwise / fp8-block for the fp8 one."""
        from tunedb.families.scaled_mm import torchao_bridge

        return torchao_bridge.quantizer(scheme) if torchao_bridge.family_of(scheme) == self.name else None

    def report_lines(self) -> list[str]:
        """One tuning-report line per model optimize() served through this family (patching.py)."""
        from tunedb.families.scaled_mm.patching import report_lines

        return report_lines(self.name)

    def register_ops(self) -> None:
        from tunedb.families.scaled_mm import ops  # noqa: F401 -- importing registers tunedb::scaled_mm_*

    # --- signatures
    def make_signature(self, op: str, n: int, k: int, out: str = "bf16", scale: str = "row") -> Signature:
        return keys.make_signature(self.name, op, n, k, out, scale)

    def signature_of(self, op: str, x: Any, weight: Any, x_scale: Any, w_scale: Any,
                     out_dtype: Any = None, scale: str | None = None) -> tuple[Signature, int]:
        if out_dtype is None:
            out_dtype = ("torch.int8" if self.dt == "int8" else "torch.float8_e4m3fn") \
                if op == "scaled_mm_quant" else "torch.bfloat16"
        sig, m = keys.signature_of(op, x, weight, x_scale, w_scale, out_dtype, scale)
        if sig.family != self.name:
            from tunedb.errors import SignatureError

            raise SignatureError(f"{self.name} takes {self.dt} operands, got {x.dtype} (family {sig.family})")
        return sig, m

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return keys.work(sig, m)

    # --- configs

    def full_grid(self) -> tuple[Config, ...]:
        return configs.full_grid()

    def candidates(self, sig: Signature, m: int | None, arch: ArchProfile,
                   lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return tuple(c for c in configs.config_space(arch.arch_family, lanes)
                     if configs.invalid_reason(c, sig, m, arch) is None)

    # --- tensors (torch imported lazily)
    def launch(self, config: Config, sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any,
               out: Any = None) -> Any:
        from tunedb.families.scaled_mm.launch import launch

        return launch(config, sig, x, weight, x_scale, w_scale, out)

    def launcher(self, config: Config, sig: Signature) -> Any:
        from tunedb.families.scaled_mm.launch import launcher

        return launcher(config, sig)

    def reference(self, sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any,
                  dtype: Any = None) -> Any:
        from tunedb.families.scaled_mm.arms import reference

        return reference(sig, x, weight, x_scale, w_scale, dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.scaled_mm.arms import make_inputs

        return make_inputs(sig, m, device, seed)

    def impl_hash(self) -> str:
        """The protocol member: this family's hash (module impl_hash)."""
        return impl_hash(self.name)


def simplicity(config_id: str) -> int:
    """Lower is simpler: the heuristic, then the vendor arm, then data-parallel tiles (an unsplit
    decode config without PDL among them), then split-K, a split or PDL decode config."""
    if config_id in ("heuristic", "default"):
        return 0
    if config_id == "torch":
        return 1
    if config_id.startswith(("dk", "gv")):
        return 2 if config_id.startswith(("dk1_", "gv1_")) and not config_id.endswith("_pdl") else 3
    return 3 if config_id.startswith("sk") else 2


FAMILY = ScaledMMFamily(configs.INT8_FAMILY)
FAMILY_FP8 = ScaledMMFamily(configs.FP8_FAMILY)

__all__ = ["FAMILY", "FAMILY_FP8", "ScaledMMFamily", "impl_hash", "simplicity"]
