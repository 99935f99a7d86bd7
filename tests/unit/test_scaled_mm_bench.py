"""bench/scaled_mm.py's pure-Python parts on the CPU: the --quick plan covers issue 20's goals
(shapes, Ms, which configs compile), and the summary/goal lines compute the ratios a reader
takes from them (vendor / ours, bf16 / ours, % of HBM, table pick vs the sweep's best,
bitwise failures counted)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
PATH = Path(__file__).resolve().parents[2] / "bench" / "scaled_mm.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scaled_mm", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_scaled_mm"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quick_plan_covers_the_goals(bench):
    points, warm = bench.plan(quick=True)
    groups = {p[0] for p in points}
    assert groups == {"fp8 row-wise, large M", "fp8 row-wise, M <= 16", "fp8 block-scaled", "int8"}
    big = [(n, k) for g, mode, n, k, m, _ in points if g == "fp8 row-wise, large M"]
    assert (14336, 4096) in big and (1280, 5120) in big and all(m >= 2048 for g, *_, m, _c in points
                                                                   if g == "fp8 row-wise, large M")
    assert all(p[4] <= 16 for p in points if p[0] == "fp8 row-wise, M <= 16")
    # block: the full sweep at each M (the exhaustive side of the goal)
    assert all(p[5] is None and p[1] == "fp8_block" for p in points if p[0] == "fp8 block-scaled")
    assert len(warm["fp8_block"]) == len(set(warm["fp8_block"])) >= 20
    assert sum(len(v) for v in warm.values()) <= 90  # the compile budget of --quick
    # every census point of the shipped block table, the LM head included; decode configs at M <= 16
    blk = {(n, k, m) for g, mode, n, k, m, _ in points if g == "fp8 block-scaled"}
    assert {(4096, 4096, 1), (1024, 4096, 16), (4096, 14336, 2048), (128256, 4096, 1)} <= blk
    assert any(c.startswith("dk") for c in warm["fp8_row"]) and bench.sweep_for("triton_decode", 17) == ()
    ex, _ = bench.plan(quick=True, exhaustive=True)
    assert all(p[5] == "space" for p in ex if p[1] == "fp8_block")
    full, _ = bench.plan(quick=False)
    assert len(full) == len(bench.MODES) * len(bench.SHAPES) * len(bench.MS)


def row(group, mode, n, k, m, lane, cid, us, status="ok", wmb=16.8):
    return {"group": group, "mode": mode, "N": n, "K": k, "M": m, "lane": lane, "config": cid,
            "status": status, "us": us, "tflops": 1.0 if us else None, "weight_mb": wmb}


def test_summary_and_goal_lines(bench):
    g0, g1, g2 = bench.QUICK[0][0], bench.QUICK[1][0], bench.QUICK[2][0]
    rows = [
        row(g0, "fp8_row", 4096, 4096, 2048, "bf16", "F.linear", 40.0),
        row(g0, "fp8_row", 4096, 4096, 2048, "torch", "torch", 20.0),
        row(g0, "fp8_row", 4096, 4096, 2048, "heuristic", "heuristic", 25.0),
        row(g0, "fp8_row", 4096, 4096, 2048, "triton_tma", "tma_b128x256x128_w8_s3_g8", 21.0),
        row(g1, "fp8_row", 4096, 4096, 1, "torch", "torch", 10.0),
        row(g1, "fp8_row", 4096, 4096, 1, "triton_splitk", "sk4_b16x64x128_w4_s4", 5.0, wmb=16.8),
        row(g2, "fp8_block", 4096, 4096, 16, "heuristic", "heuristic", 13.0),
        row(g2, "fp8_block", 4096, 4096, 16, "triton_splitk", "sk4_b16x64x128_w4_s4", 10.0),
        dict(row(g2, "fp8_block", 4096, 4096, 16, "table", "sk2_b16x64x128_w4_s4", 10.2), tier="system"),
        dict(row(g0, "fp8_row", 4096, 4096, 2048, "table", "torch", 20.0), tier="system"),
        dict(row(g1, "fp8_row", 4096, 4096, 1, "table", "dk1_n32x256_w4_s6_pdl", 8.0), tier="system"),
        row(g1, "fp8_row", 4096, 4096, 1, "triton_decode", "dk1_n32x256_w4_s6_pdl", 8.0),
        row("int8", "int8", 4096, 4096, 1, "bf16", "F.linear", 15.0),
        row("int8", "int8", 4096, 4096, 1, "heuristic", "heuristic", 10.0),
        row("int8", "int8", 4096, 4096, 1, "triton_splitk", "sk2_b16x64x128_w4_s4", None,
            status="incorrect: not bitwise equal to the heuristic"),
    ]
    table = {(t["group"], t["M"]): t for t in bench.summarize(rows)}
    big = table[(g0, 2048)]
    assert big["triton_best"] == "tma_b128x256x128_w8_s3_g8"
    assert big["vs_vendor"] == pytest.approx(20 / 21) and big["vs_bf16"] == pytest.approx(40 / 21)
    assert big["table_vs_vendor"] == pytest.approx(1.0) and big["table_vs_bf16"] == pytest.approx(2.0)
    small = table[(g1, 1)]
    assert small["hbm_pct"] == pytest.approx(100 * 16.8e6 / 5e-6 / 4.3e12)
    assert small["table_hbm_pct"] == pytest.approx(100 * 16.8e6 / 8e-6 / 4.3e12)
    assert small["decode_best"] == "dk1_n32x256_w4_s6_pdl" and small["table_vs_vendor"] == pytest.approx(10 / 8)
    blk = table[(g2, 16)]
    assert blk["table_vs_sweep"] == pytest.approx(1.02) and blk["heuristic_vs_table"] == pytest.approx(13 / 10.2)
    lines = bench.goals(list(table.values()))
    assert len(lines) == 4
    assert "table pick vs torch._scaled_mm geomean 1.00" in lines[0] and "vs bf16 cuBLAS geomean 2.00" in lines[0]
    assert "vs torch geomean 0.95" in lines[0] and "(table tiers system)" in lines[0]
    assert "table pick min 49 (goal >= 80)" in lines[1] and "% HBM min 78" in lines[1]
    assert "worst 1.020 over 1 points with a table entry, 0 without" in lines[2]
    assert "not bitwise equal to the heuristic: 1" in lines[3]
    assert "sk2_b16x64x128_w4_s4: incorrect" in bench.markdown(list(table.values()))


def test_the_vendor_op_run_as_the_heuristic_is_never_ours(bench):
    """fp8 row-wise: the heuristic's rule runs torch._scaled_mm (`heuristic=torch`); the sweep's
    best and "ours" must not count it, or the Triton lanes' goal would be judged on the vendor."""
    g0 = bench.QUICK[0][0]
    rows = [row(g0, "fp8_row", 1280, 5120, 2048, "torch", "torch", 30.6),
            row(g0, "fp8_row", 1280, 5120, 2048, "heuristic", "heuristic=torch", 30.5),
            row(g0, "fp8_row", 1280, 5120, 2048, "triton_tma", "tma_b128x256x128_w8_s3_g8", 47.0),
            dict(row(g0, "fp8_row", 1280, 5120, 2048, "table", "heuristic=torch", 30.7), tier="default")]
    (t,) = bench.summarize(rows)
    assert t["triton_best"] == t["sweep_best"] == "tma_b128x256x128_w8_s3_g8"
    assert t["table_pick"] == "heuristic=torch" and t["table_vs_vendor"] == pytest.approx(30.6 / 30.7)


