"""The extension seam: the registry of kernel families.

A family is one registry entry that implements the contract in ``families.contract`` (the
KernelFamily Protocol plus optional hooks looked up with ``contract.hook``). The pipeline and the
run time reach families only through this registry; built-in families are imported lazily by
name so that ``import tunedb`` touches neither torch nor the GPU.
"""
from __future__ import annotations

import importlib

from tunedb.errors import RegistryError, SignatureError
from tunedb.families.contract import KernelFamily, hook, missing_members

__all__ = ["DEFAULT", "KernelFamily", "check_op", "get", "hook", "names", "register"]


# Registration: the built-in families, imported on first use, and the one a command or API
# call serves when none is named.
_BUILTIN: dict[str, str] = {"gemm": "tunedb.families.gemm:FAMILY",
                            "bmm": "tunedb.families.bmm:FAMILY",
                            "gemm_log_softmax": "tunedb.families.gemm_log_softmax:FAMILY",
                            "group_gemm": "tunedb.families.group_gemm:FAMILY",
                            "linalg": "tunedb.families.linalg:FAMILY",
                            "rnn": "tunedb.families.rnn:FAMILY",
                            "scaled_mm": "tunedb.families.scaled_mm:FAMILY",
                            "conv": "tunedb.families.conv:FAMILY",
                            "scaled_mm_fp8": "tunedb.families.scaled_mm:FAMILY_FP8"}
DEFAULT = "gemm"
KEY_SIZE_MAX = 2**31 - 1  # a key's size field: a tensor dimension a kernel is launched with (32-bit)
_REGISTRY: dict[str, KernelFamily] = {}


def register(family: KernelFamily, *, replace: bool = False) -> None:
    missing = missing_members(family)
    if missing:
        raise TypeError(f"{family!r} does not implement the KernelFamily protocol: it lacks "
                        f"{', '.join(missing)}")
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


def check_key(sig: Signature) -> None:
    """SignatureError when `sig`'s key fields are not what its family's schema requires (missing,
    extra, mistyped, not positive). Families without a `check_key` hook, and signatures of a
    family not registered here, are not checked."""
    if sig.family not in names():
        return
    family = get(sig.family)
    hook = getattr(family, "check_key", None)
    if hook is not None:
        hook(sig)
        return
    schema = getattr(family, "schema", None)
    if schema is None:
        return
    schema.check(sig, dtype=False)
    flags = dict(schema.choices)
    for name, typ in schema.key:
        value = sig.get(name)
        if typ is int and name not in flags and value is not None and not 1 <= value <= KEY_SIZE_MAX:
            raise SignatureError(f"signature {sig.format()!r}: {name}={value} must be a positive integer "
                                 f"at most {KEY_SIZE_MAX} (a size a kernel is launched with)")


def check_op(family: KernelFamily, op: str) -> None:
    if op not in family.ops:
        raise RegistryError(
            f"unknown op {op!r} for kernel family {family.name!r}; its ops: {', '.join(family.ops)}"
        )


def serves(family: KernelFamily, sig: Signature) -> bool:
    """Whether `family` tunes calls keyed `sig`: its op and, where the schema lists dtypes, its
    dtype (a census also records calls the family leaves to torch, fp32 GEMMs among them)."""
    dtypes = family.schema.dtypes
    return sig.family == family.name and sig.op in family.ops and (not dtypes or sig.dt in dtypes)
