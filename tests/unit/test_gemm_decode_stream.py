"""The triton_decode lane's stream kernel (`ds` configs, kernels_decode_stream.py): ids and the
validity predicate (pure Python), the launch arithmetic (splits, grid, workspace), and the kernel
under the Triton interpreter at M = 1..16 on odd N and K against an fp32 reference (tensor-core
and FMA paths, 1..4 K tiles per CTA, splits past one group of eight partials, both reductions,
bias and activations), plus the deterministic reduction's bitwise repeatability.

TRITON_INTERPRET must be set before any kernel is defined, so the kernel checks run in a child
process (this file run as a script). fp16: the interpreter's tl.dot mishandles bf16 on CPU.
"""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.errors import ConfigError
from tunedb.families.gemm import FAMILY, configs_decode

from decode_interp_checks import arches, sig  # noqa: E402

SM90, SM80 = arches()


def test_stream_ids_round_trip_and_name_their_parameters():
    cfg = FAMILY.parse_config("ds_t2_n64x256_w8_at_pdl")
    assert cfg.lane == "triton_decode" and configs_decode.is_stream(cfg)
    assert cfg.to_json() == {"lane": "triton_decode", "block": [16, 64, 256], "warps": 8, "stages": 2, "group_m": 1,
                             "split_k": 1, "atomic": True, "pdl": True, "kernel": "stream", "tiles": 2, "fma": False}
    assert configs_decode.make_stream(64, 256, 8, 2, atomic=True, pdl=True) == cfg
    fma = FAMILY.parse_config("ds_t1_n4x1024_w4_fma")
    assert fma.param("fma") is True and fma.param("atomic") is False  # deterministic by default
    assert not configs_decode.is_stream(FAMILY.parse_config("dk4_n32x256_w4_s4"))
    for bad, why in (("ds_t1_n8x256_w4", "BN=8 not allowed with tl.dot"),  # the FMA path takes it
                     ("ds_t1_n64x512_w4", "512 bytes per thread"), ("ds_t1_n1x256_w4_fma", "4 bytes per thread"),
                     ("ds_t3_n32x256_w4", "T=3"), ("ds_t1_n32x384_w4", "BK=384"), ("ds_t01_n32x256_w4", "not canonical"),
                     ("ds_t1_n32x256_w4_at_fma", "bad triton_decode config id"), ("ds1_n32x256_w4", "bad triton_decode config id")):
        with pytest.raises(ConfigError, match=why):
            FAMILY.parse_config(bad)
    assert configs_decode.matches("ds_t1_n32x256_w4") and not configs_decode.matches("ds_n32x256_w4")


def test_stream_predicate_serves_m_up_to_16_and_any_odd_shape():
    cfg = FAMILY.parse_config("ds_t1_n32x256_w4")
    for m in range(1, 17):
        assert FAMILY.invalid_reason(cfg, sig(), m, SM90) is None
    assert "M <= 16, not M=17" in FAMILY.invalid_reason(cfg, sig(), 17, SM90)
    assert "not every M" in FAMILY.invalid_reason(cfg, sig(), None, SM90)
    assert FAMILY.invalid_reason(cfg, sig(37, 301, dt="fp16"), 3, SM90) is None  # odd N and K
    # T K tiles per CTA: at least twice the weight's tiles is the same split as T / 2
    t4 = FAMILY.parse_config("ds_t4_n64x256_w8")
    assert "T=4 K tiles per CTA is at least twice the 2 K tiles of K=512" in FAMILY.invalid_reason(t4, sig(4096, 512), 1, SM90)
    assert FAMILY.invalid_reason(t4, sig(4096, 768), 1, SM90) is None  # 3 tiles: one CTA per block


def test_stream_pdl_needs_sm90_and_configs_fit_shared_memory():
    assert "sm90 or newer" in FAMILY.invalid_reason(FAMILY.parse_config("ds_t1_n32x256_w4_pdl"), sig(), 1, SM80)
    assert FAMILY.invalid_reason(FAMILY.parse_config("ds_t1_n32x256_w4"), sig(), 1, SM80) is None
    for cfg in configs_decode.stream_grid():
        assert FAMILY.invalid_reason(cfg, sig(), 1, SM90) is None, cfg.id
        assert FAMILY.invalid_reason(configs_decode.pdl_twin(cfg), sig(), 1, SM90) is None, cfg.id
        assert configs_decode.pdl_twin(cfg).id == cfg.id + "_pdl"


