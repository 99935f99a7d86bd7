"""bench/decode_pf.py: its summary arithmetic (decode_pf_summary: the best arm of each kind, each
`_pf` variant's geomean, the goals through the gate) on made-up timings, and the bench's whole path
on CPU under the Triton interpreter with a stand-in timer (a child process: TRITON_INTERPRET must
be set before the kernels are defined)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import decode_pf_summary as summ  # noqa: E402

MB_4K = 4096 * 4096 * 2


def _row(n, k, m, cublas, arms, read_us=8.0):
    return {"N": n, "K": k, "M": m, "MB": round(n * k * 2 / 1e6, 1), "cublas_us": cublas, "read_us": read_us,
            "read": "torch.sum", "all_us": dict(arms), "failed": []}


ROWS = [
    _row(4096, 4096, 1, 12.0, {"dk8_n128x128_w8_s4_at_pdl": 10.0, "dk8_n32x256_w4_s2_pf2_pdl": 8.0,
                                "dk8_n32x256_w4_s2_pf2": 11.0, "dk2_n64x256_w4_s2_pf8_pdl": 9.0}),
    _row(4096, 4096, 16, 12.0, {"dk8_n128x128_w8_s4_at_pdl": 12.5, "dk8_n32x256_w4_s2_pf2_pdl": 13.0}),
    _row(1024, 4096, 1, 7.0, {"dk8_n32x256_w4_s2_pf2_pdl": 5.0}, read_us=3.0),  # 8.4 MB: outside the bandwidth goal
]


def test_picks_separate_old_pf_and_pdl():
    assert summ.picks(ROWS[0]) == {"old_pdl": "dk8_n128x128_w8_s4_at_pdl", "pf_pdl": "dk8_n32x256_w4_s2_pf2_pdl",
                                   "pf_nopdl": "dk8_n32x256_w4_s2_pf2"}
    assert summ.is_pf("dk4_n64x256_w4_s2_at_pf4_pdl") and summ.is_pf("dk2_n64x256_w4_s2_pfn8")
    assert not summ.is_pf("dk4_n64x256_w4_s2_at_pdl")
    assert summ.picks(ROWS[2])["old_pdl"] is None


def test_summary_goals_per_variant_and_through_the_gate():
    s = summ.summarize(ROWS, ["dk8_n32x256_w4_s2_pf2_pdl", "dk2_n64x256_w4_s2_pf8_pdl"])
    v = s["per_variant"]["dk8_n32x256_w4_s2_pf2_pdl"]
    assert v["points"] == 3 and v["geomean_x_cublas"] == pytest.approx((12 / 8 * 12 / 13 * 7 / 5) ** (1 / 3))
    assert v["min_bw_m1_16MB"] == pytest.approx(MB_4K / 8e-6 / 4.3e12)  # only the 33.6 MB weight counts
    k = s["per_kind"]["pf_pdl"]
    assert k["geomean_gated"] == pytest.approx((12 / 8 * 1.0 * 7 / 5) ** (1 / 3))  # 12/13 < 1: cuBLAS serves
    assert s["per_kind"]["old_pdl"]["points"] == 2 and s["per_kind"]["read"]["points"] == 3
    lines = summ.verdicts(s)
    assert any("bandwidth goal" in ln and "_pf lane" in ln and "-> MET" in ln for ln in lines)  # 97.5%
    assert any("geomean goal" in ln and "_pf lane" in ln and "-> MET" in ln for ln in lines)  # 1.188x gated
    assert any("bandwidth goal" in ln and "old lane" in ln and "NOT MET" in ln for ln in lines)  # 78.0%
    slow = summ.summarize([_row(4096, 4096, 1, 12.0, {"dk8_n32x256_w4_s2_pf2_pdl": 11.0})], [])
    assert slow["per_kind"]["pf_pdl"]["min_bw_m1_16MB"] == pytest.approx(MB_4K / 11e-6 / 4.3e12)
    assert all("NOT MET" in ln for ln in summ.verdicts(slow) if "_pf lane" in ln)


_SMOKE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import decode_limit as dl, decode_pf as b, decode_pf_summary as summ
dl.DEVICE, dl.DT = "cpu", "fp16"  # fp16: the interpreter's tl.dot mishandles bf16
dl.replay_ms = lambda body, n, reps=7: (body(0), 0.01)[1]  # one call stands in for the graph
b.COPIES = 2
b.old_configs = lambda quick: ["dk2_n32x256_w4_s4_pdl"]
b.pf_configs = lambda quick: ["dk8_n32x256_w4_s2_pf2_pdl", "dk2_n16x256_w4_s2_pf4", "dk4_n16x256_w4_s2_at_pf1_pdl",
                              "dk1_n32x256_w4_s2_pf2_pdl", "dk1_n16x256_w4_s2_pf1"]
rows, reads = b.measure([(40, 2048), (72, 512), (40, 72), (72, 40)], [1, 16], True, 600.0, 3)
b.LAYER = [("qkv", 40, 2048, "x"), ("o", 72, 512, "x"), ("gate_up", 40, 72, "o"), ("down", 72, 40, "h")]
chains = [b.layer_chain(rows, reads, 1, 3, layers=2), b.layer_chain(rows, reads, 16, 3, layers=2)]
lines = summ.report(rows, b.pf_configs(True), {})
summ.report_chains(chains)
print(json.dumps({"rows": rows, "reads": reads, "lines": lines, "chains": chains}, default=str))
"""


@pytest.mark.slow
def test_the_bench_path_runs_on_cpu_under_the_interpreter():
    """Every arm checked against the reference before it is timed, the invalid refused by the
    predicate, the read and the chains measured, the tables and verdicts printed."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", _SMOKE, str(ROOT / "bench")], capture_output=True, text=True,
                         timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert [(r["N"], r["K"], r["M"]) for r in got["rows"]] == [
        (n, k, m) for n, k in ((40, 2048), (72, 512), (40, 72), (72, 40)) for m in (1, 16)]
    for r in got["rows"]:
        assert not r["failed"] and r["cublas_us"] > 0 and r["read_us"] > 0, r
        # K = 2048: 8 tiles of 256, every split fits; K = 512: 2 tiles, split 8 and 4 refused; K <= 256: one tile
        assert ("dk8_n32x256_w4_s2_pf2_pdl" in r["all_us"]) == (r["K"] == 2048)
        assert ("dk4_n16x256_w4_s2_at_pf1_pdl" in r["invalid"]) == (r["K"] < 1024)
        assert ("dk2_n16x256_w4_s2_pf4" in r["all_us"]) == (r["K"] >= 512)
    assert any("geomean goal" in ln for ln in got["lines"])
    for c in got["chains"]:
        assert {"cublas_us", "read_us", "pf_pdl_us", "pf_nopdl_us"} <= set(c), c
        assert "old_pdl_us" not in c  # its one config (split 2) has no point at K <= 256
        assert set(c["picks"]["read"]) == {"40x2048", "72x512", "40x72", "72x40"}
