"""The `gemm_log_softmax` family (spec 000's tuned op of that name; issue 25): y =
log_softmax(x @ W^T + b, dim=-1) over a vocabulary N, the output layer of CTC and transducer
heads. A family (not an op of `gemm`) because its arms are not GEMM tiles: the fused designs
split the softmax's row statistics across N tiles and need their own kernels, lanes, config
grammar, validity predicate and fp32 gate; the database file is `db/<arch>/gemm_log_softmax.json`.

Lanes: triton_recompute (stats pass, then recompute + write once), triton_fixup (logits written
once in the output dtype, then subtracted in place), linear_rows (cuBLAS, then a Triton row
log-softmax), triton_rowfix (small M: tiles + statistics, one combined fix-up; two launches or
one persistent), chunked_rows (cuBLAS and the linear_rows pass chunk by chunk of R rows, the
pass over logits still in L2; one stream or the passes forked onto a second), torch (linear +
log_softmax: the fallback
and the untuned choice). Importing this package touches neither torch nor triton.
See docs/gemm_log_softmax.md.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from tunedb.families.contract import source_hash
from tunedb.families.config_methods import ConfigMethods
from tunedb.families.gemm_log_softmax import configs, keys
from tunedb.records import Config, Signature

KERNEL_SOURCES = ("kernels.py", "launch.py", "kernels_rowfix.py", "launch_rowfix.py", "launch_chunks.py")


@lru_cache(maxsize=1)
def impl_hash() -> str:
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)


class GemmLogSoftmaxFamily(ConfigMethods):
    """See tunedb.families.KernelFamily."""

    configs = configs  # ConfigMethods' six protocol members answer from this module
    name = configs.FAMILY
    ops = configs.OPS
    lanes = configs.LANES

    @property
    def schema(self) -> Any:
        from tunedb.families.contract import SignatureSchema

        return SignatureSchema(key=(("N", int), ("K", int), ("bias", int)), size="M", ladder="m",
                               choices=(("bias", (0, 1)),), dtypes=configs.DTYPES)

    def verify(self, sig: Signature) -> Any:
        """Relative error against the fp32 reference within 4x the torch arm's own (which rounds
        the logits to the input dtype before normalising)."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        from tunedb.families.contract import PickRule

        return PickRule(fallback="torch", simplicity=configs.simplicity)

    def weight_args(self, sig: Signature) -> tuple[int, ...]:
        return (1, 2) if sig.get("bias") else (1,)

    def weight_bytes(self, sig: Signature) -> int:
        return 2 * sig.get("N") * (sig.get("K") + sig.get("bias"))

    def eager_fallback(self, sig: Signature, m: int, config: Config, profile: Any, params: Any = None) -> str | None:
        """chunked_rows configs whose launches would make an eager call host-bound serve torch
        there (configs_chunks.eager_fallback); every other config serves eager calls too."""
        from tunedb.families.gemm_log_softmax.configs_chunks import eager_fallback

        return eager_fallback(sig.get("N"), sig.get("K"), m, config, profile)

    def census_rules(self) -> tuple[Any, ...]:
        """None at the aten level: the dispatcher shows an addmm and a _log_softmax with nothing
        tying one's output to the other's input. census.record() (a function-level mode) and
        census.find_heads() (the module pattern) see the pair; see census.py."""
        return ()

    def register_ops(self) -> None:
        from tunedb.families.gemm_log_softmax import ops  # noqa: F401 -- registers tunedb::gemm_log_softmax

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        from tunedb.families.gemm_log_softmax.census import optimize

        return optimize(model)

    # --- signatures
    def make_signature(self, n: int, k: int, dt: str = "bf16", bias: int = 1) -> Signature:
        return keys.make_signature(n, k, dt, bias)

    def signature_of(self, op: str, x: Any, weight: Any, bias: Any = None) -> tuple[Signature, int]:
        return keys.signature_of(op, x, weight, bias)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return keys.work(sig, m)

    # --- configs

    # --- tensors (torch imported lazily)
    def launch(self, config: Config, sig: Signature, x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
        from tunedb.families.gemm_log_softmax.launch import launch

        if bias is not None and not bias.is_contiguous():  # the fused kernels read it at stride 1
            bias = bias.contiguous()
        return launch(config, sig, x, weight, bias, out)

    def reference(self, sig: Signature, x: Any, weight: Any, bias: Any = None, dtype: Any = None) -> Any:
        from tunedb.families.gemm_log_softmax.launch import reference

        return reference(x, weight, bias, dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.gemm_log_softmax.launch import make_inputs

        return make_inputs(sig, m, device, seed)

    def make_out(self, sig: Signature, args: Any, kwargs: Any, reference: Any) -> Any:
        """The output buffer a measured launch writes: [M, N] in the input dtype (the reference is fp32)."""
        import torch

        x = args[0]
        return torch.empty((x.numel() // sig.get("K"), sig.get("N")), dtype=x.dtype, device=x.device)

    impl_hash = staticmethod(impl_hash)  # the module function: the protocol member


FAMILY = GemmLogSoftmaxFamily()

__all__ = ["FAMILY", "GemmLogSoftmaxFamily", "impl_hash"]
