"""The linalg kernel family: small batched linear algebra (spec 003's backend ladder).

Ops dot, gemv, gemm, potrf, trsv, posv over a batch of independent n x n problems (n 2..128),
fp32 and fp64 (and fp16/bf16 for gemm, gemv). Signature `linalg|op=potrf|dt=fp32|n=8`; the
size axis is the batch. Arms: Triton kernels at four packings (thread, warp, block, lane: the kernel
module `launch.py`), the library arm `torch` (bmm / matmul, cholesky_ex, solve_triangular), the
`heuristic` shape rule for cells nobody measured. Spec 003's pick rule (pick.py) with a 2% tie
band and a 5% margin for arms that need an optional dependency; the numerical gate is a residual
bound against torch's own on the same inputs. FAMILY is what `tunedb.families.get("linalg")`
returns. Importing this package touches neither torch nor triton.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from tunedb.families.contract import InputPolicy, SignatureSchema, VerifyRule
from tunedb.families.linalg import configs, pick, signatures
from tunedb.families.linalg.signatures import FAMILY as NAME, OPS, SIZE_AXIS, make_signature, signature_of, work
from tunedb.families.contract import source_hash
from tunedb.records import ArchProfile, Config, Signature

# What decides the compiled kernels, their launch grid and the library arm as served (not the
# kernels' test inputs in kernels_check.py, nor host code here).
KERNEL_SOURCES = ("kernels_space.py", "kernels_thread.py", "kernels_tile.py", "kernels_lane.py", "kernels_reg.py",
                  "kernels_rows.py", "kernels_shfl.py", "kernels_panel.py", "kernels_pdot.py", "kernels_torch.py", "kernels_nvmath.py", "kernels_cuda.py",
                  "kernels_cuda_src.py", "kernels_cuda_tile.py", "kernels_cuda_wide.py", "kernels_cuda_blocked.py",
                  "kernels_cuda_blocked_src.py",
                  "launch.py")
VERIFY_FACTOR = 4.0  # an arm's worst residual may reach 4x torch's on the same inputs


@lru_cache(maxsize=1)
def impl_hash() -> str:
    """The family's soft validator over KERNEL_SOURCES (families.contract.source_hash)."""
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)


