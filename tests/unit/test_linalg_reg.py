"""The reg packing of potrf/posv (kernels_reg.py) under the Triton interpreter, through launch():
n from 2 to the packing's limit (odd n and padding included), one and several problems per
thread, several warps, batches that leave the last program partly empty, fp32 and fp64, against
an fp64 reference bounded by what torch gets on the same inputs; the upper triangle of A never
read; info on non-SPD problems with the others still right; the in-place forms. And the config
space's rules for the packing (its register budget, its place in the candidates)."""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402

# (config, n, dtype, batch): one problem per thread, two and eight per thread, two warps, ragged batches
CASES = [("reg_p32_w1", 2, "fp32", 37), ("reg_p256_w1", 3, "fp64", 40), ("reg_p64_w1", 4, "fp32", 70),
         ("reg_p64_w2", 5, "fp32", 33), ("reg_p64_w1", 8, "fp64", 65), ("reg_p32_w1", 8, "fp32", 31),
         ("reg_p32_w1", 12, "fp64", 33), ("reg_p32_w1", 13, "fp32", 35), ("reg_p64_w2", 16, "fp32", 67)]


def _child() -> None:
    from linalg_solver_checks import solver_failures

    failures = solver_failures(CASES, second_bad=True, inplace_cfg="reg_p32_w1", inplace_batch=33, inplace_n=6)
    interpret_child.report(failures)


@pytest.mark.slow
def test_reg_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


def test_reg_packing_holds_one_problem_per_thread_within_its_register_budget():
    assert space.invalid_reason("posv", "reg", 32, 1, 16, "fp32") is None  # 136 elements
    assert "spill" in space.invalid_reason("posv", "reg", 32, 1, 17, "fp32")  # 153
    assert "spill" in space.invalid_reason("posv", "reg", 64, 1, 16, "fp32")  # two problems per thread
    assert space.invalid_reason("potrf", "reg", 32, 1, 12, "fp64") is None  # 78 elements
    assert "spill" in space.invalid_reason("potrf", "reg", 32, 1, 13, "fp64")
    assert space.invalid_reason("posv", "reg", 64, 1, 8, "fp32") is None  # 2 x 36
    assert "P >= 32*num_warps" in space.invalid_reason("potrf", "reg", 32, 2, 4, "fp32")
    assert "potrf, posv only" in space.invalid_reason("gemm", "reg", 32, 1, 4, "fp32")
    assert "num_warps" in space.invalid_reason("posv", "reg", 256, 8, 4, "fp32")
    assert space.parse_config("reg_p64_w2") == space.KernelConfig("reg", 64, 2)
    assert not any(c.packing == "reg" for c in space.config_space("posv", 32, "fp32"))
    assert not any(c.packing == "reg" for c in space.config_space("posv", 16, "fp64"))
    assert {c.id for c in space.config_space("posv", 16, "fp32") if c.packing == "reg"} == {
        "reg_p32_w1", "reg_p64_w2", "reg_p128_w4"}


def test_the_family_parses_reg_ids_and_ranks_them_after_lane():
    from tunedb.families.linalg import configs

    cfg = configs.parse("reg_p64_w2")
    assert configs.shape_of(cfg) == ("reg", 64, 2)
    assert configs.simplicity("reg_p32_w1") > configs.simplicity("lane_p1_w4")
    with pytest.raises(Exception, match="reg configs name their problems per program"):
        configs.parse("reg_w2")


if __name__ == "__main__":
    _child()
