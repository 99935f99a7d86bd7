"""The rows packing of potrf/posv (kernels_rows.py) under the Triton interpreter, through launch():
n = 16, 24 (padded to 32) and 32 plus a small odd n, two to sixteen threads per problem, one and
two warps, ragged batches, fp32 and fp64, against an fp64 reference bounded by what torch gets on
the same inputs; the upper triangle of A never read (NaN-poisoned); info on non-SPD problems with
the others still right; the in-place forms. And the config space's rules for the packing (its
register budget, whole rows per thread, its place in the candidates), and a compile for sm90 in
the device's Triton (3.6) of the configs the GPU test runs."""
import json
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import device_triton  # noqa: E402
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg import kernels_prior as prior  # noqa: E402

# (config, n, dtype, batch): G = 32*num_warps/P threads per problem
CASES = [("rows_p4_w1", 16, "fp32", 9), ("rows_p2_w1", 24, "fp32", 5), ("rows_p2_w1", 32, "fp32", 5),
         ("rows_p4_w2", 16, "fp64", 11), ("rows_p1_w1", 24, "fp64", 3), ("rows_p1_w1", 32, "fp64", 3),
         ("rows_p8_w1", 7, "fp32", 10)]


def _child() -> None:
    from linalg_solver_checks import solver_failures

    failures = solver_failures(CASES, second_bad=True, inplace_cfg="rows_p4_w1", inplace_batch=6, inplace_n=9)
    interpret_child.report(failures)


@pytest.mark.slow
def test_rows_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


def test_rows_packing_holds_whole_rows_within_its_register_budget():
    assert space.invalid_reason("posv", "rows", 2, 1, 32, "fp32") is None  # 16 threads x 2 rows of 32
    assert "spill" in space.invalid_reason("posv", "rows", 4, 1, 32, "fp32")  # 4 rows of 32: 128
    assert space.invalid_reason("posv", "rows", 1, 1, 32, "fp64") is None  # 32 threads x 1 row
    assert "spill" in space.invalid_reason("posv", "rows", 2, 1, 32, "fp64")  # 2 rows: posv spills
    assert space.invalid_reason("potrf", "rows", 2, 1, 32, "fp64") is None  # potrf does not
    assert "spill" in space.invalid_reason("potrf", "rows", 4, 1, 32, "fp64")
    assert space.invalid_reason("potrf", "rows", 8, 1, 16, "fp32") is None  # 4 threads x 4 rows of 16
    assert "whole rows" in space.invalid_reason("potrf", "rows", 1, 1, 16, "fp32")  # 32 threads, 16 rows
    assert "reg packing" in space.invalid_reason("potrf", "rows", 32, 1, 4, "fp32")  # one thread each
    assert "n <= 32" in space.invalid_reason("potrf", "rows", 1, 2, 64, "fp32")
    assert "potrf, posv only" in space.invalid_reason("gemm", "rows", 2, 1, 16, "fp32")
    assert "num_warps" in space.invalid_reason("posv", "rows", 2, 8, 32, "fp32")
    assert space.parse_config("rows_p2_w1") == space.KernelConfig("rows", 2, 1)
    assert {c.id for c in space.config_space("posv", 32, "fp32") if c.packing == "rows"} == {
        "rows_p2_w1", "rows_p4_w2", "rows_p8_w4", "rows_p1_w1", "rows_p2_w2", "rows_p4_w4"}


def test_rows_configs_take_two_turns_after_the_old_eleven():
    # where reg runs (fp32 n=16) a cap of 11 is the old eleven and 13 adds two rows configs
    thirteen = prior.candidates("potrf", 16, "fp32", cap=13, batch=4096)
    eleven = prior.candidates("potrf", 16, "fp32", cap=11, batch=4096)
    assert [c for c in thirteen if c.packing != "rows"] == eleven
    assert sum(c.packing == "rows" for c in thirteen) == 2
    # where reg cannot run (n=32) the rows turns come within the goal bench's cap of 11
    assert sum(c.packing == "rows" for c in prior.candidates("posv", 32, "fp64", cap=11, batch=4096)) >= 1
    assert sum(c.packing == "rows" for c in prior.candidates("posv", 32, "fp32", cap=11, batch=4096)) == 2
    assert not any(c.packing == "rows" for c in prior.candidates("gemm", 16, "fp32", cap=20))


def test_the_family_parses_rows_ids_and_ranks_them_last():
    from tunedb.families.linalg import configs

    assert configs.shape_of(configs.parse("rows_p2_w1")) == ("rows", 2, 1)
    assert configs.simplicity("rows_p2_w1") > configs.simplicity("reg_p256_w4")
    with pytest.raises(Exception, match="rows configs name their problems per program"):
        configs.parse("rows_w2")


_COMPILE = """
import json
from tunedb.families.linalg import compile_target, kernels_prior as prior
for op in ("potrf", "posv"):
    for dt in ("fp32", "fp64"):
        for n in (16, 32):
            for cid in [c.id for c in prior.candidates(op, n, dt, batch=4096) if c.packing == "rows"][:2]:
                print(json.dumps(compile_target.compile_one((op, dt, n, cid))), flush=True)
"""


@pytest.mark.slow
def test_the_gpu_tests_rows_kernels_compile_for_sm90_with_the_device_triton():
    """The first two rows configs of each op x dtype x n in {16, 32} (what the GPU test and the
    goal bench run first), compiled by Triton 3.6 for sm90 (2-4 minutes on 2 cores)."""
    proc = device_triton.run_child(["-c", _COMPILE], 1500)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 16 and all(r["config"].startswith("rows_") for r in results), proc.stderr[-3000:]
    failed = [f"{r['op']} {r['dtype']} n={r['n']} {r['config']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)


if __name__ == "__main__":
    _child()
