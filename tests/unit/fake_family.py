"""A small fake kernel family for database and selector tests (no torch, no GPU).

Configs: a, b, big (compiled) and zz (in the space, never compiled). `big` needs N >= 64:
that is its validity predicate. The default config is `a`; op `mm_act` also has `fused`.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from tunedb import families
from tunedb.families.contract import SignatureSchema, VerifyRule
from tunedb.errors import ConfigError
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

SPACE = {
    "a": Config("a", "toy", (("block", 16),)),
    "b": Config("b", "toy", (("block", 32),)),
    "big": Config("big", "toy", (("block", 64),)),
    "zz": Config("zz", "toy", (("block", 8),)),
}
COMPILED = ("a", "b", "big")


class FakeFamily:
    name = "fake"
    ops = ("mm", "mm_act")
    lanes = ("toy", "torch", "fused")
    impl_hash = "fakehash1"
    schema = SignatureSchema(key=(("N", int), ("K", int)))
    verify = VerifyRule()

    def __init__(self) -> None:
        self.compile_calls: list[tuple[str, tuple[str, ...]]] = []

    def signature_of(self, op: str, *args: Any, **kwargs: Any) -> tuple[Signature, int]:
        m, n, k = args[:3]
        return Signature.make(self.name, op, kwargs.get("dt", "half"), N=n, K=k), m

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return tuple(c for c in SPACE.values() if lanes is None or c.lane in lanes)

    def parse_config(self, config_id: str) -> Config:
        if config_id in SENTINELS:
            return Config.sentinel(config_id)
        if config_id not in SPACE:
            raise ConfigError(f"unknown fake config {config_id!r}")
        return SPACE[config_id]

    def invalid_reason(self, config: Config, sig: Signature, m: int | None,
                       arch: ArchProfile) -> str | None:
        block = config.param("block")
        if block is not None and block > sig.get("N", 0):
            return f"block {block} > N={sig.get('N')}"
        return None

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return ("default", "torch", "fused") if sig.op == "mm_act" else ("default", "torch")

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return SPACE["a"]

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        referenced = tuple(referenced)
        self.compile_calls.append((arch_family, referenced))
        return tuple(SPACE[c] for c in COMPILED)

    def launch(self, config: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        return ("launched", config.id)

    def reference(self, sig: Signature, *args: Any, **kwargs: Any) -> Any:
        return ("reference", sig.format())

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int):
        return ((m, sig.get("N"), sig.get("K")), {})

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        n, k = sig.get("N"), sig.get("K")
        return 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)


def install() -> FakeFamily:
    fam = FakeFamily()
    families.register(fam, replace=True)
    return fam


def sig(n: int = 128, k: int = 64, dt: str = "half", op: str = "mm") -> Signature:
    return Signature.make("fake", op, dt, N=n, K=k)


def valid_raw(**over: Any) -> dict[str, Any]:
    """A valid fake-family file as raw JSON data (a fresh copy each call)."""
    raw: dict[str, Any] = {
        "schema": 1, "kernel_family": "fake", "arch_family": "sm90",
        "validators": {"impl_hash": "fakehash1", "sku": "NVIDIA H200", "triton": "3.6.0",
                       "torch": "2.11.0+cu130", "cuda": "13.0", "tunedb": "0.1.0"},
        "configs": {"a": {"lane": "toy", "block": 16}, "b": {"lane": "toy", "block": 32},
                    "big": {"lane": "toy", "block": 64}, "zz": {"lane": "toy", "block": 8}},
        "entries": {
            "fake|op=mm|dt=half|N=128|K=64": {
                "regions": [[64, "a"], [512, "b"], [None, "torch"]],
                "evidence": {"M=64": {"a": [0.01, 0.001, 9], "b": [0.02, 0.001, 9], "_l2": "warm"},
                             "M=512": {"b": [0.05, 0.002, 9], "big": "compile_error"}},
                "source": "build",
                "notes": ["M=64*: a (1.5x vs default)"],
            },
        },
        "model": {"alpha": 1.5, "per_config": {"a": [1, 2]}},
    }
    raw.update(over)
    return raw


class TierDirs:
    """A system root and a user root in a temp dir, with the tiers pointed at them."""

    def __init__(self, base) -> None:
        self.system = base / "system"
        self.user = base / "user"
        self.system.mkdir()
        self.user.mkdir()

    def path(self, tier: str, arch: str = "sm90", family: str = "fake"):
        return (self.system if tier == "system" else self.user) / arch / f"{family}.json"

    def write(self, tier: str, raw: Any, arch: str = "sm90", family: str = "fake", text: str | None = None):
        import json

        path = self.path(tier, arch, family)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text if text is not None else json.dumps(raw))
        return path


def tier_dirs_fixture():
    """Build the `tier_dirs` pytest fixture (import it into a test module by that name)."""
    import pytest

    from tunedb import settings
    from tunedb.database import tiers

    @pytest.fixture
    def tier_dirs(tmp_path):
        dirs = TierDirs(tmp_path)
        with settings.override(USER_DB=str(dirs.user)), tiers.system_root_override(dirs.system):
            yield dirs

    return tier_dirs


def entry_raw(regions, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"regions": regions, "source": "build"}
    out.update(extra)
    return out