def test_stream_configs_stay_out_of_the_build_space_until_measured():
    space = {c.id for c in FAMILY.config_space("sm90")}
    grid = [c.id for c in configs_decode.stream_grid()]
    assert len(grid) == len(set(grid)) == 15 and not space & set(grid)
    assert not any(configs_decode.is_stream(c) for c in FAMILY.candidates(sig(), 1, SM90, ["triton_decode"]))
    # the grid measures both reductions, both multiplies and 1, 2, 4, 8 K tiles per CTA
    cfgs = [configs_decode.parse(c) for c in grid]
    assert {c.param("atomic") for c in cfgs} == {False, True} and {c.param("fma") for c in cfgs} == {False, True}
    assert {c.param("tiles") for c in cfgs} == {1, 2, 4, 8}


def test_stream_launch_arithmetic():
    ks = pytest.importorskip("tunedb.families.gemm.kernels_decode_stream")
    from tunedb.families.gemm import kernels_decode

    sp = kernels_decode.spec(configs_decode.parse("ds_t2_n64x256_w8"))
    assert sp.name == "decode_stream" and dict(sp.constexprs)["TILES"] == 2 and sp.num_stages == 1
    assert ks.splits(sp, 4096) == 8 and ks.splits(sp, 14336) == 28 and ks.splits(sp, 300) == 1
    assert kernels_decode.grid_of(sp, 4100, 4096)(1, 132) == (65 * 8,)  # 65 blocks of 64 rows, 8 splits each
    assert kernels_decode.workspace_sizes(sp, 4100, 4096) == (65 * 8 * 16 * 64, 65)  # a plane per split
    at = kernels_decode.spec(configs_decode.parse("ds_t2_n64x256_w8_at"))
    assert kernels_decode.workspace_sizes(at, 4100, 4096) == (65 * 16 * 64, 65)  # one plane per block
    assert kernels_decode.workspace_sizes(at, 4100, 512) == (1, 1)  # one split: no reduction
    assert "launch_pdl" in kernels_decode.spec(configs_decode.parse("ds_t1_n32x256_w4_pdl")).kwargs()
    assert kernels_decode.spec(configs_decode.parse("ds_t1_n32x256_w4_pdl")).kwargs(interpret=True)["PDL"] is False


# (config id, op, N, K, act, bias, Ms): odd N and K not a multiple of BK
CASES = [
    ("ds_t1_n16x256_w4", "gemm", 80, 136, "none", False, tuple(range(1, 17))),  # one ragged tile: no split
    ("ds_t1_n16x256_w2", "gemm", 37, 256 * 9 + 7, "none", False, (1, 2, 7, 16)),  # 10 splits: two groups of 8
    ("ds_t2_n32x256_w4", "gemm_act", 80, 1100, "silu", True, (1, 5, 16)),
    ("ds_t4_n16x256_w4", "gemm_act", 48, 2000, "gelu", True, (1, 9, 16)),  # the last split's 4th tile past K
    ("ds_t1_n16x256_w2_at", "gemm_act", 80, 1000, "relu", False, (3, 16)),
    ("ds_t1_n4x1024_w4_fma", "gemm", 37, 3001, "none", False, tuple(range(1, 17))),
    ("ds_t2_n8x256_w2_fma_at", "gemm_act", 48, 1500, "gelu_tanh", True, (1, 4, 16)),
    ("ds_t2_n2x512_w2_fma", "gemm_act", 5, 1030, "silu", True, (1, 2)),
    ("ds_t1_n16x256_w4_pdl", "gemm_act", 80, 600, "none", True, (1, 16)),  # PDL off under the interpreter
]


def _child() -> None:
    from decode_interp_checks import decode_failures

    interpret_child.report(decode_failures(CASES, det_k=256 * 11 + 3, det_cids=("ds_t1_n16x256_w2", "ds_t2_n32x256_w4", "ds_t1_n4x1024_w4_fma")))


@pytest.mark.slow
def test_stream_kernel_matches_fp32_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=600, TRITON_DEFAULT_FP_FUSION="1") == []


if __name__ == "__main__":
    _child()
