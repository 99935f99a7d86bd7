"""bench/decode_limit.py's pure parts (decode_bounds: the census's weights, the end-to-end bound,
the fixed-cost fit, the goal verdicts; the Linear-call recorder) and the read roofline kernel
(bench/read_roofline.py) under the Triton interpreter, in a child process: TRITON_INTERPRET must
be set before the kernel is defined."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import decode_bounds as db  # noqa: E402

CENSUS = ROOT / "bench" / "census" / "llama-3-8b_decode.json"


def test_census_weights_are_the_distinct_gemm_weights_smallest_first(tmp_path):
    assert db.census_weights(CENSUS) == [(1024, 4096), (4096, 4096), (4096, 14336), (14336, 4096), (128256, 4096)]
    # the fused census's gemm_act (gate with silu) reads the same 14336 x 4096 weight: no new size
    assert db.census_weights(ROOT / "bench" / "census" / "llama-3-8b_decode_fused.json") == db.census_weights(CENSUS)
    assert db.census_weights(CENSUS, max_bytes=200e6)[-1] == (14336, 4096)  # the LM head left out
    only_bmm = tmp_path / "bmm.json"
    only_bmm.write_text(json.dumps({"points": [{"signature": "gemm|op=bmm|dt=half|B=32|N=1|K=128", "M": 1}]}))
    with pytest.raises(ValueError, match="no gemm/gemm_act weights"):
        db.census_weights(only_bmm)


def test_parse_shapes_reads_n_by_k_and_names_a_bad_one():
    assert db.parse_shapes("28672x4096, 4096X4096") == [(28672, 4096), (4096, 4096)]
    for bad, why in (("28672x", "28672x"), ("0x4096", "positive"), ("", "no shapes")):
        with pytest.raises(ValueError, match=why):
            db.parse_shapes(bad)


def test_e2e_bound_is_the_step_with_its_gemms_replaced():
    # a 450 us step whose GEMMs take 250 us with cuBLAS and 200 us at the roofline
    assert db.e2e_bound(450.0, 250.0, 200.0) == pytest.approx(450 / 400)
    assert db.e2e_bound(450.0, 250.0, 250.0) == 1.0
    with pytest.raises(ValueError, match="within the step"):
        db.e2e_bound(200.0, 250.0, 100.0)
    with pytest.raises(ValueError, match="new GEMM time"):
        db.e2e_bound(450.0, 250.0, 0.0)


def test_fixed_cost_fit_recovers_the_intercept_and_the_rate():
    pts = [(b, 5.0 + b / 4.5e12 * 1e6) for b in (8.4e6, 33.5e6, 117.4e6, 1050e6)]
    fixed, bw = db.fit_fixed_cost(pts)
    assert fixed == pytest.approx(5.0) and bw == pytest.approx(4.5e12)
    with pytest.raises(ValueError, match="two distinct sizes"):
        db.fit_fixed_cost([(1e6, 3.0), (1e6, 3.1)])


def test_gemm_row_shares_and_ceiling():
    r = db.gemm_row(33_554_432, read_us=10.0, cublas_us=13.0, lane_us=11.0)
    assert r["cublas_bw"] == pytest.approx(33_554_432 / 13e-6 / 4.3e12)
    assert r["lane_of_roof"] == pytest.approx(10 / 11) and r["speedup"] == pytest.approx(13 / 11)
    assert r["ceiling"] == pytest.approx(1.3)
    assert "lane_us" not in db.gemm_row(1, 1.0, 2.0, None)


def _row(n, k, m, read_us, cublas_us, lane_us):
    nb = db.weight_bytes(n, k)
    return {"N": n, "K": k, "M": m, "MB": nb / 1e6, "read_bw": db.share(nb, read_us),
            **db.gemm_row(nb, read_us, cublas_us, lane_us)}


def test_verdicts_say_which_goal_a_pure_read_cannot_reach():
    rows = [_row(4096, 4096, 1, 11.0, 13.2, 11.3), _row(14336, 4096, 1, 29.0, 31.0, 30.5)]
    e2e = [{"batch": 1, "gemm_share": 0.55, "bound_roof": 1.06, "lane_e2e": 1.02}]
    text = "\n".join(db.verdicts(rows, e2e))
    assert "out of reach of any kernel at 4096x4096 (70.9%)" in text  # 33.5 MB in 11 us is 71% of 4.3 TB/s
    assert "14336x4096" not in text.split("out of reach")[1]  # 94% there: within reach
    assert "ceiling (every GEMM at the read roofline, gated) 1.133x: the goal is above the physical ceiling" in text
    assert "bound from GEMM selection alone 1.060x, the lane's GEMMs would give 1.020x: the goal is above the physical limit" in text
    assert "not a ceiling" not in text
    ok = db.verdicts([_row(14336, 4096, 1, 20.0, 31.0, 22.0)], [{"batch": 16, "gemm_share": 0.7, "bound_roof": 1.2}])
    assert "within reach of a pure read at every size" in ok[0]
    assert "the lane reaches" in ok[1] and "within the bound" in ok[2]


def test_verdicts_name_a_gemm_that_reads_faster_than_the_roofline():
    rows = [_row(28672, 4096, 1, 58.0, 55.1, 59.0), _row(28672, 4096, 4, 58.0, 57.5, 59.0)]
    text = "\n".join(db.verdicts(rows, []))
    assert "not a ceiling at 28672x4096 M=1 (cuBLAS 55.10 us < 58.00 us)" in text
    assert "M=4" not in text  # within 2%: noise, not a broken ceiling


def test_step_gemms_records_linear_calls_in_order_with_their_rows():
    import torch
    from torch import nn

    import decode_limit

    class BM:  # the part of e2e_models.BenchModel step_gemms uses
        module = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Linear(4, 4))

        def call(self, module, batch):
            return lambda: module(torch.randn(batch, 1, 8))

    bm = BM()
    calls = decode_limit.step_gemms(bm, 3)
    assert [(mod.out_features, m) for mod, m in calls] == [(16, 3), (4, 3), (4, 3)]
    assert calls[0][0] is bm.module[0]
    assert not bm.module[0]._forward_pre_hooks  # hooks removed


def test_bad_flags_are_refused_before_any_gpu_work():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for flags, why in ((["--shapes", "28672x"], "28672x"), (["--batches", "0"], "positive integers")):
        res = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_limit.py"), *flags], capture_output=True,
                             text=True, timeout=60, env=env)
        assert res.returncode == 2 and why in res.stderr, res.stderr


def test_read_ids_round_trip():
    pytest.importorskip("triton")
    import read_roofline as rr

    for cfg in rr.configs(quick=False):
        assert rr.by_id(cfg.id) == cfg
    assert {c.id for c in rr.configs(quick=True)} <= {c.id for c in rr.configs(quick=False)}
    with pytest.raises(ValueError, match="read_b1_w1"):
        rr.by_id("read_b1_w1")
    cfg = rr.ReadConfig(8192, 8, 1, ctas_per_sm=4)
    assert cfg.grid(8192 * 1000, 132) == 528 and cfg.grid(8192 * 10, 132) == 10
    assert rr.ReadConfig(8192, 8, 1).grid(8192 * 10 + 1, 132) == 11


_CHILD = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import read_roofline as rr
bad = []
for dt in (torch.bfloat16,):  # the benchmark reads bf16
    for numel in (1000, 3 * 256, 5001):
        w = torch.randn(numel, dtype=dt)
        for c in rr.configs(quick=False, pdl=False):  # the interpreter runs _pdl binaries without PDL
            small = rr.ReadConfig({4096: 64, 8192: 128, 16384: 256}[c.block], c.warps, c.stages, c.ctas_per_sm, c.pdl)
            fn = rr.launcher(small, numel, 3, interpret=True)
            out = torch.full((fn.grid,), float("nan"))
            fn(w, out)
            ones = torch.full((fn.grid,), float("nan"))
            fn(torch.ones(numel, dtype=dt), ones)
            got, ref = out.double().sum().item(), w.double().sum().item()
            if ones.sum().item() != numel or abs(got - ref) > 1e-4 * numel ** 0.5:
                bad.append([str(dt), numel, small.id, got, ref, ones.sum().item()])
print(json.dumps(bad))
"""


def test_read_kernel_reads_every_element_once_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "bench")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


_SMOKE = r"""
import json, sys, torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import decode_limit as dl, e2e_models
dl.DEVICE, dl.DT, dl.L2, dl.MS = "cpu", "fp16", 4096, (1, 2)  # fp16: the interpreter's tl.dot mishandles bf16
dl.replay_ms = lambda body, n, reps=7: [body(i) for i in range(n)] and 0.01 * n
dl.lane_configs = lambda n, k, quick: ["dk1_n32x256_w4_s4", "dk2_n32x64_w4_s4_at", "dk1_n16x64_w2_s2_pdl"]
reads, rows = dl.weights_and_gemms([(40, 160), (160, 40)], True, 60.0, 3)

class BM:
    module = nn.Sequential(nn.Linear(160, 40, bias=False), nn.Linear(40, 160, bias=False)).half()
    def call(self, module, batch):
        return lambda: module(torch.randn(batch, 1, 160, dtype=torch.float16))

e2e_models.build = lambda name, device, batches: BM()
e2e = dl.end_to_end([1, 2], reads, rows, 3)
lines = dl.show(reads, rows, rows, e2e, None)
print(json.dumps({"reads": reads, "rows": rows, "e2e": e2e, "lines": lines}, default=str))
"""


@pytest.mark.slow
def test_the_bench_path_runs_on_cpu_under_the_interpreter():
    """(a), (b), (c) and the tables on tiny fp16 weights with a stand-in timer: every arm checked,
    the lane's best and the chains built from them; what the GPU run does, minus the timing."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", _SMOKE, str(ROOT / "bench")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(got["reads"]) == {"40x160", "160x40"}
    assert all(not r["failed"] for r in got["reads"].values())  # every read config read every element
    assert [(r["N"], r["K"], r["M"]) for r in got["rows"]] == [(40, 160, 1), (40, 160, 2), (160, 40, 1), (160, 40, 2)]
    for r in got["rows"]:
        assert not r["failed"] and r["lane"] in r["all_us"], r
        # K=40 has one 64-wide K tile: the split-2 config is refused by the lane's predicate, not run
        assert r["configs_timed"] == (3 if r["K"] == 160 else 2)
        assert list(r.get("invalid", {})) == ([] if r["K"] == 160 else ["dk2_n32x64_w4_s4_at"])
    assert [e["batch"] for e in got["e2e"]] == [1, 2]
    for e in got["e2e"]:
        assert e["gemms"] == 2 and {"bound_roof", "bound_roof_nopdl", "lane_e2e", "bound_bytes_at_peak"} <= set(e)
