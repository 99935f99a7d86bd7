"""The extension seam: a kernel family is one registry entry behind the small Protocol below.

A family owns one config space (split into lanes), ONE validity predicate that candidate
generation, the cost model and the selector all call, the sentinel arms, a default config,
and the launch/reference functions. Built-in families are imported lazily by name so that
``import tunedb`` touches neither torch nor the GPU.
"""
from __future__ import annotations

import importlib
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from tunedb.errors import RegistryError
from tunedb.records import ArchProfile, Config, Signature


@runtime_checkable
class KernelFamily(Protocol):
    """What a kernel family provides. Tensor-touching methods import torch lazily."""

    name: str  # "gemm": also the database file's stem
    ops: tuple[str, ...]  # ("gemm", "gemm_act")
    lanes: tuple[str, ...]  # ("triton_mma", "triton_tma", "triton_splitk", "torch", "fused")

    def signature_of(self, op: str, *args: Any, **kwargs: Any) -> tuple[Signature, int]:
        """The static signature and the dynamic size M of one call (from tensors or metas)."""

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        """Every non-sentinel config of the given lanes (all lanes when None) on this arch."""

    def parse_config(self, config_id: str) -> Config:
        """A config from its stable id (sentinels included); ConfigError when malformed."""

    def invalid_reason(self, config: Config, sig: Signature, m: int | None,
                       arch: ArchProfile) -> str | None:
        """THE validity predicate: None when `config` may run `sig` at M on `arch`, else why not.

        m is None when the question is about every M (resolve-time and compile-time checks).
        """

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        """The sentinel arms that apply to `sig` (always 'default' and 'torch'; 'fused' when one exists)."""

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        """The family's untuned choice for `sig` (what the sentinel 'default' runs)."""

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        """The production compile set: referenced configs + default + a coverage basis
        (or the whole space under TUNEDB_COMPILE_SET=all)."""

    def launch(self, config: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run `sig`'s op with `config` on tensors; writes into `out` when given."""

    def reference(self, sig: Signature, *args: Any, **kwargs: Any) -> Any:
        """The op in fp32/fp64 on upcast inputs: what the numerical gate compares with."""

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Random inputs (never zeros) for `sig` at M: (args, kwargs) for launch/reference."""

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        """(FLOPs, fewest bytes moved) of one call: for shares of peak and the memory floor."""

    # Optional, looked up with hasattr by the selector:
    #   serving_keys(sig) -> tuple[Signature, ...]: database keys that may serve sig, most
    #       specific first (default: sig.lookup_keys()).
    #   model_ranker(profile, params) -> ranker: the cost-model tier, calibrated by the `model`
    #       object of the arch's database file.
    # and by a measuring worker's start (bench.protocol.StartRequest):
    #   warm_start() -> None: one-time compiler state (imports, caches), loaded in a thread
    #       beside the worker's torch import; best effort, a failure resurfaces at first launch.


_BUILTIN: dict[str, str] = {"gemm": "tunedb.families.gemm:FAMILY",
                            "scaled_mm": "tunedb.families.scaled_mm:FAMILY",
                            "scaled_mm_fp8": "tunedb.families.scaled_mm:FAMILY_FP8"}
_REGISTRY: dict[str, KernelFamily] = {}


def register(family: KernelFamily, *, replace: bool = False) -> None:
    if not isinstance(family, KernelFamily):
        raise TypeError(f"{family!r} does not implement the KernelFamily protocol")
    if family.name in _REGISTRY and not replace:
        raise RegistryError(f"kernel family {family.name!r} is already registered")
    _REGISTRY[family.name] = family


def names() -> tuple[str, ...]:
    return tuple(sorted(set(_BUILTIN) | set(_REGISTRY)))


def get(name: str) -> KernelFamily:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN:
        module, _, attr = _BUILTIN[name].partition(":")
        family = getattr(importlib.import_module(module), attr)
        _REGISTRY.setdefault(name, family)
        return _REGISTRY[name]
    raise RegistryError(f"unknown kernel family {name!r}; registered: {', '.join(names())}")


def check_op(family: KernelFamily, op: str) -> None:
    if op not in family.ops:
        raise RegistryError(
            f"unknown op {op!r} for kernel family {family.name!r}; its ops: {', '.join(family.ops)}"
        )
