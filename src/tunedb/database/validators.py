"""Soft validators: the environment an entry was measured in, and whether it is stale now.

Hard validators (schema, kernel family, arch family) live in schema.check_hard: a mismatch
makes a file unusable. Soft ones (impl_hash, sku, triton, torch, cuda, tunedb) only mark
entries stale. They describe the entries, not the last writer: an entry's own validators are
the file's, overlaid by the entry's `soft` field. A value that is a tuple means the entry mixes
points measured under several values; it stays stale until the entry is rebuilt.
"""
from __future__ import annotations

from typing import Any, Mapping

from tunedb.database.schema import SOFT_VALIDATORS

Validators = Mapping[str, Any]  # name -> str, or tuple[str, ...] for a mixed entry


def current(impl_hash: str | None = None) -> dict[str, str]:
    """This process's soft validators. Imports torch and triton lazily; a value it cannot
    determine (no GPU: no sku) is left out, and what is left out is never called stale."""
    from tunedb import __version__

    out: dict[str, str] = {"tunedb": __version__}
    if impl_hash:
        out["impl_hash"] = impl_hash
    try:
        import triton

        out["triton"] = str(triton.__version__)
    except Exception:  # triton absent or broken: the validator is unknown, not a mismatch
        pass
    try:
        import torch

        out["torch"] = str(torch.__version__)
        if torch.version.cuda:
            out["cuda"] = str(torch.version.cuda)
        if torch.cuda.is_available():
            out["sku"] = torch.cuda.get_device_name()
    except Exception:
        pass
    return out


def family_impl_hash(family: Any) -> str | None:
    """A kernel family's implementation hash: its `impl_hash` attribute, a str or a callable."""
    value = getattr(family, "impl_hash", None)
    if callable(value):
        value = value()
    return str(value) if value else None


def impl_hash_of(kernel_family: str) -> str | None:
    """The registered family's implementation hash; None (unknown, never a mismatch) when the
    family is not registered or cannot be loaded here."""
    from tunedb import families

    try:
        return family_impl_hash(families.get(kernel_family))
    except Exception:
        return None


def effective(file_validators: Validators, soft: Validators) -> dict[str, Any]:
    """The validators one entry was measured under."""
    out = dict(file_validators)
    out.update(soft)
    return out


UNKNOWN = "unknown"  # an entry measured before its writer recorded this validator


def stale_reasons(entry_validators: Validators, now: Validators) -> tuple[str, ...]:
    """Why an entry measured under `entry_validators` is stale in environment `now` (empty: fresh)."""
    reasons = []
    for key in SOFT_VALIDATORS:
        was, cur = entry_validators.get(key), now.get(key)
        if isinstance(was, tuple):
            reasons.append(f"{key} mixed: measured under {', '.join(was)}")
        elif was == UNKNOWN and cur is not None:
            reasons.append(f"{key} not recorded when measured (now {cur})")
        elif was is not None and cur is not None and was != cur:
            reasons.append(f"{key} {was} (now {cur})")
    return tuple(reasons)


def mixed(old: Validators, new: Validators) -> dict[str, Any]:
    """The validators of an entry that keeps points measured under `old` and gains points
    measured under `new`: every key on which they differ becomes a tuple of both values."""
    out = dict(new)
    for key in SOFT_VALIDATORS:
        a, b = old.get(key), new.get(key)
        if a is None or a == b:
            if a is not None:
                out[key] = a
            continue
        values = list(a) if isinstance(a, tuple) else [a]
        for v in (b if isinstance(b, tuple) else (b,) if b is not None else ()):
            if v not in values:
                values.append(v)
        out[key] = tuple(values) if len(values) > 1 else values[0]
    return out


def soft_field(entry_validators: Validators, file_validators: Validators) -> dict[str, Any]:
    """The `soft` field that makes an entry in a file stamped `file_validators` keep its own
    validators: every key where they differ (a key the file lacks is kept too). A key the file
    has and the entry was never measured under is UNKNOWN there, not the file's value."""
    out = {k: v for k, v in entry_validators.items()
           if k in SOFT_VALIDATORS and file_validators.get(k) != v}
    for k in SOFT_VALIDATORS:
        if k in file_validators and k not in entry_validators:
            out[k] = UNKNOWN
    return out
