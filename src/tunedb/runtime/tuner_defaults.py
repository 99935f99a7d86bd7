"""The autotuner's defaults, each injectable: the measurer (the build's measurement protocol), the
publisher (a locked merge into the user tier) and the validators its cache file is keyed by."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tunedb.records import Config, Entry, Measurement, Signature
from tunedb.runtime.autotune_cache import SOFT_KEYS

# measurer(family, sig, m, config_ids, incumbent) -> one Measurement per arm it measured
Measurer = Callable[[Any, Signature, int, "tuple[str, ...]", "str | None"], Sequence[Measurement]]
# publisher(kernel_family, arch_family, entries, configs) -> None
Publisher = Callable[[str, str, "tuple[Entry, ...]", "dict[str, Config]"], Any]


def protocol_measurer(family: Any, sig: Signature, m: int, config_ids: tuple[str, ...],
                      incumbent: str | None, *, working_set_bytes: int | None = None,
                      timer: Any = None) -> Sequence[Measurement]:
    """The measurement protocol with its default (CUDA-graph) timer, as the build uses it.

    A serving process may share its GPU, so a busy GPU is measured anyway (results marked
    contended) rather than refused. working_set_bytes (the served model's weights, when known)
    decides whether weights are timed cold or warm; timer None is the CUDA-graph timer."""
    from tunedb.measure import protocol

    return protocol.measure_point(family, sig, m, list(config_ids), alpha=0.0,
                                  incumbent=incumbent, allow_busy=True, timer=timer,
                                  working_set_bytes=working_set_bytes)


def user_tier_publisher(kernel_family: str, arch_family: str, entries: tuple[Entry, ...],
                        configs: dict[str, Config]) -> Any:
    """Merge entries into the user tier: lock, re-read, extend the entries, atomic write."""
    from tunedb import database

    return database.write_entries("user", kernel_family, arch_family, entries, configs, extend=True)


def environment(arch_family: str) -> dict[str, str]:
    """The cache's validators: arch family (hard) plus SKU and versions (soft)."""
    from tunedb import database

    env = {"arch_family": arch_family}
    for key, value in database.current_validators().items():
        if key in SOFT_KEYS:
            env[key] = value
    return env
