"""The pick rule: how one point's measured arms become its winner (partition, the build's steps
and autotune() all decide through PickRule), and the defaults of its simplicity and dependency
hooks. Part of the family contract (families.contract re-exports every name here). Pure Python:
nothing here imports torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping

from tunedb.records import SENTINELS


def default_simplicity(config_id: str) -> int:
    """Sentinels (the framework's own ops) are simpler than any tuned config."""
    return 0 if config_id in SENTINELS else 1


def no_dependency(config_id: str) -> str | None:
    return None


@dataclass(frozen=True)
class PickResult:
    """One point's pick: the winner and the winner among dependency-free arms (spec 003)."""

    winner: str
    native: str
    reason: str = ""


@dataclass(frozen=True)
class PickRule:
    """The one pick rule: partition, the build's steps and autotune() all decide through it.

    fallback: the arm a config must beat by `min_speedup` to be served (GEMM: torch, 1.05x; 1.0
    turns the gate off) and the arm of the catch-all region above the largest measured size;
    tie_band: an arm within this share of the fastest counts as fast as it, and the simpler one
    wins (`simplicity`: config id -> rank, lower is simpler; among equal ranks the fallback);
    dep_margin: an arm whose `dependency` is not None (it needs an optional library) wins only
    beyond this margin over the best dependency-free arm (spec 003: 5%);
    dep_tie_band: the tie band among the dependency arms themselves (None: tie_band; the band
    used is never narrower than tie_band). Linalg sets it to its dep_margin: a tier of many
    near-equal configs (the CUDA tier: up to eight a cell) put an arm near a 2% edge in one cell
    in twenty, and two tunes disagreed on 13 of 216 served picks (session 25);
    peers: arms as safe as the fallback (the same library in another mode, e.g. cuDNN with its
    autotuner beside torch's default): among the fallback and its peers the measured fastest
    serves, with no gate between them, and the gate compares every other arm against it;
    gate_noise: how much a config's speedup over the reference moves between two builds of the
    same points (relative, per point); a region of n measured points must clear
    min_speedup x (1 + gate_noise / sqrt(n)), so a win resting on one noisy point needs a wider
    margin than one repeated across a region (a re-run then emits the same regions).
    """

    fallback: str = "torch"
    min_speedup: float = 1.05
    tie_band: float = 0.03
    dep_margin: float = 0.05
    dep_tie_band: float | None = None
    simplicity: Callable[[str], int] = default_simplicity
    dependency: Callable[[str], str | None] = no_dependency
    peers: tuple[str, ...] = ()
    gate_noise: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.fallback, str) or not self.fallback:
            raise ValueError(f"pick rule fallback={self.fallback!r} must name an arm")
        if not self.min_speedup >= 1.0:
            raise ValueError(f"pick rule min_speedup={self.min_speedup} must be >= 1.0")
        if not 0.0 <= self.tie_band < 1.0:
            raise ValueError(f"pick rule tie_band={self.tie_band} must be in [0, 1)")
        if not 0.0 <= self.gate_noise < 1.0:
            raise ValueError(f"pick rule gate_noise={self.gate_noise} must be in [0, 1)")
        if not self.dep_margin >= 0.0:
            raise ValueError(f"pick rule dep_margin={self.dep_margin} must be >= 0")
        if self.dep_tie_band is not None and not 0.0 <= self.dep_tie_band < 1.0:
            raise ValueError(f"pick rule dep_tie_band={self.dep_tie_band} must be None or in [0, 1)")

    def order(self, config_id: str) -> tuple[int, int, str]:
        """Sort key, simplest first: by simplicity, the fallback first among equals, then by id."""
        return (self.simplicity(config_id), 0 if config_id == self.fallback else 1, config_id)

    def dep_band(self) -> float:
        """The tie band among dependency arms: dep_tie_band, never narrower than tie_band."""
        return self.tie_band if self.dep_tie_band is None else max(self.tie_band, self.dep_tie_band)

    def dep_tie_pick(self, times: Mapping[str, float]) -> str:
        """The simplest dependency arm within dep_band() of the fastest of `times`."""
        return replace(self, tie_band=self.dep_band()).tie_pick(times)

    def is_native(self, config_id: str) -> bool:
        return self.dependency(config_id) is None

    def tie_pick(self, times: Mapping[str, float]) -> str:
        """The simplest arm within the tie band of the fastest (times as charged by the caller)."""
        if not times:
            raise ValueError("tie_pick needs at least one measured arm")
        best = min(times.values())
        tied = [c for c, t in times.items() if t <= best * (1.0 + self.tie_band)]
        return min(tied, key=self.order)

    def reference(self, times: Mapping[str, float]) -> str | None:
        """The arm the gate compares against: the fastest measured of the fallback and its peers
        (the fallback among equals); None when none of them is measured."""
        measured = [c for c in (self.fallback, *self.peers) if c in times]
        return min(measured, key=lambda c: (times[c], self.order(c))) if measured else None

    def required(self, n_points: float = 1.0) -> float:
        """The speedup over the reference a region of n measured points must show: min_speedup,
        times 1 + gate_noise / sqrt(n) (n may be an effective, traffic-weighted count)."""
        if self.min_speedup <= 1.0 or not self.gate_noise:
            return self.min_speedup
        return self.min_speedup * (1.0 + self.gate_noise / math.sqrt(max(1.0, n_points)))

    def gate(self, config_id: str, time: float, times: Mapping[str, float]) -> tuple[str, str]:
        """(arm, reason): `config_id` unless the reference (the fallback, or its fastest peer) is
        measured and it does not beat it by min_speedup (1.0: no gate; the tie band alone
        decides, as in spec 003). The fallback or a peer picked gives way to the reference."""
        ref = self.reference(times)
        if ref is None or config_id == ref:
            return config_id, ""
        if config_id in (self.fallback, *self.peers):
            return ref, f"{config_id} gave way to its peer {ref} ({times[config_id] / times[ref]:.3f}x its time)"
        if self.min_speedup == 1.0:
            return config_id, ""
        speedup, need = times[ref] / time, self.required(1.0)
        if speedup < need:
            return ref, f"{config_id} kept {ref} ({speedup:.2f}x < {need:.2f}x gate)"
        return config_id, f"{config_id} ({speedup:.2f}x vs {ref})"

    def pick(self, times: Mapping[str, float]) -> PickResult:
        """One point's pick from measured times {arm: ms} (lower is better): the simplest
        dependency-free arm within the tie band of the fastest of them; a dependency arm instead
        where one beats the fastest dependency-free arm by more than dep_margin (of those that
        do, the simplest within dep_band() of the fastest); then the gate against the fallback."""
        clean = {c: float(t) for c, t in times.items() if t is not None and t > 0}
        if not clean:
            raise ValueError("pick needs at least one arm with a positive time")
        native = {c: t for c, t in clean.items() if self.is_native(c)}
        deps = {c: t for c, t in clean.items() if not self.is_native(c)}
        native_pick = self.tie_pick(native) if native else None
        best = native_pick
        if deps:
            # only arms that clear the margin compete, so a slower arm of the tier joining a cell
            # never hands it back to the native arms (session 25's review)
            eligible = {c: t for c, t in deps.items()
                        if not native or min(native.values()) > t * (1.0 + self.dep_margin)}
            if eligible:
                best = self.dep_tie_pick(eligible)
        winner, reason = self.gate(best, clean[best], clean)
        if native_pick is None:
            return PickResult(winner, winner, reason)
        return PickResult(winner, self.gate(native_pick, native[native_pick], native)[0], reason)


__all__ = ["PickResult", "PickRule", "default_simplicity", "no_dependency"]
