"""The triton_decode lane: its ids and validity predicate (pure Python), and the kernel under the
Triton interpreter (CPU) at M = 1..16 on odd N and K against an fp32 reference, both split-K
reductions, bias and activations, and the deterministic reduction's bitwise repeatability.

TRITON_INTERPRET must be set before any kernel is defined, so the kernel checks run in a child
process (this file run as a script). fp16: the interpreter's tl.dot mishandles bf16 on CPU.
"""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.errors import ConfigError
from tunedb.families.gemm import FAMILY, configs, configs_decode
from tunedb.records import ArchProfile


def _arch(family: str) -> ArchProfile:
    return ArchProfile(family, "test", 132, 233472, 232448, 60 << 20, 0, 0.0, 0.0, 0.0, 0.0, 0.0, "test")


SM80 = _arch("sm80")
SM90 = __import__("tunedb.arch", fromlist=["x"]).shipped_profile("sm90")


def sig(n=4096, k=4096, op="gemm", act="none", bias=False, dt="bf16"):
    return FAMILY.make_signature(op, dt, n, k, act, bias)


def test_ids_round_trip_and_name_their_parameters():
    cfg = FAMILY.parse_config("dk8_n32x256_w4_s4_at_pdl")
    assert cfg.lane == "triton_decode"
    assert cfg.to_json() == {"lane": "triton_decode", "block": [16, 32, 256], "warps": 4, "stages": 4,
                             "group_m": 1, "split_k": 8, "atomic": True, "pdl": True}
    assert configs.make("triton_decode", 16, 32, 256, 4, 4, 1, 8, atomic=True, pdl=True) == cfg
    assert FAMILY.parse_config("dk1_n64x256_w4_s4").param("atomic") is False  # deterministic by default
    for bad, why in (("dk1_n32x256_w4_s4_at", "needs split_k >= 2"), ("dk4_n48x256_w4_s4", "BN=48"),
                     ("dk04_n32x256_w4_s4", "not canonical"), ("dk4_n32x256_w4_s4_pdl_at", "bad triton_decode config id"),
                     ("dk4_n32x256_w3_s4", "warps=3")):
        with pytest.raises(ConfigError, match=why):
            FAMILY.parse_config(bad)
    with pytest.raises(ConfigError, match="BM=16"):
        configs.make("triton_decode", 32, 32, 256, 4, 4, 1, 4)
    with pytest.raises(ConfigError, match="triton_decode parameters"):
        configs.make("triton_mma", 64, 64, 64, 4, 3, 8, pdl=True)


def test_predicate_serves_m_up_to_16_only():
    cfg = FAMILY.parse_config("dk4_n32x256_w4_s4")
    s = sig()
    for m in range(1, 17):
        assert FAMILY.invalid_reason(cfg, s, m, SM90) is None
    assert "M <= 16, not M=17" in FAMILY.invalid_reason(cfg, s, 17, SM90)
    assert "not every M" in FAMILY.invalid_reason(cfg, s, None, SM90)
    assert cfg in FAMILY.candidates(s, 16, SM90) and cfg not in FAMILY.candidates(s, 17, SM90)
    assert not any(c.lane == "triton_decode" for c in FAMILY.candidates(s, None, SM90))


def test_predicate_split_needs_a_k_tile_per_split_and_odd_shapes_are_valid():
    cfg = FAMILY.parse_config("dk16_n32x256_w4_s4")
    assert "split_k=16 exceeds the 1 K tiles of K=136" in FAMILY.invalid_reason(cfg, sig(80, 136), 1, SM90)
    assert FAMILY.invalid_reason(cfg, sig(80, 256 * 15 + 8), 3, SM90) is None  # 16 tiles, the last ragged
    assert FAMILY.invalid_reason(FAMILY.parse_config("dk1_n32x256_w4_s4"), sig(80, 136, dt="fp16"), 1, SM90) is None
    assert "M=0" in FAMILY.invalid_reason(cfg, sig(80, 256 * 15 + 8), 0, SM90)


def test_pdl_needs_sm90_and_a_triton_with_gdc(monkeypatch):
    pdl = FAMILY.parse_config("dk4_n32x256_w4_s4_pdl")
    assert "sm90 or newer" in FAMILY.invalid_reason(pdl, sig(), 1, SM80)
    assert FAMILY.invalid_reason(FAMILY.parse_config("dk4_n32x256_w4_s4"), sig(), 1, SM80) is None
    monkeypatch.setattr(configs_decode, "pdl_supported", lambda: False)
    assert "gdc_wait / launch_pdl" in FAMILY.invalid_reason(pdl, sig(), 1, SM90)


def test_space_holds_deterministic_configs_without_pdl():
    space = [c for c in FAMILY.config_space("sm90") if c.lane == "triton_decode"]
    assert {c.param("split_k") for c in space} == {1, 2, 4, 8, 16}
    # dk twins: parseable, valid, not in the space (the gv lane's PDL twins are: test_gemm_gv_family)
    assert not any(c.param("atomic") or c.param("pdl") for c in space if c.param("kernel") != "gemv")
    assert any(c.lane == "triton_decode" for c in FAMILY.compile_set("sm90", []))


def test_cost_model_ranks_decode_configs():
    s = sig(4096, 4096)
    model = FAMILY.cost_model(SM90, None)
    ranked = model.rank(s, 1, FAMILY.candidates(s, 1, SM90, ["triton_decode"]), 4)
    assert ranked  # the lane's params (block, warps, stages, split_k) are the model's own


# (config id, op, N, K, act, bias, Ms): odd N (80, 48) and K not a multiple of BK (136, 200, 72)
CASES = [
    ("dk1_n32x64_w4_s3", "gemm", 80, 136, "none", False, tuple(range(1, 17))),
    ("dk2_n16x64_w4_s3", "gemm", 80, 136, "none", False, (1, 2, 7, 16)),
    ("dk3_n32x64_w4_s3", "gemm_act", 80, 136, "silu", True, (1, 5, 16)),
    ("dk2_n16x64_w4_s2_at", "gemm_act", 48, 200, "gelu", True, (1, 9, 16)),
    ("dk4_n16x64_w4_s3_at", "gemm_act", 80, 200, "relu", False, (3,)),
    ("dk2_n32x64_w2_s2", "gemm_act", 48, 72, "gelu_tanh", True, (4,)),
    ("dk2_n32x64_w4_s3_pdl", "gemm_act", 80, 136, "none", True, (1, 16)),  # PDL off under the interpreter
]


def _child() -> None:
    from decode_interp_checks import decode_failures

    interpret_child.report(decode_failures(CASES, det_k=200, det_cids=("dk4_n16x64_w4_s3", "dk3_n32x64_w4_s3")))


def test_decode_kernel_matches_fp32_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=600, TRITON_DEFAULT_FP_FUSION="1") == []


if __name__ == "__main__":
    _child()
