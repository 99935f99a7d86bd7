"""A GEMM tile config built by hand for the cost-model tests (no parsing: the lane and every
field given), shared by tests/unit/test_costmodel*.py."""
from tunedb.records import Config


def tile_config(bm: int, bn: int, bk: int, w: int = 4, s: int = 3, split: int = 1,
                lane: str = "triton_mma") -> Config:
    """A Triton tile; split > 1 makes it a split-K config."""
    lane = "triton_splitk" if split > 1 else lane
    return Config(f"b{bm}x{bn}x{bk}_w{w}_s{s}_k{split}", lane,
                  (("block", (bm, bn, bk)), ("warps", w), ("stages", s), ("group_m", 8), ("split_k", split)))
