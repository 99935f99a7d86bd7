"""The shared tile-id grammar (families/tile_ids.py): ids round-trip, errors name the bad part."""
import pytest

from tunedb.errors import ConfigError
from tunedb.families.bmm import configs as bmm
from tunedb.families.conv import configs as conv
from tunedb.families.gemm_log_softmax import configs as gls
from tunedb.families.group_gemm import configs as group_gemm
from tunedb.families.tile_ids import TileIds, blocks


@pytest.mark.parametrize("mod", [bmm, group_gemm, gls, conv], ids=["bmm", "group_gemm", "gls", "conv"])
def test_every_tile_of_a_family_round_trips(mod):
    for cfg in mod.full_grid():
        assert mod.parse(cfg.id) == cfg
        if cfg.lane.startswith("triton") and cfg.lane != "triton_dw":
            assert blocks(cfg) == cfg.param("block")


def test_ids_carry_the_lane_prefix_and_group_only_where_declared():
    assert bmm.make(64, 128, 32, 4, 3).id == "b64x128x32_w4_s3_g8"
    assert bmm.make(64, 128, 32, 4, 3).param("group_m") == 8
    fx = gls.make("triton_fixup", 64, 128, 64, 4, 3)
    assert (fx.id, fx.lane, fx.param("group_m")) == ("fx_b64x128x64_w4_s3", "triton_fixup", None)
    assert gls.parse("rc_b64x128x64_w4_s3").lane == "triton_recompute"
    assert conv.parse("ig_b64x64x32_w4_s3").lane == "triton_igemm"


def test_errors_name_the_family_and_the_bad_value():
    with pytest.raises(ConfigError, match=r"config id 'b064x64x32_w4_s3_g8' is not canonical; expected 'b64x64x32_w4_s3_g8'"):
        bmm.parse("b064x64x32_w4_s3_g8")
    with pytest.raises(ConfigError, match=r"bmm config: stages=7 not allowed; use 1\.\.6"):
        bmm.parse("b64x64x32_w4_s7_g8")
    with pytest.raises(ConfigError, match=r"group_gemm config: stages=1 not allowed; use one of \(2, 3, 4, 5\)"):
        group_gemm.make(64, 64, 64, 4, 1, 8)
    with pytest.raises(ConfigError, match=r"gemm_log_softmax has no 'fused' arm; sentinels: default, torch"):
        gls.parse("fused")
    with pytest.raises(ConfigError, match=r"bad gemm_log_softmax config id 'xx_b64x128x64_w4_s3'"):
        gls.parse("xx_b64x128x64_w4_s3")
    with pytest.raises(ConfigError, match=r"unknown gemm_log_softmax lane 'torch'"):
        gls.make("torch", 64, 128, 64, 4, 3)
    with pytest.raises(ConfigError, match="config id must be a string, got 3"):
        conv.parse(3)


def test_lanes_of_one_family_need_distinct_prefixes():
    with pytest.raises(ValueError, match="distinct, non-empty id prefixes"):
        TileIds("x", (("a", ""), ("b", "")), ("torch",), "", (16,), (16,), (16,), (4,), (3,))
    with pytest.raises(ValueError, match="distinct, non-empty id prefixes"):
        TileIds("x", (("a", "p"), ("b", "p")), ("torch",), "", (16,), (16,), (16,), (4,), (3,))
