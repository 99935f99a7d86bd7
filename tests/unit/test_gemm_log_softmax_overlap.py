"""gemm_log_softmax's triton_overlap arm (docs/glsm_gap.md) on the CPU: ids and the lane's
predicate, the lag rule, the kernel under the interpreter against a float64 reference (ragged M
and N, with and without bias, leading dimensions, an output poisoned with NaN, the vector hint
on and off), bench/glsm_overlap.py's point under the interpreter with a stand-in timer, and the
sm90 compile of every config of the grid with the device's Triton (3.6)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import device_triton  # noqa: E402
import interpret_child  # noqa: E402

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import configs_overlap as co
from tunedb.families.gemm_log_softmax.launch_overlap import lag

SM90 = shipped_profile("sm90")


def test_ids_round_trip_and_bad_ids_name_the_value():
    cfg = co.parse("ov_b128x256x64_w8_s3")
    assert cfg.lane == "triton_overlap" and cfg.param("block") == (128, 256, 64)
    assert cfg.param("warps") == 8 and cfg.param("stages") == 3
    assert co.make(128, 256, 64, 8, 3) == cfg
    with pytest.raises(ConfigError, match="BN=96"):
        co.make(128, 96, 64, 8, 3)
    with pytest.raises(ConfigError, match="expected"):
        co.parse("ov_b128x256x64_w8")
    with pytest.raises(ConfigError, match="canonical"):
        co.parse("ov_b0128x256x64_w8_s3")
    assert len({c.id for c in co.grid()}) == len(co.grid()) >= 4


def test_the_lanes_predicate():
    cfg = co.parse("ov_b128x256x64_w8_s3")
    assert co.reason(cfg, 32000, 512, 8192, SM90) is None
    assert co.reason(cfg, 5000, 256, 256, SM90) is None
    assert "not every M" in co.reason(cfg, 32000, 512, None, SM90)
    assert "M=64" in co.reason(cfg, 32000, 512, 64, SM90)  # one row block: a grid barrier
    assert "BK=64" in co.reason(co.parse("ov_b128x128x64_w8_s3"), 5000, 16, 4096, SM90)
    wide = co.make(128, 256, 64, 4, 3)  # 256 fp32 accumulators a thread
    assert "accumulators" in co.reason(wide, 32000, 512, 8192, SM90)
    small = dataclasses.replace(SM90, smem_per_block=64 * 1024)
    assert "shared memory" in co.reason(cfg, 32000, 512, 8192, small)
    for c in co.grid():  # every config of the grid runs the census heads at M >= 256
        for n, k in ((5000, 256), (16000, 512), (32000, 512)):
            for m in (256, 1024, 8192):
                assert co.reason(c, n, k, m, SM90) is None, (c.id, n, m)


def test_the_lag_covers_a_row_block_and_the_grid():
    # every wait is on earlier tiles only when LAG >= T; the grid's tiles in flight come on top
    for g, t in ((1, 5), (132, 63), (132, 125), (7, 250)):
        assert lag(g, t) >= t and lag(g, t) >= g


_INTERPRET = r"""
import torch
from tunedb.families.gemm_log_softmax import configs_overlap as co
from tunedb.families.gemm_log_softmax.launch import torch_arm
from tunedb.families.gemm_log_softmax.launch_overlap import overlap_arm
gen = torch.Generator().manual_seed(7)
# fp16 (the interpreter's tl.dot mishandles bf16); N = 200 and 40 are multiples of 8 not 16 (vec
# 8), 37 of nothing (vec 1); M ragged against BM; row blocks of 1 to 5 tiles
for m, n, k, bias, blk in ((37, 200, 48, True, (16, 32, 16)), (50, 40, 32, False, (16, 32, 16)),
                           (19, 37, 24, True, (32, 32, 16)), (64, 96, 32, True, (64, 32, 32))):
    x = torch.randn(m, k, generator=gen).half()
    w = (torch.randn(n, k, generator=gen) * 3 * k ** -0.5).half()
    b = (torch.randn(n, generator=gen) * 0.5).half() if bias else None
    ref = torch.log_softmax(torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double()), -1)
    rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
    base = rel(torch_arm(x, w, b))
    cfg = co.make(*blk, 4, 2)
    got = []
    for vec in (None, 1):
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        y = overlap_arm(cfg, x, w, b, out=out, vec=vec)
        assert y is out and not torch.isnan(y).any(), (m, n, blk, vec)
        assert rel(y) <= 4 * base + 1e-6, (m, n, blk, vec, rel(y), base)
        # each row of exp(y) sums to 1 up to the fp16 rounding of y (and the interpreter's casts)
        assert ((y.double().exp().sum(-1) - 1).abs() <= 2e-2).all(), (m, n, blk)
        got.append(y.clone())
    assert torch.equal(got[0], got[1])  # the hint changes accesses, not values
