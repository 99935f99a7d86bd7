"""A test-only kernel family, written against the contract alone (families.contract).

Op `recip`: x <- 1 / x in place, for a batch of `batch` rows of n values. Its key has no N or K
(`toyrecip|op=recip|dt=fp32|n=32`), its size axis is the batch (ladder pow2), its op overwrites
its input (input policy RING), its verify rule is a residual, its pick rule is its own (no gate,
a 2% tie band with its own simplicity order) and it has no cost model. Configs `chunkC` process
C rows per step; `chunk16` needs n <= 64 (its validity predicate); `skip2` (parseable, not in the
space) forgets every other chunk (wrong on purpose: the gate must stop it). Fresh inputs lie in [1, 2), outputs in (0.5, 1]:
a launch whose input holds a value below 1 is running on an earlier launch's output, and LOG
records that for every launch. Registration: install().
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from tunedb import families
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.contract import CensusRule, InputPolicy, PickRule, SignatureSchema, VerifyRule
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

NAME = "toyrecip"
LOG: list[bool] = []  # per launch: whether its input already held an output (must never happen)
SPACE = {cid: Config(cid, "rows", params) for cid, params in (
    ("chunk1", (("chunk", 1),)), ("chunk4", (("chunk", 4),)), ("chunk16", (("chunk", 16),)))}
WRONG = {"skip2": Config("skip2", "rows", (("chunk", 2), ("skip", 1)))}  # parseable, never in the space
_DT = {torch.float32: "fp32", torch.float64: "fp64"}
_TORCH_DT = {v: k for k, v in _DT.items()}
_SIMPLE = {"torch": 0, "default": 1, "chunk16": 2, "chunk4": 3, "chunk1": 4}


def _record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[tuple[Signature, int]]:
    x = args[0]
    if x.dim() != 2 or x.dtype not in _DT or recorder.is_weight(x):
        return []
    return [(TOY.schema.make(NAME, "recip", _DT[x.dtype], n=int(x.shape[1])), int(x.shape[0]))]


class ToyFamily:
    name = NAME
    ops = ("recip",)
    lanes = ("rows", "torch")
    schema = SignatureSchema(key=(("n", int),), size="batch", ladder="pow2", dtypes=("fp32", "fp64"))
    verify = VerifyRule("residual", bound=1e-5)
    impl_hash = "toyrecip-1"

    def signature_of(self, op: str, x: Any) -> tuple[Signature, int]:
        if op not in self.ops or x.dim() != 2 or x.dtype not in _DT:
            raise SignatureError(f"toyrecip needs op 'recip' on a 2-D fp32/fp64 tensor, got {op!r} {x.dtype}")
        return self.schema.make(NAME, op, _DT[x.dtype], n=int(x.shape[1])), int(x.shape[0])

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return tuple(c for c in SPACE.values() if lanes is None or c.lane in lanes)

    def parse_config(self, config_id: str) -> Config:
        if config_id in SENTINELS:
            return Config.sentinel(config_id)
        if config_id in WRONG:
            return WRONG[config_id]
        if config_id not in SPACE:
            raise ConfigError(f"unknown toyrecip config {config_id!r}; configs: {', '.join(SPACE)}")
        return SPACE[config_id]

    def invalid_reason(self, config: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
        if config.param("chunk") == 16 and sig.get("n") > 64:
            return f"chunk16 needs n <= 64, got n={sig.get('n')}"
        return None

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return ("default", "torch")

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return SPACE["chunk4"]

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        return tuple(SPACE.values())

    def launch(self, config: Config, sig: Signature, x: Any, out: Any = None) -> Any:
        LOG.append(bool((x < 1).any()))
        if config.id == "torch":
            return x.reciprocal_()
        if config.id == "default":
            config = self.default_config(sig)
        chunk, skip = config.param("chunk"), config.param("skip", 0)
        for i in range(0, x.shape[0], chunk * (1 + skip)):
            x[i:i + chunk].reciprocal_()
        return x

    def reference(self, sig: Signature, x: Any) -> Any:
        return 1.0 / x.double()

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict]:
        g = torch.Generator().manual_seed(seed)
        x = 1.0 + torch.rand(m, sig.get("n"), generator=g, dtype=_TORCH_DT[sig.dt])
        return (x.to(device),), {}

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        n = sig.get("n")
        return float(m * n), float(2 * m * n * (4 if sig.dt == "fp32" else 8))

    # optional hooks
    def pick_rule(self) -> PickRule:
        return PickRule(fallback="torch", min_speedup=1.0, tie_band=0.02, dep_margin=0.05,
                        simplicity=lambda cid: _SIMPLE.get(cid, 9))

    def input_policy(self, sig: Signature) -> InputPolicy:
        return InputPolicy.RING

    def residual(self, sig: Signature, args: tuple, kwargs: dict, out: Any) -> float:
        return float((out.double() * args[0].double() - 1.0).abs().max())

    def census_rules(self) -> tuple[CensusRule, ...]:
        return (CensusRule(("reciprocal_",), _record),)

    def register_ops(self) -> None:
        from tunedb.runtime import dispatch

        @torch.library.custom_op("toyrecip::recip_", mutates_args=("x",))
        def recip_(x: torch.Tensor) -> None:
            dispatch.call(NAME, "recip", x)


TOY = ToyFamily()


def install() -> ToyFamily:
    families.register(TOY, replace=True)
    return TOY
