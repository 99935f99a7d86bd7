"""The GEMM kernel family: ops `gemm` (y = x @ W^T) and `gemm_act` (+ bias, + activation).

Lanes: triton_mma (portable tl.dot tiles), triton_tma (sm90+ descriptors, persistent, optionally
warp-specialised), triton_splitk (small M, deep K, deterministic reduction), triton_decode (M <= 16:
the `dk` slab kernel and the `gv` GEMV kernel, split-K reduced in the kernel), and the torch arms
`torch` and `fused`. FAMILY is what `tunedb.families.get("gemm")` returns. Importing this package
touches neither torch nor triton; launching does.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from tunedb.families.contract import SignatureSchema, VerifyRule, source_hash
from tunedb.families.gemm import configs, signatures
from tunedb.families.gemm.signatures import check_key, make_signature, serving_keys, signature_of, work
from tunedb.records import ArchProfile, Config, Signature

# Files whose text decides what a config computes and how fast on the GPU (kernels, constexprs,
# compile options, grids, the torch arms as measured): the database's soft validator. The host-side launch path (launch.py,
# triton_launch.py) is not here: a measurement times the GPU work in a CUDA graph, so editing
# how a launch is issued leaves every measured entry valid.
KERNEL_SOURCES = ("kernels_common.py", "kernels_mma.py", "kernels_tma.py", "kernels_splitk.py",
                  "kernel_specs.py", "arms.py", "kernels_gemv.py", "kernels_decode.py")


@lru_cache(maxsize=1)
def impl_hash() -> str:
    """The family's soft validator over KERNEL_SOURCES (families.contract.source_hash)."""
    return source_hash(Path(__file__).parent, KERNEL_SOURCES)


