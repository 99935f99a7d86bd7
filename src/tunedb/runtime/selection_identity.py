"""The identity of an epoch's kernel selection (launch_table.compile_token's hash): the selector's
state (arch, rankers, settings), the tier files as the epoch loaded them, tunedb's version, the
family's kernel hash and the run time's code (the launch table, the family's ops and autograd
formula). Two processes with equal identities choose the same kernels for every call.
"""
from __future__ import annotations

from typing import Any

_CODE: dict[tuple[str, str], str] = {}  # (family name, run-time file) -> _code_identity, for the process


def identity(sel: Any, family: Any, runtime_file: str) -> str:
    """A hash of what this epoch's selection depends on: the selector's state (arch, rankers,
    settings), the tier files as this epoch loaded them (what the selector serves from, not
    what is on disk now), tunedb's version, the family's kernel hash and this runtime's code."""
    import hashlib

    from tunedb.database import schema, tiers

    h = hashlib.sha1(sel.state_key().encode())
    arch_family, _profile = sel.current_arch()
    for tier in tiers.TIERS:
        res = tiers.get(tier, arch_family, family.name)
        loaded = "" if res is None or res.db is None else schema.dumps(res.db)
        h.update(f"{tier}:{'off' if res is None else res.state}:{loaded};".encode())
    h.update(_code_identity(family, runtime_file).encode())
    return h.hexdigest()[:16]


def _code_identity(family: Any, runtime_file: str) -> str:
    """tunedb's version, the family's kernel hash and this runtime's code (the decomposition,
    the autograd formula and resolution): fixed for the process, computed once per family name."""
    key = (family.name, runtime_file)
    if key not in _CODE:
        _CODE[key] = _code_hash(family, runtime_file)
    return _CODE[key]


def _code_hash(family: Any, runtime_file: str) -> str:
    import hashlib
    from pathlib import Path

    import tunedb

    import inspect

    impl = getattr(family, "impl_hash", None)
    h = hashlib.sha1(f"tunedb {tunedb.__version__}; {family.name} kernels {impl() if callable(impl) else impl};".encode())
    sources = [Path(runtime_file), *(Path(inspect.getfile(type(family))).parent / n for n in ("ops.py", "ops_autograd.py"))]
    for path in sources:
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()
