"""Which Triton kernels a GEMM config launches, with which constexprs and compile options.

The one place both the launcher (launch.py) and `tunedb prebuild` read, so a prebuilt binary
has exactly the cache key a run will look up. No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from tunedb.families.gemm import configs
from tunedb.records import Config


# The split-K reduction's tile: 16 rows cover decode M in one row of CTAs; 256 columns per CTA.
REDUCE_BM, REDUCE_BN, REDUCE_WARPS = 16, 256, 4


@dataclass(frozen=True)
class KernelSpec:
    """One kernel launch of a config: the jit function, its constexprs and compile options."""

    name: str  # "mma", "tma", "splitk_partial", "splitk_reduce"
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int

    @property
    def kernel(self) -> Any:
        return kernel_fn(self.name)

    @property
    def persistent(self) -> bool:
        """A persistent kernel launches at most one CTA per SM; each walks tiles pid, pid + grid, ..."""
        return self.name == "tma"

    def kwargs(self) -> dict[str, Any]:
        return {**dict(self.constexprs), "num_warps": self.num_warps, "num_stages": self.num_stages}


def grid_of(spec: KernelSpec, n: int) -> Callable[[int, int], tuple[int, ...]]:
    """The launch grid of `spec` at N = n, as `grid(M, sm_count)` (the count matters only to a
    persistent kernel). Here rather than in the launcher because the grid decides the GPU work:
    this file is part of the family's impl_hash, the host-side launch path is not."""
    cx = dict(spec.constexprs)
    bm, bn = cx["BM"], cx["BN"]
    cols = -(-n // bn)
    if spec.name == "splitk_reduce":
        return lambda m, sms: (-(-m // bm), cols)
    if spec.name == "splitk_partial":
        split = cx["SPLIT"]
        return lambda m, sms: (-(-m // bm) * cols, split)
    if spec.persistent:
        return lambda m, sms: (min(sms, -(-m // bm) * cols),)
    return lambda m, sms: (-(-m // bm) * cols,)


def kernel_fn(name: str) -> Any:
    if name == "mma":
        from tunedb.families.gemm.kernels_mma import gemm_mma_kernel

        return gemm_mma_kernel
    if name == "tma":
        from tunedb.families.gemm.kernels_tma import gemm_tma_kernel

        return gemm_tma_kernel
    from tunedb.families.gemm import kernels_splitk

    return {"splitk_partial": kernels_splitk.splitk_partial_kernel,
            "splitk_reduce": kernels_splitk.splitk_reduce_kernel}[name]


# Pointer arguments (in order) and the dtype each one has: "io" is the GEMM's fp16/bf16, "f32" the
# split-K workspace. The integer arguments follow the pointers (see the kernels' signatures).
POINTERS = {
    "mma": ("io", "io", "io", "io"),
    "tma": ("io", "io", "io", "io"),
    "splitk_partial": ("io", "io", "f32"),
    "splitk_reduce": ("f32", "io", "io"),
}
INTS = {
    "mma": ("M", "N", "K", "HAS_BIAS", "ACT"),
    "tma": ("M", "N", "K", "HAS_BIAS", "ACT"),
    "splitk_partial": ("M", "N", "K"),
    "splitk_reduce": ("M", "N", "HAS_BIAS", "ACT"),
}


@lru_cache(maxsize=4096)
def specs(cfg: Config) -> tuple[KernelSpec, ...]:
    """The kernels `cfg` launches, in launch order."""
    bm, bn, bk = configs.blocks(cfg)
    w, s = cfg.param("warps"), cfg.param("stages")
    if cfg.lane == "triton_mma":
        return (KernelSpec("mma", (("BM", bm), ("BN", bn), ("BK", bk), ("GROUP_M", cfg.param("group_m"))), w, s),)
    if cfg.lane == "triton_tma":
        ws = bool(cfg.param("ws"))
        # Flattening the tile loop lets the pipeliner overlap the epilogue with the next tile's
        # loads; with warp specialisation the partitioner wants the nest left alone.
        cx = (("BM", bm), ("BN", bn), ("BK", bk), ("GROUP_M", cfg.param("group_m")),
              ("SUBTILE", bn >= 128), ("WS", ws), ("FLATTEN", not ws))
        return (KernelSpec("tma", cx, w, s),)
    if cfg.lane == "triton_splitk":
        split = cfg.param("split_k")
        partial = KernelSpec("splitk_partial", (("BM", bm), ("BN", bn), ("BK", bk), ("SPLIT", split)), w, s)
        reduce = KernelSpec("splitk_reduce", (("SPLIT", split), ("BM", REDUCE_BM), ("BN", REDUCE_BN)),
                            REDUCE_WARPS, 1)
        return (partial, reduce)
    raise ValueError(f"config {cfg.id!r} of lane {cfg.lane!r} launches no Triton kernel")
