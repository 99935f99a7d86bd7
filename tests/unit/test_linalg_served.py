"""bench/linalg_served.py: what a linalg table serves on issue 19's goal cells, read from the
table's own evidence (the breakdown docs/linalg.md quotes, and what the s13 device call prints
for the retuned table)."""
import json
import math
from pathlib import Path
from bench_modules import bench_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _served():
    return bench_module("linalg_served")


def _table(tmp_path, regions, evidence):
    path = tmp_path / "linalg.json"
    path.write_text(json.dumps({"entries": {"linalg|op=potrf|dt=fp32|n=16": {
        "regions": regions, "evidence": evidence}}}))
    return json.loads(path.read_text())


def test_the_served_arm_is_the_region_of_each_batch_and_x_is_torch_over_it(tmp_path):
    served = _served()
    ev = {"M=256": {"torch": [0.013, 0, 9], "warp_p2_w1": [0.0047, 0, 9], "_ns_per_problem": 1.0},
          "M=65536": {"torch": [0.48, 0, 9], "warp_p2_w1": [0.062, 0, 9], "lane_p2_w1": [0.040, 0, 9],
                      "torch_checked": [0.001, 0, 9]}}
    cells = served.rows(_table(tmp_path, [[256, "warp_p2_w1"], [None, "lane_p2_w1"]], ev), ("potrf",), 32)
    assert [(c["batch"], c["served"]) for c in cells] == [(256, "warp_p2_w1"), (65536, "lane_p2_w1")]
    big = cells[1]
    assert math.isclose(big["x_torch"], 480 / 40) and math.isclose(big["need_10x_us"], 48.0)
    assert big["best"] == "lane_p2_w1"  # the eager-only arm is never the best servable one
    # the floor: read A and write L (2 n^2 fp32) at 4.3 TB/s
    assert math.isclose(big["floor_us"], 2 * 16 * 16 * 4 * 65536 / 4.3e6)
    summ = served.summary(cells)
    assert math.isclose(summ["geomean_x_torch"], math.sqrt((13 / 4.7) * 12.0))
    assert math.isclose(summ["geomean_x_torch_without_batch_256"], 12.0)
    assert summ["cells_at_10x"] == 1


def test_the_shipped_table_has_all_48_goal_cells():
    served = _served()
    table = json.loads((ROOT / "src" / "tunedb" / "db" / "sm90" / "linalg.json").read_text())
    cells = served.rows(table, ("potrf", "posv"), 32)
    assert len(cells) == 2 * 4 * 3 * 2
    assert all(c["served"] in c["arms_timed"] and c["x_torch"] > 0 for c in cells)
