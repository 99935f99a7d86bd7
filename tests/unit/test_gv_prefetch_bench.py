"""bench/gv_prefetch.py's arms: every id it times parses back to the kernel parameters it launches
with (the layer chain picks arms by id), the wide first tile fits its register rule, and the
layer chain's family picks are ids of the GEMM family valid at their Llama widths at M=1."""
import pytest

pytest.importorskip("triton")

from bench_modules import bench_module  # noqa: E402


def test_arm_ids_round_trip_and_fit():
    gp = bench_module("gv_prefetch")
    for m in (1, 16):
        for n, k in gp.SHAPES:
            got = gp.arms(m, k)
            assert got and all(gp._parse(aid) == (cfg, pre, pdl) for aid, cfg, pre, pdl in got)
            assert all(gp.fits(cfg, pre, k) for _, cfg, pre, _ in got if pre > 1)
            assert any(pre > 1 for _, _, pre, _ in got)  # wide first tiles at every weight
            assert all(cfg[4] == (m > 4) for _, cfg, _, _ in got)  # the FMA path at M=1, tensor cores at 16


def test_family_chain_picks_are_valid_family_configs():
    from tunedb.arch import shipped_profile
    from tunedb.families.gemm import FAMILY

    gp = bench_module("gv_prefetch")
    for name, cid in gp.FAMILY_PICKS.items():
        n, k = gp.LLAMA[name]
        sig = FAMILY.make_signature("gemm", "bf16", n, k)
        for c in (cid, cid + "_pdl"):
            assert FAMILY.invalid_reason(FAMILY.parse_config(c), sig, 1, shipped_profile("sm90")) is None, c
