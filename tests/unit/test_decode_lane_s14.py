"""bench/decode_lane_s14.py: its summary arithmetic (decode_lane_summary: the best arm of each kind,
the goals through the gate, what the atomic reduction and PDL buy) on made-up timings, and the
bench's whole path on CPU under the Triton interpreter with a stand-in timer (a child process:
TRITON_INTERPRET must be set before the kernels are defined)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import decode_lane_summary as summ  # noqa: E402

MB_4K = 4096 * 4096 * 2


def _row(n, k, m, cublas, arms):
    return {"N": n, "K": k, "M": m, "MB": round(n * k * 2 / 1e6, 1), "read_us": 7.8, "cublas_us": cublas,
            "all_us": dict(arms), "failed": []}


ROWS = [
    _row(4096, 4096, 1, 12.4, {"dk8_n128x128_w8_s4_at_pdl": 10.5, "dk1_n64x128_w4_s4": 11.0, "ds_t1_n32x256_w4": 9.0,
                                "ds_t1_n32x256_w4_at": 8.0, "ds_t1_n32x256_w4_at_pdl": 7.0}),
    _row(4096, 4096, 16, 12.4, {"dk1_n64x128_w4_s4": 13.0, "ds_t1_n32x256_w4": 12.0, "ds_t1_n32x256_w4_at": 15.0}),
    _row(1024, 4096, 1, 7.0, {"ds_t1_n32x256_w4": 5.0}),  # 8.4 MB: outside the bandwidth goal
]
NEW = ["ds_t1_n32x256_w4", "ds_t1_n32x256_w4_at"]


def test_picks_separate_old_new_deterministic_and_pdl():
    p = summ.picks(ROWS[0])
    assert p == {"old": "dk8_n128x128_w8_s4_at_pdl", "old_nopdl": "dk1_n64x128_w4_s4", "new": "ds_t1_n32x256_w4_at",
                 "new_det": "ds_t1_n32x256_w4", "new_pdl": "ds_t1_n32x256_w4_at_pdl", "lane": "ds_t1_n32x256_w4_at"}
    assert summ.picks(ROWS[2])["old"] is None


def test_summary_goals_are_judged_without_pdl_and_through_the_gate():
    s = summ.summarize(ROWS, NEW)
    # new, no PDL: 12.4/8, 12.4/12, 7/5; the gate lifts nothing here (all >= 1)
    assert s["geomean_new"] == pytest.approx((12.4 / 8 * 12.4 / 12 * 7 / 5) ** (1 / 3))
    assert s["geomean_old_nopdl"] == pytest.approx((12.4 / 11 * 12.4 / 13) ** 0.5)
    assert s["geomean_old_nopdl_gated"] == pytest.approx((12.4 / 11) ** 0.5)  # 12.4/13 < 1: cuBLAS serves
    assert s["min_bw_m1_new"] == pytest.approx(MB_4K / 8e-6 / 4.3e12)  # only the 33.6 MB weight counts
    assert s["atomic_over_det"] == pytest.approx((9 / 8 * 12 / 15) ** 0.5)
    assert s["pdl_self_overlap_gain"] == pytest.approx(8 / 7)
    assert s["per_variant"]["ds_t1_n32x256_w4_at"]["points"] == 2
    lines = summ.verdicts(s)
    assert any("bandwidth goal" in ln and "new lane" in ln and "MET" in ln and "NOT" not in ln for ln in lines)
    assert any("geomean goal" in ln and "new lane" in ln and "-> MET" in ln for ln in lines)
    slow = summ.summarize([_row(4096, 4096, 1, 12.4, {"ds_t1_n32x256_w4": 12.0})], NEW)
    assert any("bandwidth goal" in ln and "NOT MET" in ln for ln in summ.verdicts(slow))


_SMOKE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import decode_limit as dl, decode_lane_s14 as b, decode_lane_summary as summ
dl.DEVICE, dl.DT, dl.L2 = "cpu", "fp16", 4096  # fp16: the interpreter's tl.dot mishandles bf16
dl.replay_ms = lambda body, n, reps=7: (body(0), 0.01 * n)[1]  # one call stands in for the graph
b.old_configs = lambda quick: ["dk1_n32x256_w4_s4"]
b.new_configs = lambda quick: ["ds_t1_n32x256_w4", "ds_t2_n16x256_w4_at", "ds_t1_n4x1024_w4_fma"]
reads, rows = b.measure([(40, 600), (72, 200), (72, 40), (40, 72)], [1, 16], True, False, 600.0, 3)
# o's output (N=72) is gate_up's input (K=72), as in the model
b.LAYER = [("qkv", 40, 600, "x"), ("o", 72, 200, "x"), ("gate_up", 40, 72, "o"), ("down", 72, 40, "h")]
chains = [b.layer_chain(rows, 1, layers=2), b.layer_chain(rows, 16, layers=2)]
lines = summ.report(rows, b.new_configs(True))
summ.report_chains(chains)
print(json.dumps({"reads": reads, "rows": rows, "lines": lines, "chains": chains}, default=str))
"""


@pytest.mark.slow
def test_the_bench_path_runs_on_cpu_under_the_interpreter():
    """Every arm checked against the reference before it is timed, the invalid refused by the
    predicate, the PDL twin of the best new arm added, the tables and verdicts printed."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", _SMOKE, str(ROOT / "bench")], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(r["N"], r["K"]) for r in got["rows"]] == [(40, 600)] * 2 + [(72, 200)] * 2 + [(72, 40)] * 2 + [(40, 72)] * 2
    for r in got["rows"]:
        assert not r["failed"] and not r["truncated"], r
        best = summ.picks(r)["new"]
        assert best in r["all_us"] and best + "_pdl" in r["all_us"]
        # K <= 256: one 256-wide tile, so T=2 is refused by the predicate, not run
        assert ("ds_t2_n16x256_w4_at" in r["invalid"]) == (r["K"] <= 256)
        assert "dk1_n32x256_w4_s4" in r["all_us"] and r["cublas_again_us"] > 0
    assert any("geomean goal" in ln for ln in got["lines"])
    assert [c["M"] for c in got["chains"]] == [1, 16]
    for c in got["chains"]:
        assert {"cublas_us", "old_us", "new_us", "new_pdl_us", "new_pdl_x_cublas"} <= set(c), c
        assert set(c["picks"]) == {"40x600", "72x200", "40x72", "72x40"}
