"""The lane packing of potrf/posv (kernels_lane.py) under the Triton interpreter, through launch():
every n up to 32 (odd n and padding included), one and several problems per lane, batches that
leave the last program partly empty, fp32 and fp64, against an fp64 reference bounded by what
torch gets on the same inputs; the upper triangle of A never read; info on non-SPD problems with
the others still right; the in-place forms. And the config space's rules for the packing."""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402

# (config, n, dtype, batch): one column per lane, two per lane, several warps, ragged batches
CASES = [("lane_p16_w1", 2, "fp32", 19), ("lane_p8_w1", 3, "fp64", 9), ("lane_p16_w1", 4, "fp32", 21),
         ("lane_p4_w1", 5, "fp32", 7), ("lane_p8_w2", 8, "fp32", 13), ("lane_p4_w1", 8, "fp64", 6),
         ("lane_p2_w1", 13, "fp32", 3), ("lane_p4_w1", 16, "fp32", 5), ("lane_p2_w1", 16, "fp64", 3),
         ("lane_p1_w1", 24, "fp32", 2), ("lane_p2_w2", 32, "fp32", 3), ("lane_p1_w1", 32, "fp64", 2)]


def _child() -> None:
    from linalg_solver_checks import solver_failures

    failures = solver_failures(CASES, second_bad=False, inplace_cfg="lane_p4_w1", inplace_batch=5, inplace_n=8)
    interpret_child.report(failures)


@pytest.mark.slow
def test_lane_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


def test_lane_packing_runs_potrf_and_posv_up_to_n32_without_replicated_lanes():
    assert space.invalid_reason("potrf", "lane", 2, 1, 16, "fp32") is None
    assert space.invalid_reason("posv", "lane", 1, 1, 32, "fp64") is None  # one column per lane
    assert "spill" in space.invalid_reason("posv", "lane", 2, 2, 32, "fp64")  # the same in 2 warps
    assert "potrf, posv only" in space.invalid_reason("gemm", "lane", 2, 1, 16, "fp32")
    assert "n <= 32" in space.invalid_reason("potrf", "lane", 1, 2, 64, "fp32")
    assert "replicated" in space.invalid_reason("potrf", "lane", 1, 1, 16, "fp32")  # 16 of 32 lanes
    assert "replicated" in space.invalid_reason("posv", "lane", 2, 2, 16, "fp32")
    assert "spill" in space.invalid_reason("potrf", "lane", 4, 1, 16, "fp64")  # 2 columns x 16 fp64
    assert space.invalid_reason("potrf", "lane", 4, 1, 16, "fp32") is None
    assert "spill" in space.invalid_reason("posv", "lane", 8, 1, 16, "fp32")  # 4 columns x 16 fp32
    ids = {c.id for c in space.config_space("posv", 32, "fp32")}
    assert {"lane_p1_w1", "lane_p2_w2", "lane_p4_w4"} <= ids and "lane_p2_w1" not in ids
    assert space.parse_config("lane_p2_w1") == space.KernelConfig("lane", 2, 1)
    assert not any(c.packing == "lane" for c in space.config_space("trsv", 8, "fp32"))


if __name__ == "__main__":
    _child()
