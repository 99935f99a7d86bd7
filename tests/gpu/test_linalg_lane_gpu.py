"""The lane packing of potrf/posv (kernels_lane.py) on the GPU: the prior's first three lane
configs of each op x fp32/fp64 x n in {4, 8, 13, 16, 24, 32} over batches {1, 257, 4096}
against the fp64 reference (bounded by what torch gets on the same inputs), the upper triangle
never read, every output element written, info on non-SPD problems, and a CUDA-graph capture that
replays the eager result. Compiled first in a process pool (kernels_prebuild).
Expected run time on an H200: about 40-60 s (most of it compiling ~70 unrolled kernels)."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_graph_replay, check_non_spd, check_reference  # noqa: E402
from linalg_packing_checks import compile_or_skip, packing_configs  # noqa: E402

pytestmark = pytest.mark.gpu

NS = (4, 8, 13, 16, 24, 32)
DTYPES = ("fp32", "fp64")
BATCHES = (1, 257, 4096)


def _lane_configs(op, n, dt):
    return packing_configs("lane", op, n, dt, 3)


ITEMS = [(op, cid, n, dt) for op in ("potrf", "posv") for n in NS for dt in DTYPES for cid in _lane_configs(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    compile_or_skip(ITEMS)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_lane_configs_meet_the_fp64_reference(op, dt):
    ran = 0
    for n in NS:
        for cid in _lane_configs(op, n, dt):
            for batch in BATCHES:
                check_reference(op, cid, n, dt, batch)
                ran += 1
    assert ran == sum(len(_lane_configs(op, n, dt)) for n in NS) * len(BATCHES)


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_lane_non_spd_problems_are_reported_and_the_others_solved(op):
    for n in (8, 32):
        cid = _lane_configs(op, n, "fp32")[0]
        check_non_spd(op, cid, n, "fp32")


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_lane_kernels_replay_in_a_cuda_graph(op):
    for n, dt in ((16, "fp32"), (32, "fp64")):
        cid = _lane_configs(op, n, dt)[0]
        check_graph_replay(op, cid, n, dt)
