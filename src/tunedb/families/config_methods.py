"""The config half of the KernelFamily protocol, answered by a family's own `configs` module.

Most families keep their config space, id grammar, validity predicate, sentinels, untuned default
and compile set as functions of one `configs` module; a family class that inherits ConfigMethods
and names that module (`configs = <module>`) gets the six protocol members as plain delegations,
and defines any of them itself where its answer is not the module's. It also gets the two members
every such family wrote the same way: its repr, and warm_start importing the family package's
`kernels` module (Triton and the jit functions, before the first timed call).
"""
from __future__ import annotations

import importlib
from typing import Any, Iterable, Sequence

from tunedb.records import ArchProfile, Config, Signature


class ConfigMethods:
    """config_space, parse_config, invalid_reason, sentinels, default_config and compile_set, each
    calling the function of the same name (parse_config: `parse`) in `self.configs`."""

    configs: Any  # the family's configs module
    name: str

    def __repr__(self) -> str:
        return f"<tunedb family {self.name}>"

    def warm_start(self) -> None:
        importlib.import_module(type(self).__module__ + ".kernels")

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        return self.configs.config_space(arch_family, lanes)

    def parse_config(self, config_id: str) -> Config:
        return self.configs.parse(config_id)

    def invalid_reason(self, config: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
        return self.configs.invalid_reason(config, sig, m, arch)

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        return self.configs.sentinels(sig, approximate)

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        return self.configs.default_config(sig, arch)

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        return self.configs.compile_set(arch_family, referenced)
