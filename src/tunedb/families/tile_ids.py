"""The tile config-id grammar the tiled-GEMM families share, one frozen `TileIds` per family.

    [{prefix}_]b{BM}x{BN}x{BK}_w{W}_s{S}[_g{G}]      b64x128x32_w4_s3_g8   rc_b64x128x64_w4_s3

A family states its lanes (with the id prefix of each when it has several), its sentinels, the
values each field may take and how its errors name it; `make`, `parse` and `blocks` then give
the family's Config objects (params: block, warps, stages[, group_m]) and its error texts.
Pure Python (no torch, no triton).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tunedb.errors import ConfigError
from tunedb.records import SENTINELS, Config


def blocks(cfg: Config) -> tuple[int, int, int]:
    """(BM, BN, BK) of a tile config."""
    return tuple(cfg.param("block"))  # type: ignore[return-value]


@dataclass(frozen=True)
class TileIds:
    """One family's tile ids. `stages` as a tuple is a set of allowed values checked in field
    order; as a range it is a bound checked after the other fields (its error says lo..hi).
    `groups` empty: ids carry no _g and configs no group_m."""

    family: str
    lanes: tuple[tuple[str, str], ...]  # (lane, id prefix); prefix "" for a family of one lane
    sentinels: tuple[str, ...]
    examples: str  # the ids a bad-id error offers
    blocks_m: tuple[int, ...]
    blocks_n: tuple[int, ...]
    blocks_k: tuple[int, ...]
    warps: tuple[int, ...]
    stages: tuple[int, ...] | range
    groups: tuple[int, ...] = ()
    owner: str = ""  # how the unknown-sentinel error names the family; "" is the family's name
    label: str = ""  # how make() errors name a config ("bmm config"); "" is the lane's name
    _id: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prefixes = [p for _, p in self.lanes]
        if len(set(prefixes)) != len(prefixes) or (len(prefixes) > 1 and "" in prefixes):
            raise ValueError(f"{self.family}: lanes need distinct, non-empty id prefixes: {self.lanes}")
        pre = "(?P<pre>" + "|".join(map(re.escape, prefixes)) + ")" + ("_" if prefixes[0] else "")
        group = r"_g(?P<g>\d+)" if self.groups else ""
        object.__setattr__(self, "_id", re.compile(
            rf"^{pre}b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+){group}$"))

    @property
    def lane_names(self) -> tuple[str, ...]:
        return tuple(lane for lane, _ in self.lanes)

    def make(self, bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int | None = None,
             lane: str | None = None) -> Config:
        """The config of one tile; ConfigError naming the first field out of its allowed set."""
        lane = self.lanes[0][0] if lane is None else lane
        prefix = dict(self.lanes).get(lane)
        if prefix is None:
            raise ConfigError(f"unknown {self.family} lane {lane!r}; Triton lanes are {', '.join(self.lane_names)}")
        fields = [("BM", bm, self.blocks_m), ("BN", bn, self.blocks_n), ("BK", bk, self.blocks_k),
                  ("warps", warps, self.warps)]
        if not isinstance(self.stages, range):
            fields.append(("stages", stages, self.stages))
        if self.groups:
            fields.append(("group_m", group_m, self.groups))
        label = self.label or lane
        for name, v, allowed in fields:
            if v not in allowed:
                raise ConfigError(f"{label} config: {name}={v} not allowed; use one of {allowed}")
        if isinstance(self.stages, range) and not self.stages.start <= stages <= self.stages[-1]:
            lo, hi = self.stages.start, self.stages[-1]
            raise ConfigError(f"{label} config: stages={stages} not allowed; use {lo}..{hi}")
        cid = f"{prefix}_" if prefix else ""
        cid += f"b{bm}x{bn}x{bk}_w{warps}_s{stages}" + (f"_g{group_m}" if self.groups else "")
        params: tuple = (("block", (bm, bn, bk)), ("warps", warps), ("stages", stages))
        if self.groups:
            params += (("group_m", group_m),)
        return Config(cid, lane, params)

    def sentinel(self, config_id: object) -> Config | None:
        """The sentinel config `config_id` names, None when it names none; ConfigError for a
        non-string or a sentinel this family does not serve."""
        if not isinstance(config_id, str):
            raise ConfigError(f"config id must be a string, got {config_id!r}")
        if config_id not in SENTINELS:
            return None
        if config_id not in self.sentinels:
            raise ConfigError(f"{self.owner or self.family} has no {config_id!r} arm; "
                              f"sentinels: {', '.join(self.sentinels)}")
        return Config.sentinel(config_id)

    def match(self, config_id: str) -> Config | None:
        """The tile config of a tile id, None when `config_id` is not one; ConfigError when it
        is one with a field out of range or not written canonically."""
        m = self._id.match(config_id)
        if not m:
            return None
        lane = next(lane for lane, p in self.lanes if p == m["pre"])
        cfg = self.make(int(m["bm"]), int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]),
                        int(m["g"]) if self.groups else None, lane=lane)
        return canonical(config_id, cfg)

    def parse(self, config_id: str) -> Config:
        """A config from its id (sentinels included); ConfigError naming the id when malformed.
        Families cache it (`parse = lru_cache(...)(TILE_IDS.parse)`)."""
        cfg = self.sentinel(config_id) or self.match(config_id)
        if cfg is None:
            raise ConfigError(f"bad {self.family} config id {config_id!r}: expected {self.examples} "
                              f"or a sentinel ({', '.join(self.sentinels)})")
        return cfg


def canonical(config_id: str, cfg: Config) -> Config:
    """`cfg` when `config_id` is its id as written; ConfigError naming both otherwise."""
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg
