"""bench/glsm_chunks.py and launch_chunks.py on the CPU: the chunk loop under the interpreter
against the fp32 reference and against the unchunked row pass (chunk sizes that divide M and
that leave a short last chunk, one stream and two: two fall back to one without CUDA), and one
bench point run with a stand-in timer (every arm called, gated, summarised). The GPU run is the
lead's; this catches a bench that would crash or mislabel arms before it spends device time."""
from __future__ import annotations

import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402
from bench_modules import bench_module, bench_snippet  # noqa: E402


def test_points_and_chunk_grid():
    g = bench_module("glsm_chunks")
    pts = g.points()
    assert len(pts) == 15 and {(n, k) for n, k, _ in pts} == {(5000, 256), (16000, 512), (32000, 512)}
    assert pts[0][2] == 8192 and pts[-1][2] == 256  # largest M first
    # R < M, and a chunk's logits within the budget
    assert g.chunk_rows(32000, 8192, g.CHUNKS) == (128, 256, 512)
    assert g.chunk_rows(16000, 256, g.CHUNKS) == (128,)
    assert g.chunk_rows(5000, 8192, g.CHUNKS, quick=True) == (256, 512, 1024, 2048)
    budget = g.chunks.l2_budget(g.shipped_profile("sm90"))
    assert all(r * n * 2 <= budget and r < m for n, _, m in pts for r in g.chunk_rows(n, m, g.CHUNKS))


def test_row_config_follows_the_table():
    g = bench_module("glsm_chunks")
    table = {"entries": {"s": {"regions": [[64, "rf_b64x64x64_w4_s3_pdl"], [8192, "lr_r1_c8192_w8"], [None, "torch"]]}}}
    assert g.shipped_pick(table, "s", 64) == "rf_b64x64x64_w4_s3_pdl" and g.row_config(table, "s", 64) == "lr_r1_c8192_w8"
    assert g.shipped_pick(table, "s", 9000) == "torch" and g.shipped_pick(table, "other", 5) == "torch"
    assert g.row_config(table, "other", 5) == "lr_r1_c8192_w8"


_LOOP = r"""
import torch
from tunedb.families.gemm_log_softmax.launch_chunks import chunked_call
from tunedb.families.gemm_log_softmax.launch import reference
torch.manual_seed(0)
bad = []
for m, n, k, bias in ((13, 1100, 32, True), (8, 300, 16, False)):
    x = torch.randn(m, k).half()
    w = (torch.randn(n, k) * k ** -0.5 * 3).half()
    b = (torch.randn(n) * 0.5).half() if bias else None
    ref = reference(x, w, b)
    logits = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float()).half()
    want = torch.log_softmax(logits.double(), dim=-1)
    for r, s, cfg in ((4, 1, (1, 2048, 4, None)), (5, 2, (2, 1024, 4, None)), (m, 1, (1, 2048, 4, 2)), (3, 2, (1, 2048, 4, 2))):
        rows, chunk, warps, persist = cfg
        out = torch.full((m, n), float("nan")).half()
        got = chunked_call(x, w, b, out, r, s, rows, chunk, warps, persist=persist)
        err = ((got.float() - ref).norm() / ref.norm()).item()
        gap = (got.double() - want).abs().max().item()
        if got is not out or torch.isnan(got).any() or err > 2e-3 or gap > 2.0 ** -10 * want.abs().max().item() + 1e-3:
            bad.append((m, n, r, s, cfg, err, gap))
    y = chunked_call(x.view(1, m, k), w, b, None, 4, 2, 1, 2048, 4)  # leading dims, allocated output
    if y.shape != (1, m, n) or ((y.view(m, n).float() - ref).norm() / ref.norm()).item() > 2e-3:
        bad.append(("alloc", m, n))
print("bad", bad)
assert not bad, bad
print("ok")
"""


@pytest.mark.slow
def test_chunk_loop_under_the_interpreter():
    res = interpret_child.snippet(_LOOP)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


_SMOKE = r"""
sig = g.FAM.make_signature(300, 16, "fp16", 1)
table = {"entries": {sig.format(): {"regions": [[4, "rf_b16x32x32_w4_s2_pdl"], [None, "lr_r2_c1024_w4"]]}}}
row = g.run_point(300, 16, 130, 1 << 20, shipped_profile("sm90"), table, (128, 256), device="cpu", timer=timer,
                  dt="fp16", alt="lr_r1_c1024_w4")
assert not row["failed"], row["failed"]
t = row["times_us"]
# R = 128 only (R < M = 130): two chunks, the second of 2 rows; three variants of each pass
want = {"torch", "shipped", "whole_s1", "linear"} | {f"lc_m128_{v}_{p}" for v in ("st1", "st2")
                                                      for p in ("r2_c1024_w4", "r1_c1024_w4")} | {
    "lc_m128_st1_r2_c1024_w4_pdl", "lc_m128_st1_r1_c1024_w4_pdl"}
assert set(t) == want, sorted(set(t) ^ want)
assert row["shipped_pick"] == "lr_r2_c1024_w4" and row["row_pass"] == "lr_r2_c1024_w4"
assert row["chunk_best"] == "whole_s1" and row["chunk_vs_shipped"] == t["shipped"] / t["whole_s1"]
print(g.markdown([row], {"N=1100,M=64": 1.1}))
print("ok")
"""


@pytest.mark.slow
def test_one_point_under_the_interpreter():
    res = interpret_child.snippet(bench_snippet("glsm_chunks", _SMOKE))
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