# leading dimensions, out=None: [B, T, K] -> [B, T, N]
x = torch.randn(3, 7, 32, generator=gen).half()
w = (torch.randn(40, 32, generator=gen) * 0.5).half()
y = overlap_arm(co.make(16, 32, 16, 4, 2), x, w, None)
ref = torch.log_softmax(torch.nn.functional.linear(x.double(), w.double()), -1)
assert y.shape == (3, 7, 40) and ((y.double() - ref).norm() / ref.norm()).item() < 2e-3
# a wait that runs out gives up and returns: under the interpreter programs run one after
# another, so with two programs the first one's fix-ups wait on row blocks the second has not
# computed; its poll budget (50) runs out once, then its fix-ups give up at once (NaN), and the
# second program's later writes of those tiles leave them unnormalised: loudly wrong (lse ~ 5-10
# off), never a hang; the tiles the second program fixed are right
x = torch.randn(64, 32, generator=gen).half()
w = (torch.randn(96, 32, generator=gen) * 0.5).half()
out = torch.zeros(64, 96, dtype=torch.float16)
overlap_arm(co.make(16, 32, 32, 4, 2), x, w, None, out=out, grid=2, max_spins=50)
ref = torch.log_softmax(torch.nn.functional.linear(x.double(), w.double()), -1)
bad = ((out.double() - ref).abs() > 1).view(4, 16, 3, 32).any(3).any(1)  # [row block, N tile]
odd = (torch.arange(12) % 2 == 1).view(4, 3)  # tile u = rb * 3 + nt is fixed by program (u + 5) % 2
assert torch.equal(bad, odd), bad
# M = 0: nothing to launch
assert overlap_arm(co.make(16, 32, 16, 4, 2), torch.zeros(0, 7, 32).half(), w, None).shape == (0, 7, 96)
print("ok")
"""


@pytest.mark.slow
def test_the_overlap_kernel_under_the_interpreter():
    res = interpret_child.snippet(_INTERPRET)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


_SMOKE = r"""
import sys, torch
sys.path.insert(0, BENCH)
import glsm_overlap as g
from tunedb.arch import shipped_profile
assert g.shipped_pick({"entries": {"s": {"regions": [[64, "a"], [8192, "b"], [None, "torch"]]}}}, "s", 256) == "b"
assert g.shipped_pick({"entries": {}}, "s", 256) == "torch"
calls = []
def timer(call, weights):
    call(*weights[0])
    calls.append(1)
    return 10.0 + len(calls)
table = {"entries": {"gemm_log_softmax|op=gemm_log_softmax|dt=fp16|N=40|K=32|bias=1":
                     {"regions": [[None, "lr_r1_c1024_w4"]]}}}
row = g.run_point(40, 32, 256, 1 << 20, shipped_profile("sm90"), table, ("ov_b16x32x32_w4_s2", "ov_b128x256x64_w8_s3"),
                  device="cpu", timer=timer, dt="fp16")
