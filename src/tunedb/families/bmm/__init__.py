"""The batched matrix product family `bmm` (spec 000's bmm): c[B, M, N] = a[B, M, K] @ b[B, K, N]
for the products a model makes of two activations -- eager attention's q @ k^T and
softmax(scores) @ v above all. Keyed `bmm|op=bmm|dt|B|N|K|lay`, size axis M (ladder m).

Arms: `torch` (torch.bmm, the fallback; `default` is torch too: an unmeasured key never runs an
unmeasured tile) and the `triton_bmm` lane (kernels.py: a (tiles, batch) grid over strided
operands; configs.py: the space and THE validity predicate). Run time: `tunedb::bmm`
(ops.py) and optimize()'s product interception for eager attention (serving.py). See docs/bmm.md.
Importing this package touches neither torch nor triton.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from tunedb.families.config_methods import ConfigMethods
from tunedb.families.bmm import configs, keys
from tunedb.families.contract import source_hash
from tunedb.records import ArchProfile, Config, Signature

# What decides the compiled kernel, its grid and the torch arm's GPU work: the soft validator.
KERNEL_SOURCES = ("kernels.py", "launch.py", "../gemm/kernels_common.py")


@lru_cache(maxsize=1)
def impl_hash() -> str:
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)


class BmmFamily(ConfigMethods):
    """Batched products of activations; see tunedb.families.KernelFamily."""

    configs = configs  # ConfigMethods' six protocol members answer from this module
    name = configs.FAMILY
    ops = configs.OPS
    lanes = configs.LANES
    schema = keys.SCHEMA

    def verify(self, sig: Signature) -> Any:
        """4x torch.bmm's own relative error against the fp32 product (fp64 for fp32 keys)."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        """torch.bmm is the fallback: a tile replaces it only beyond the 1.05x gate."""
        from tunedb.families.contract import PickRule

        return PickRule(fallback="torch", simplicity=configs.simplicity)

    def weight_args(self, sig: Signature) -> tuple[int, ...]:
        return ()  # both operands are activations, produced just before the call: nothing rotates

    def make_out(self, sig: Signature, args: Any, kwargs: Any, reference: Any) -> Any:
        import torch

        a = args[0]
        return torch.empty(reference.shape, dtype=a.dtype, device=a.device)

    def census_rules(self) -> tuple[Any, ...]:
        from tunedb.families.bmm.census import rules

        return rules()

    def register_ops(self) -> None:
        from tunedb.families.bmm import ops

        ops.register()

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        from tunedb.families.bmm.serving import optimize

        return optimize(model)

    # --- signatures
    def make_signature(self, b: int, n: int, k: int, dt: str = "half", lay: str = "nn") -> Signature:
        return keys.make_signature(b, n, k, dt, lay)

    def signature_of(self, op: str, a: Any, b: Any) -> tuple[Signature, int]:
        return keys.signature_of(op, a, b)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return keys.work(sig, m)

    # --- configs

    def full_grid(self) -> tuple[Config, ...]:
        return configs.full_grid()

    def candidates(self, sig: Signature, m: int | None, arch: ArchProfile,
                   lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return configs.candidates(sig, m, arch, configs.config_space(arch.arch_family, lanes))

    # --- tensors (torch imported lazily)
    def launch(self, config: Config, sig: Signature, a: Any, b: Any, out: Any = None) -> Any:
        from tunedb.families.bmm.launch import launch

        return launch(config, sig, a, b, out)

    def launcher(self, config: Config, sig: Signature) -> Any:
        from tunedb.families.bmm.launch import launcher

        return launcher(config, sig)

    def reference(self, sig: Signature, a: Any, b: Any, dtype: Any = None) -> Any:
        from tunedb.families.bmm.launch import reference

        return reference(sig, a, b, dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.bmm.launch import make_inputs

        return make_inputs(sig, m, device, seed)

    impl_hash = staticmethod(impl_hash)  # the module function: the protocol member


FAMILY = BmmFamily()

__all__ = ["FAMILY", "BmmFamily", "impl_hash"]