class GemmFamily:
    """The KernelFamily implementation for GEMM; see tunedb.families.KernelFamily."""

    name = configs.FAMILY
    ops = configs.OPS
    lanes = configs.LANES
    acts = configs.ACTS
    schema = SignatureSchema(key=(("N", int), ("K", int), ("act", str), ("bias", int)), size="M",
                             ladder="m", optional=("act", "bias"),
                             choices=(("act", configs.ACTS), ("bias", (0, 1))),
                             dtypes=("half", "fp16", "bf16"))
    verify = VerifyRule("tolerance", 4.0)

    def signature_of(self, op: str, x: Any, weight: Any, bias: Any = None, act: str = "none") -> tuple[Signature, int]:
        return signature_of(op, x, weight, bias, act)

    def make_signature(self, op: str, dt: str, n: int, k: int, act: str = "none", bias: bool = False) -> Signature:
        return make_signature(op, dt, n, k, act, bias)

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return configs.config_space(arch_family, lanes)

    def full_grid(self) -> tuple[Config, ...]:
        return configs.full_grid()

    def parse_config(self, config_id: str) -> Config:
        return configs.parse(config_id)

    def check_key(self, sig: Signature) -> None:
        check_key(sig)

    signature_legend = signatures.SHORT_LEGEND

    def short_signature(self, sig: Signature) -> str:
        return signatures.short_signature(sig)

    def serving_keys(self, sig: Signature) -> tuple[Signature, ...]:
        return serving_keys(sig)

    def cost_model(self, profile: ArchProfile, params: Any = None) -> Any:
        """The contract's cost_model hook: the analytic model on `profile`, calibrated by the
        `model` object an arch's database file ships (None: the uncalibrated structure)."""
        from tunedb.families.gemm.model import GemmCostModel

        return GemmCostModel(self, profile, params)

    def model_problem(self, raw: Any) -> str | None:
        """The contract's model_problem hook: why `raw` is no ModelParams object, or None."""
        from tunedb.families.gemm.model_params import ModelParams

        try:
            ModelParams.from_json(raw)
        except Exception as exc:  # any malformed field: named by from_json's ConfigError, else by the exception
            return str(exc) or type(exc).__name__
        return None

    def calibrate(self, profile: ArchProfile, measurements: Any, configs: Any, old: Any = None) -> Any:
        """The contract's calibrate hook: the database file's `model` object after a build."""
        from tunedb.families.gemm.model import calibrate

        return calibrate(profile, measurements, configs, old)

    def eager_fallback(self, sig: Signature, m: int, config: Config, profile: ArchProfile, params: Any = None) -> str | None:
        """torch serves eager calls of shapes whose cuBLAS kernel is shorter than the config's
        launches cost the host (model.eager_fallback, runtime/host_bound.py)."""
        from tunedb.families.gemm.model import eager_fallback

        return eager_fallback(sig, m, config, profile, params)

    def eager_prime(self, config: Config) -> bool:
        """Every GEMM launcher writes only its output: the first eager call of a shape served by
        torch eagerly runs the config once, so its capture finds the kernel loaded and the
        split-K workspace made (runtime/host_bound.graph_only)."""
        return True

    def pdl_pair(self, config: Config) -> Any:
        """A decode-lane config and its PDL twin, launched by the run time where a captured call
        follows one of ours (launch_gemv.pdl_pair, runtime/capture_chain.py)."""
        from tunedb.families.gemm.launch_gemv import pdl_pair

        return pdl_pair(config)

    def invalid_reason(self, config: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
        return configs.invalid_reason(config, sig, m, arch)

    def candidates(self, sig: Signature, m: int | None, arch: ArchProfile,
                   lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return configs.candidates(sig, m, arch, lanes)

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return configs.sentinels(sig, approximate)

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return configs.default_config(sig, arch)

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        return configs.compile_set(arch_family, referenced)

    def launch(self, config: Config, sig: Signature, x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
        from tunedb.families.gemm.launch import launch

        return launch(config, sig, x, weight, bias, out)

    def launcher(self, config: Config, sig: Signature):
        """The cached closure fn(x, weight, bias, out) for (config, sig): the leanest call path."""
        from tunedb.families.gemm.launch import launcher

        return launcher(config, sig)

    def reference(self, sig: Signature, x: Any, weight: Any, bias: Any = None, dtype: Any = None) -> Any:
        from tunedb.families.gemm.arms import reference

        return reference(sig, x, weight, bias, dtype)

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        from tunedb.families.gemm.arms import make_inputs

        return make_inputs(sig, m, device, seed)

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        return work(sig, m)

    def impl_hash(self) -> str:
        return impl_hash()

    def optimize(self, model: Any, approximate: bool = False) -> Any:
        """nn.Linear (+ a following activation where safe) -> TunedLinear (families/gemm/patching.py)."""
        from tunedb.families.gemm.patching import optimize

        return optimize(model, approximate=approximate, inplace=True)

    def report_lines(self) -> list[str]:
        """tuning_report()'s line on sibling projections run as one launch (siblings.py); none
        before optimize() made a group (the module imports torch: not imported until then)."""
        import sys

        mod = sys.modules.get("tunedb.families.gemm.siblings")
        return mod.report_lines() if mod is not None else []

    def prebuild(self, args: Any) -> int:
        """`tunedb prebuild --family gemm`: Triton configs compiled into the persistent cache."""
        from tunedb.families.gemm.prebuild_cli import run

        return run(args)

    def register_ops(self) -> None:
        import tunedb.families.gemm.ops  # noqa: F401 -- registers tunedb::gemm / gemm_act
        # tunedb::sibling / siblings: a program exported from a model whose sibling groups compiled
        # to one launch names them, and torch.export.load in a fresh process resolves them by name
        import tunedb.families.gemm.siblings_compile  # noqa: F401

    def census_rules(self) -> tuple[Any, ...]:
        from tunedb.families.gemm.census_rules import rules

        return rules()

    def weight_bytes(self, sig: Signature) -> int:
        return sig.get("N") * sig.get("K") * configs.ELEMENT_BYTES

    def prebuilt_configs(self, arch_family: str) -> set[str]:
        """Configs `tunedb prebuild` compiled into the Triton cache this process uses (pointing
        Triton at that cache as a side effect, so workers started afterwards find it)."""
        from tunedb.families.gemm.prebuild import prebuilt_configs

        return prebuilt_configs(arch_family)

    def compile_jobs(self, arch_family: str, sig: Signature, config_ids: Any, cache_dir: str | None = None) -> list[Any]:
        """The Triton binaries measuring config_ids on sig loads, as jobs for the build's pool
        (into `cache_dir`, default this machine's Triton cache)."""
        from tunedb.families.gemm.compile_jobs import jobs

        return jobs(arch_family, sig, config_ids, cache_dir)

    def compile_warm(self) -> None:
        """A compile process's start: triton, the kernel modules and Triton's cache key (a sha256
        of libtriton) loaded before its first job (no driver: the job sets its target's)."""
        from triton.runtime.cache import triton_key

        from tunedb.families.gemm import prebuild  # noqa: F401
        from tunedb.families.gemm.kernel_specs import kernel_fn

        for name in ("mma", "tma", "splitk_partial"):
            kernel_fn(name)
        triton_key()

    def compiler_cache(self) -> str:
        from tunedb import settings

        return str(settings.triton_cache_dir())

    def warm_start(self) -> None:
        """Load the compiler state every first launch would otherwise pay for in line: the
        kernels' modules (and triton with them), Triton's own cache key (a sha256 of the
        400 MB libtriton, which releases the GIL) and its driver's C helpers (built by gcc on a
        machine's first use). A measuring worker runs this in a thread beside its torch import."""
        from triton.runtime.cache import triton_key

        from tunedb.families.gemm.kernel_specs import kernel_fn

        for name in ("mma", "tma", "splitk_partial"):
            kernel_fn(name)
        triton_key()
        # Triton picks its active driver once per process, by whether torch is there: wait for
        # the worker's own torch import (this import blocks until it is done) before touching it
        import torch  # noqa: F401
        from triton.runtime.driver import driver

        driver.active.utils  # noqa: B018 -- the first touch builds or loads cuda_utils


FAMILY = GemmFamily()

__all__ = ["FAMILY", "GemmFamily", "impl_hash", "make_signature", "signature_of", "work"]