def test_protocol_timing_is_the_default(bench):
    assert bench.TIMING == ["protocol"]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, PATH.parent / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pdl_context_block_quantizer_feeds_the_op():
    """bench/pdl_context.py's model context quantizes a bf16 activation per 1x128 block as
    QuantizedLinear does (row-wise it runs the op's own Triton row quantizer, CUDA only); its
    (q, s) are what the fp8 op takes and reproduce the activation's product."""
    import torch

    from tunedb import families
    from tunedb.families.scaled_mm import arms, ops

    pdl = _load("pdl_context")
    fam = families.get("scaled_mm_fp8")
    sig = fam.make_signature("scaled_mm", 64, 256, "bf16", "block")
    (_, w, _, sw), _ = fam.make_inputs(sig, 3, "cpu", seed=1)
    xb = torch.randn(3, 256, dtype=torch.bfloat16)
    q, s = pdl.quantizer("block")(xb)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == (3, 2)
    y = ops.scaled_mm_fp8(q, w, s, sw).float()
    want = xb.float() @ arms.dequantize(sig, q, w, s, sw, torch.float32)[1].t()
    assert ((y - want).abs().max() / want.abs().max()).item() < 0.1
    assert all(p[0] in ("row", "block") and p[4].startswith("dk") for p in pdl.POINTS)


def test_decode_limit_fp8_twins():
    lim = _load("decode_limit_fp8")
    assert lim.twin("dk4_n128x128_w8_s4") == "dk4_n128x128_w8_s4_pdl"
    assert lim.twin("dk4_n128x128_w8_s4_pdl") == "dk4_n128x128_w8_s4"
    assert lim.twin("torch") is None and lim.twin("b16x128x128_w4_s4_g8") is None
    assert all(n * k >= 4 * 2 ** 20 for n, k in lim.SHAPES)
