"""bench/glsm_rows.py on the CPU: one point run under the interpreter with a stand-in timer
(every arm called, checked and summarised: the old and new picks, the bound, the row passes
over the copy), and its census points. The GPU run is the lead's; this catches a bench that
would crash or mislabel arms before it spends device time."""
from __future__ import annotations

import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402
from bench_modules import bench_module, bench_snippet  # noqa: E402


def test_census_points_are_the_ctc_heads():
    g = bench_module("glsm_rows")
    full, quick = g.census_points(False), g.census_points(True)
    assert len(full) == 15 and {(n, k) for n, k, _ in full} == {(5000, 256), (16000, 512), (32000, 512)}
    assert {m for *_, m in quick} == set(g.QUICK_MS) and full[0][2] == 64
    for n in (5000, 16000, 32000):  # every named config parses and is valid at its N
        assert all(g.twin(c) is None or g.twin(c).endswith("_pdl") for c in g.LR[n])
        sig = g.FAM.make_signature(n, 512, "bf16", 1)
        for cid in g.LR[n] + g.STREAM[n]:
            assert g.FAM.invalid_reason(g.FAM.parse_config(cid), sig, 8192, g.shipped_profile("sm90")) is None, cid


_SMOKE = r"""
row = g.run_point(1100, 32, 9, 1 << 20, shipped_profile("sm90"), True, device="cpu", timer=timer, dt="fp16",
                  lr=("lr_r1_c1024_w4", "lr_r1_c2048_w8"), rf=("rf_b16x32x32_w4_s2_pdl",), stream=("lr_r1_c2048_w8_p2",))
bad = {k: v for k, v in row["failed"].items() if not v.startswith("invalid")}
assert not bad, bad
t = row["times_us"]
want = {"torch", "lr_r1_c1024_w4@old", "lr_r1_c1024_w4", "lr_r1_c2048_w8@old", "lr_r1_c2048_w8",
        "lr_r1_c2048_w8_pdl", "rf_b16x32x32_w4_s2_pdl@old", "rf_b16x32x32_w4_s2_pdl", "linear", "lsm", "copy",
        "pass:lr_r1_c1024_w4@old", "pass:lr_r1_c1024_w4", "pass:lr_r1_c2048_w8@old", "pass:lr_r1_c2048_w8",
        "lr_r1_c2048_w8_p2", "pass:lr_r1_c2048_w8_p2"}
assert set(t) == want, sorted(set(t) ^ want)
assert row["old_pick"] in ("torch", "lr_r1_c1024_w4", "lr_r1_c2048_w8", "rf_b16x32x32_w4_s2_pdl")
assert "@" not in row["new_pick"] and row["bound_x"] == t["torch"] / (t["linear"] + t["copy"])
print(g.markdown([row]))
print("ok")
"""


@pytest.mark.slow
def test_one_point_under_the_interpreter():
    res = interpret_child.snippet(bench_snippet("glsm_rows", _SMOKE))
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
