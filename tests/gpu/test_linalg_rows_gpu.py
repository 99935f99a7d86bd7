"""The rows packing of potrf/posv (kernels_rows.py) on the GPU: the prior's first two rows configs
of each op x fp32/fp64 x n in {16, 24, 32} over batches {1, 257, 4096} against the fp64
reference (bounded by what torch gets on the same inputs), the upper triangle never read, every
output element written, info on non-SPD problems (in the first and the last program, a NaN
pivot too), and a CUDA-graph capture that replays the eager result. Compiled first in a process
pool (kernels_prebuild). Expected run time on an H200: about 30-60 s (most of it compiling ~24
unrolled kernels; a posv kernel at n=32 takes up to a minute of ptxas alone, in parallel)."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_graph_replay, check_non_spd, check_reference  # noqa: E402
from linalg_packing_checks import compile_or_skip, packing_configs  # noqa: E402

pytestmark = pytest.mark.gpu

NS = (16, 24, 32)
DTYPES = ("fp32", "fp64")
BATCHES = (1, 257, 4096)


def _rows_configs(op, n, dt):
    return packing_configs("rows", op, n, dt, 2)


ITEMS = [(op, cid, n, dt) for op in ("potrf", "posv") for n in NS for dt in DTYPES for cid in _rows_configs(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    compile_or_skip(ITEMS)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_rows_configs_meet_the_fp64_reference(op, dt):
    ran = 0
    for n in NS:
        for cid in _rows_configs(op, n, dt):
            for batch in BATCHES:
                check_reference(op, cid, n, dt, batch)
                ran += 1
    assert ran == sum(len(_rows_configs(op, n, dt)) for n in NS) * len(BATCHES) > 0


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_rows_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((16, "fp32"), (32, "fp32"), (32, "fp64")):
        check_non_spd(op, _rows_configs(op, n, dt)[0], n, dt)


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_rows_kernels_replay_in_a_cuda_graph(op):
    for n, dt in ((32, "fp32"), (24, "fp64")):
        check_graph_replay(op, _rows_configs(op, n, dt)[0], n, dt)
