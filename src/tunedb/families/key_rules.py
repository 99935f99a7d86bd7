"""The checks every family's `sig_reason` starts with: the key names this family, one of its ops,
a dtype it serves, and positive integer sizes. Each family adds its own rules after these. And
the one check of a call's tensors every op shares: they live on one device."""
from __future__ import annotations

from typing import Any, Sequence

from tunedb.errors import ArgumentTypeError, OperandMismatchError

from tunedb.records import Signature


def head_reason(sig: Signature, family: str, ops: Sequence[str], dtypes: Sequence[str],
                positive: Sequence[str] = ()) -> str | None:
    """Why `sig` is not a key of `family` by its family, op, dt or the fields in `positive`
    (each a positive int); None when those hold."""
    if sig.family != family:
        return f"family {sig.family!r} is not {family}"
    if sig.op not in ops:
        return f"op={sig.op!r} is not one of {', '.join(ops)}"
    if sig.dt not in dtypes:
        return f"dt={sig.dt!r} is not served; allowed: {', '.join(dtypes)}"
    for key in positive:
        v = sig.get(key)
        if not isinstance(v, int) or v < 1:
            return f"{key}={v!r} must be a positive int"
    return None


def check_tensors(what: str, optional: tuple[str, ...] = (), **args: Any) -> None:
    """ArgumentTypeError (a SignatureError and a TypeError) naming each argument that is not a
    tensor (those named in `optional` may be None): a None or a number where a tensor belongs
    failed deep inside with an AttributeError."""
    import torch

    for name, t in args.items():
        if isinstance(t, torch.Tensor) or (t is None and name in optional):
            continue
        allowed = "a tensor or None" if name in optional else "a tensor"
        raise ArgumentTypeError(f"{what}'s {name} must be {allowed}, got {'None' if t is None else type(t).__name__}")


def check_one_device(what: str, **tensors: Any) -> None:
    """SignatureError naming each tensor's device unless all of `tensors` (None skipped; metas
    without a device too) are on one device: a CUDA kernel handed a CPU pointer fails inside
    Triton, and its key would fall back to torch for the epoch; a meta among CPU tensors made
    the dispatcher mix devices in the result."""
    first = None
    for t in tensors.values():  # every call of some ops runs this: compare, format only on failure
        dev = getattr(t, "device", None)
        if dev is None:
            continue
        if first is None:
            first = dev
        elif dev != first:
            listed = ", ".join(f"{name} on {t.device}" for name, t in tensors.items()
                               if getattr(t, "device", None) is not None)
            # also the RuntimeError torch raises for tensors on two devices (a CUDA model fed a CPU
            # input): code written against the plain model still catches it (s42 audit)
            raise OperandMismatchError(f"{what}'s tensors must be on one device; got {listed}")


def size(d: Any) -> Any:
    """A dimension as an int, except a traced one (torch.SymInt), which stays symbolic: int() on it
    specialises a compiled graph to that size (torch.compile(dynamic=True) recompiled per token
    count; torch.export with a dynamic dimension failed). Key fields still take int(): a key is
    concrete, and only eager calls build one."""
    return d if type(d) is int or type(d).__name__ == "SymInt" else int(d)


def check_mode(what: str, name: str, value: Any, allowed: Sequence[str]) -> None:
    """ArgumentTypeError naming a string argument given as another type (None, a number): the op's
    schema refused it in its own multi-line words. The value itself is the op's to check."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what}'s {name} must be a str, one of {', '.join(map(repr, allowed))}; "
                                f"got {type(value).__name__} {value!r}")


def check_operands(what: str, optional: tuple[str, ...] = (), **args: Any) -> None:
    """check_tensors for the arguments that take no part in torch's function protocol (a number, a
    list, None, a numpy array): a tensor, a subclass or a tracer's proxy (torch.fx) passes on to the
    op, which records or checks it; the others reached the op's schema, which refused them with a
    multi-line RuntimeError instead of the TypeError torch raises."""
    bad = {name: t for name, t in args.items()
           if not hasattr(type(t), "__torch_function__") and not (t is None and name in optional)}
    if bad:
        check_tensors(what, optional, **bad)
