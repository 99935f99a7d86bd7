"""The grouped-GEMM family `group_gemm` (spec 000; issue 24): the expert GEMMs of a
mixture-of-experts layer. Tokens are routed to E experts (top-k); each expert is an [N, K] weight
of a stacked [E, N, K] tensor. Keyed (E, N, K, top_k, x, dt), size axis M (tokens), ladder `pow2`.

Lanes: triton_grouped (one launch over all experts over the token slots sorted by expert and
padded to BM blocks; the routing metadata is computed inside the op, on the device, and counted
in its time), triton_slots (small M: one launch over (slot, N block) reading expert ids from
topk_ids, no routing metadata; valid while M * top_k <= configs.SLOTS_MAX), torch (torch._grouped_mm where it runs, else a loop of cuBLAS GEMMs over experts).
Sentinels: `default` (the untuned Triton tile) and `torch` (the pick rule's fallback).
moe.py recognises transformers' MoE experts modules (census) and swaps them (optimize).
See docs/group_gemm.md. Importing this package touches neither torch nor triton.
"""
from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from tunedb.families.contract import source_hash
from tunedb.families.config_methods import ConfigMethods
from tunedb.families.group_gemm import configs, keys
from tunedb.records import ArchProfile, Config, Signature

# What decides the compiled kernel, its grid and the torch arms' GPU work.
KERNEL_SOURCES = ("kernels.py", "routing.py", "arms.py", "launch.py")


@lru_cache(maxsize=1)
def impl_hash() -> str:
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)



def _meta_result(x: Any, weight: Any, topk_ids: Any, out: Any) -> Any:
    """A call on meta tensors (a census: `tunedb tune` of a MoE model): neither Triton nor the
    torch arm's host-synced routing runs there, and the result's shape [M, top_k, N] is all a meta
    call yields."""
    return out if out is not None else x.new_empty((*topk_ids.shape, weight.shape[1]))


# The largest token count an unmeasured bf16 key serves the untuned tile at (heuristic's docstring).
UNTUNED_TILE_MAX_M = 512


def _grouped_mm_serves(sig: Signature, arch: ArchProfile | None) -> bool:
    """Whether the fallback is torch._grouped_mm for `sig` on `arch` (arms.grouped_mm_reason's
    rule, from the profile's arch family rather than a device): else it is the per-expert loop."""
    import torch

    from tunedb.families.group_gemm import arms

    if not hasattr(torch, "_grouped_mm") or sig.dt != "bf16" or sig.get("N") % 8 or sig.get("K") % 8:
        return False
    digits = "".join(ch for ch in (arch.arch_family if arch is not None else "") if ch.isdigit())
    if not digits:
        return False
    sm = int(digits)
    return sm >= 80 if arms._version() >= (2, 9) else sm // 10 == 9


class GroupGemmFamily(ConfigMethods):
    """See tunedb.families.KernelFamily."""

    HEURISTIC_PER_SIZE = True  # the selector asks `heuristic` at the call's token count

    configs = configs  # ConfigMethods' six protocol members answer from this module
    name = configs.FAMILY
    ops = configs.OPS
    lanes = configs.LANES

    @cached_property
    def schema(self) -> Any:
        from tunedb.families.contract import SignatureSchema

        return SignatureSchema(key=(("E", int), ("N", int), ("K", int), ("top_k", int), ("x", str)),
                               size="M", ladder="pow2", choices=(("x", ("token", "slot")),),
                               dtypes=configs.DTYPES)

    @property
    def verify(self) -> Any:
        """4x the torch arm's own relative error against the fp32 reference."""
        from tunedb.families.contract import VerifyRule

        return VerifyRule(kind="tolerance", factor=4.0)

    def pick_rule(self) -> Any:
        from tunedb.families.contract import PickRule

        return PickRule(fallback="torch", simplicity=configs.simplicity)

    def check_key(self, sig: Signature) -> None:
        self.schema.check(sig)

    def weight_args(self, sig: Signature) -> tuple[int, ...]:
        return (1,)  # (x, weight, topk_ids[, topk_weights]): the stacked experts are the cold bytes

    def weight_bytes(self, sig: Signature) -> int:
        return sig.get("E") * sig.get("N") * sig.get("K") * 2

    def make_out(self, sig: Signature, args: Any, kwargs: Any, reference: Any) -> Any:
        import torch

        from tunedb.families.group_gemm.arms import torch_dtype

        m, top_k = args[2].shape
        return torch.empty((m, top_k, sig.get("N")), dtype=torch_dtype(sig.dt), device=args[0].device)

    def register_ops(self) -> None:
        from tunedb.families.group_gemm import ops

        ops.register()

    def aten_unkeyed(self, model: Any) -> tuple[str, ...]:
        """The model's bf16/fp16 experts modules (moe.find_experts): keyed by the fused census only."""
        from tunedb.families.group_gemm.moe import find_experts

        return tuple(e.name for e in find_experts(model))

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        from tunedb.families.group_gemm.moe import swap_experts

        swap_experts(model)
        return model

    # --- signatures
    def make_signature(self, e: int, n: int, k: int, top_k: int, dt: str = "bf16", x: str = "token") -> Signature:
        return keys.make_signature(e, n, k, top_k, dt, x)

    def signature_of(self, op: str, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None) -> tuple[Signature, int]:
        return keys.signature_of(op, x, weight, topk_ids, topk_weights)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return keys.work(sig, m)

    # --- configs

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return Config.sentinel("default")

    def heuristic(self, sig: Signature, m: int | None, arch: ArchProfile | None = None) -> Config | None:
        """A key no table measured. Where torch._grouped_mm runs (bf16, N and K multiples of 8:
        arms.grouped_mm_reason, sm90 with torch >= 2.8), the untuned tile (`default`) up to
        UNTUNED_TILE_MAX_M tokens and None above (the selector serves the fallback,
        torch._grouped_mm): on the H200 the tile beat _grouped_mm at 5 of 6 sizes <= 512 (0.63-0.91x
        its time; Qwen3-30B-A3B M=1 1.12x) but ran Mixtral-8x7B at M=4096 1.77x slower (session
        11 C's untuned column, session 16 C). Elsewhere the torch arm is the per-expert loop, which
        syncs the host every call and cannot be captured: the tile serves at every size."""
        if _grouped_mm_serves(sig, arch):
            return Config.sentinel("default") if m is not None and m <= UNTUNED_TILE_MAX_M else None
        return Config.sentinel("default")

    # --- tensors (torch imported lazily)
    def launch(self, config: Config, sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
               out: Any = None) -> Any:
        from tunedb.families.group_gemm.launch import launch

        if x.device.type == "meta":  # a census (dispatch calls launch); timed launchers see real tensors
            return _meta_result(x, weight, topk_ids, out)
        return launch(config, sig, x, weight, topk_ids, topk_weights, out)

    def launcher(self, config: Config, sig: Signature) -> Any:
        from tunedb.families.group_gemm.launch import launcher

        return launcher(config, sig)

    def reference(self, sig: Signature, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
                  dtype: Any = None) -> Any:
        from tunedb.families.group_gemm.arms import reference

        return reference(sig, x, weight, topk_ids, topk_weights, dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.group_gemm.arms import make_inputs

        return make_inputs(sig, m, device, seed)

    impl_hash = staticmethod(impl_hash)  # the module function: the protocol member


FAMILY = GroupGemmFamily()

__all__ = ["FAMILY", "GroupGemmFamily", "impl_hash"]
