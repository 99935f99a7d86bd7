"""Selection at the edge of what a table can say (session 55 probe): M=0, an empty call, resolves
to the family's own answer without asking the tables, whose region configs are invalid there
(each warned against the file that holds it)."""
from __future__ import annotations

import warnings

from tunedb import database, settings
from tunedb.records import Config, Entry, Region, Signature
from tunedb.runtime import selector

TILE = "b32x64x64_w4_s3_g8"
SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)


def test_m_zero_takes_the_default_without_a_warning(tmp_path):
    cfg = Config.from_json(TILE, {"lane": "triton_mma", "block": [32, 64, 64], "warps": 4, "stages": 3})
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        database.write_entries("user", "gemm", "sm90", [Entry(SIG, (Region(None, TILE),))], [cfg])
        selector.configure(arch_family="sm90")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                empty = selector.peek("gemm", SIG, 0)
            one = selector.peek("gemm", SIG, 1)
        finally:
            selector.configure()
    assert empty.tier == "default"
    assert (one.tier, one.config.id) == ("user", TILE)