bad = {k: v for k, v in row["failed"].items() if not v.startswith("invalid")}
assert not bad, bad
assert set(row["times_us"]) == {"torch", "shipped", "ov_b16x32x32_w4_s2", "no-overlap", "linear"}, row["times_us"]
assert row["failed"]["ov_b128x256x64_w8_s3"].startswith("invalid: BK=64")  # K = 32: the lane's own rule
assert row["shipped_pick"] == "lr_r1_c1024_w4" and row["ov_best"] == "ov_b16x32x32_w4_s2"
assert row["best_x"] == row["times_us"]["torch"] / min(row["times_us"]["shipped"], row["times_us"]["ov_b16x32x32_w4_s2"])
print(g.markdown([row]))
print("ok")
"""


@pytest.mark.slow
def test_the_bench_point_under_the_interpreter():
    from bench_modules import BENCH

    res = interpret_child.snippet(f"BENCH = {BENCH!r}\n" + _SMOKE)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


def test_the_bench_census_points():
    from bench_modules import bench_module

    g = bench_module("glsm_overlap")
    full, quick = g.census_points(False), g.census_points(True)
    assert len(full) == 15 and len(quick) == 12 and full[0][2] == 64
    assert all(co.parse(c) for c in g.QUICK_OV)


_COMPILE = r"""
import json, re
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from tunedb.families.gemm_log_softmax import kernels_overlap as ko, configs_overlap as co
from tunedb.families.gemm_log_softmax.launch_overlap import STAT_BLOCK, FIX_COLS
ptr16 = [["tt.divisibility", 16]]
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "pmax_ptr": "*fp32",
       "psum_ptr": "*fp32", "lse_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "T": "i32",
       "R": "i32", "LAG": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32",
       "HAS_BIAS": "constexpr", "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "TB": "constexpr",
       "FC": "constexpr", "MAX_SPINS": "constexpr", "VEC": "constexpr"}
out = {}
for cfg in co.grid():
    bm, bn, bk = cfg.param("block")
    # N = 5000 as the runtime sees it: pointers and K-strides specialised, N and stride_ym not
    src = ASTSource(fn=ko._overlap_kernel, signature=sig,
                    constexprs=dict(HAS_BIAS=True, BM=bm, BN=bn, BK=bk, TB=STAT_BLOCK, FC=min(bn, FIX_COLS),
                                    MAX_SPINS=1 << 16, VEC=8),
                    attrs={(i,): ptr16 for i in (0, 1, 2, 3, 4, 5, 6, 7, 10, 15)})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=cfg.param("warps"), num_stages=cfg.param("stages"))).asm["ptx"]
    out[cfg.id] = {"wgmma": "wgmma.mma_async" in ptx, "ops": sorted(set(re.findall(r"(?:ld|st|atom)\.global[.\w]*", ptx)))}
print("PTX " + json.dumps(out))
"""


@pytest.mark.slow
def test_every_config_compiles_for_sm90_with_the_device_triton():
    import json

    path = device_triton.path()
    if path is None:
        pytest.skip(f"no Triton 3.6 here (neither the running Triton nor {device_triton.WHEEL_SITE})")
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=900,
                          env=device_triton.child_env(path))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PTX ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][4:])
    assert set(got) == {c.id for c in co.grid()}
    for cid, info in got.items():
        ops = info["ops"]
        assert info["wgmma"], cid  # the tile's tl.dot is Hopper's warpgroup MMA
        assert "atom.global.gpu.acq_rel.add.u32" in ops and "atom.global.gpu.release.exch.b32" in ops, (cid, ops)
        assert any(o.startswith("ld.global") and ".acquire" in o for o in ops), (cid, ops)  # the flag's poll
        assert "st.global.v4.b32" in ops, (cid, ops)  # 16-byte logits stores at N = 5000 (VEC = 8)