class LinalgFamily:
    """The KernelFamily implementation for small batched linear algebra."""

    name = NAME
    ops = OPS
    lanes = configs.LANES
    size_axis = SIZE_AXIS

    schema = SignatureSchema(key=(("n", int),), size=SIZE_AXIS, ladder="pow2",
                             dtypes=("fp32", "fp64", "fp16", "bf16"))
    verify = VerifyRule(kind="residual", factor=VERIFY_FACTOR)

    def check(self, sig: Signature) -> Signature:
        """The schema's check and the op's own (its dtypes, n in 2..128)."""
        self.schema.check(sig)
        signatures.check_signature(sig)
        return sig

    def signature_of(self, op: str, *args: Any, **kwargs: Any) -> tuple[Signature, int]:
        return signature_of(op, *args)

    def make_signature(self, op: str, dt: str, n: int) -> Signature:
        return make_signature(op, dt, n)

    def serving_keys(self, sig: Signature) -> tuple[Signature, ...]:
        from tunedb.families.linalg.plan import serving_keys

        return serving_keys(sig)

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        space = configs.config_space(arch_family)
        return space if lanes is None else tuple(c for c in space if c.lane in lanes)

    def parse_config(self, config_id: str) -> Config:
        return configs.parse(config_id)

    def invalid_reason(self, config: Config, sig: Signature, m: int | None, arch: ArchProfile | None) -> str | None:
        return configs.invalid_reason(config, sig, m, arch)

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return ("default", "torch", "heuristic")

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        """No guess allowed: the library arm."""
        return Config.sentinel("torch")

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        """The whole space (a few dozen small kernels; each compiles on its first launch)."""
        return configs.config_space(arch_family)

    def pick_rule(self) -> Any:
        return pick.LINALG_RULE

    def dependency_available(self, config_id: str) -> bool:
        """Whether an arm's optional dependency is installed here (True for a native arm): the
        dependency tiers' arms serve only where they can run: kernels_nvmath where nvmath-python
        imports, kernels_cuda where torch sees a GPU and has NVRTC."""
        tier = configs.dependency(config_id)
        if tier is None:
            return True
        return configs.dependency_tier_available(tier)

    def extrapolates(self, sig: Signature) -> bool:
        """Every op is independent small problems: below the smallest measured batch an arm's
        launch does less of the same work (the library arm keeps its launch floor, 9-50 us at
        batch 256 on the H200), above the largest both scale with the batch; so an arm that beat
        torch by the gate at the edge batch keeps serving past it (batch 1, 100, 10**6)."""
        return True

    def input_policy(self, sig: Signature) -> InputPolicy:
        """RING for the ops whose solver overwrites its input, ROTATE for the others."""
        return InputPolicy.RING if sig.op in signatures.SOLVER_OPS else InputPolicy.ROTATE

    def rotating_args(self, sig: Signature) -> tuple[int, ...]:
        """The operands ROTATE copies cold: the matrices (both vectors of dot)."""
        return (0, 1) if sig.op in ("dot", "gemm") else (0,)

    def register_ops(self) -> None:
        from tunedb.families.linalg import ops

        ops.register()

    def cost_model(self, profile: ArchProfile, params: Any = None) -> "HeuristicModel":
        """The contract's cost_model hook: no timing model (the family has none), the stated
        heuristic as the model tier's pick for unmeasured cells."""
        return HeuristicModel(profile)

    def heuristic(self, sig: Signature, batch: int | None, arch: ArchProfile | None = None) -> Config:
        """The heuristic's config for a cell (the library arm when no kernel applies; batch None:
        a throughput-sized batch)."""
        profile = arch or _shipped_profile()
        batch = 65536 if batch is None else batch
        valid = tuple(c for c in configs.config_space(profile.arch_family)
                      if configs.invalid_reason(c, sig, batch, profile) is None)
        return configs.heuristic(sig, batch, valid, profile.sms) or Config.sentinel("torch")

    def launch(self, config: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run `sig`'s op with `config`; potrf/posv return (result, info)."""
        if config.id == "heuristic":
            _sig, batch = signature_of(sig.op, *args)
            config = self.heuristic(sig, batch)
        cid = "torch" if config.id == "default" else config.id
        mod = configs.kernels()
        if mod is None:
            if cid != "torch":
                raise RuntimeError(f"config {cid} needs the linalg kernel module, which is not available")
            from tunedb.families.linalg import problems

            return problems.torch_arm(sig.op, *args)
        inplace = bool(kwargs.get("inplace", False))
        dev = getattr(args[0], "device", None)
        if cid != "torch" and dev is not None and dev.type == "cuda" and dev.index is not None:
            import torch

            if dev.index != torch.cuda.current_device():
                # kernel arms launch in the current device's context (the CUDA tier's modules
                # load per device, Triton's launcher takes the current device): make the
                # tensors' device current (a tensor on cuda:1 while cuda:0 is); the usual case
                # pays one comparison
                with torch.cuda.device(dev):
                    return mod.launch(sig.op, cid, *args, out=out, inplace=inplace)
        return mod.launch(sig.op, cid, *args, out=out, inplace=inplace)

    def eager_fallback(self, sig: Signature, m: int, config: Config, profile: ArchProfile, params: Any = None) -> str | None:
        """The arm serving eager calls where the tuned arm's host time outweighs what its kernel
        saves (eager.py: the torch arm for a Triton arm at small batches; never the CUDA tier)."""
        from tunedb.families.linalg.eager import eager_fallback

        return eager_fallback(sig, m, config, profile)

    def reference(self, sig: Signature, *args: Any, **kwargs: Any) -> Any:
        from tunedb.families.linalg import problems

        return problems.reference(sig, *args)

    def residual(self, sig: Signature, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
        from tunedb.families.linalg import problems

        return problems.residual(sig, args, kwargs, out)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.linalg import problems

        return problems.make_inputs(sig, m, device, seed)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return work(sig, m)

    def impl_hash(self) -> str:
        return impl_hash()


class HeuristicModel:
    """What the linalg family gives the pipeline for a cost model: it prices nothing (predict
    is None, and rank keeps every config, so a build measures them all) and picks by the stated
    heuristic (configs.heuristic) where the selector's model tier answers an unmeasured cell."""

    def __init__(self, profile: ArchProfile) -> None:
        self.sms = profile.sms

    def pick(self, sig: Signature, m: int, candidates: tuple[Config, ...]) -> Config | None:
        return configs.heuristic(sig, m, candidates, self.sms)

    def rank(self, sig: Signature, m: int, configs_: Sequence[Config], k: int) -> list[str]:
        first = self.pick(sig, m, tuple(configs_))
        ids = [c.id for c in configs_]
        return ids if first is None else [first.id, *(i for i in ids if i != first.id)]

    def predict(self, sig: Signature, m: int, config_id: str) -> float | None:
        return None


def _shipped_profile() -> ArchProfile:
    from tunedb import arch as arch_mod

    return arch_mod.shipped_profile("sm90")


FAMILY = LinalgFamily()

__all__ = ["FAMILY", "LinalgFamily", "impl_hash", "make_signature", "signature_of", "work"]
