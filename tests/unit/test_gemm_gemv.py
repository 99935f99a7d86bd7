"""The GEMM decode lane's bf16/fp16 GEMV (`gv` configs: configs_gemv.py, kernels_gemv.py,
launch_gemv.py, prebuild_gemv.py): ids, the rules a config must meet and the prebuild's jobs (pure
Python); the kernel under
TRITON_INTERPRET=1 at small odd shapes against the fp64 product (the FMA path in bf16 and fp16,
the tensor-core path in fp16: this CPU Triton's interpreter computes bf16 tl.dot wrongly, its
bf16 FMA path right), with and without bias, every split bitwise equal on two calls (the
deterministic finish; the counters the kernel leaves zero); the launch refusing an M the rules
refuse; every gv kernel shape compiled for sm90 by the device's Triton 3.6 (16-byte weight loads,
the K loop pipelined through cp.async, no spills, griddepcontrol only in _pdl twins); and the
bench's arms valid where it runs them."""
import json
import sys
from pathlib import Path

import pytest

import device_triton
import interpret_child

from tunedb.errors import ConfigError
from tunedb.families.gemm.configs_gemv import gemv_grid, gemv_reason, make_gemv, parse_gemv, pdl_twin, rows_padded

SHAPES = ((80, 520), (36, 200))  # N, K: K not a multiple of the K block, N not of BN
# the _p{PRE} ids: the first tile PRE K tiles wide (with _lr its product summed outside the
# [BN, BK] accumulators; split 2 at K=520 in 64-element tiles: the wide tile stays in its split)
FMA_IDS = ("gv1_n8x256_w2_s3", "gv2_n4x128_w2_s3_pdl", "gv3_n16x128_w4_s2", "gv2_n8x128_w2_s3_lr",
           "gv1_n8x128_w2_s3_lr_p2_pdl", "gv1_n4x64_w2_s3_p2", "gv2_n4x64_w2_s2_lr_p2")
MMA_IDS = ("gv1_n16x256_w4_s3_mma", "gv2_n32x128_w4_s3_mma_pdl", "gv1_n16x64_w4_s3_mma_p2_pdl")


def test_gemv_ids_round_trip_and_bad_values():
    cfg = parse_gemv("gv2_n16x512_w4_s5_mma_pdl")
    assert cfg.lane == "triton_decode" and cfg.param("block") == (16, 16, 512)
    assert cfg.param("kernel") == "gemv" and cfg.param("dot") is True and cfg.param("pdl") is True
    assert cfg.param("split_k") == 2 and cfg.param("stages") == 5
    assert pdl_twin(cfg).id == "gv2_n16x512_w4_s5_mma" and pdl_twin(pdl_twin(cfg)) == cfg
    fma = parse_gemv("gv1_n4x1024_w2_s3")
    assert fma.param("dot") is False and fma.param("pdl") is False and fma.param("late") is False
    late = parse_gemv("gv2_n8x512_w4_s5_lr_pdl")
    assert late.param("late") is True and pdl_twin(late).id == "gv2_n8x512_w4_s5_lr"
    for bad in ("gv1_n12x512_w4_s3", "gv17_n16x512_w4_s3", "gv1_n16x32_w4_s3", "gv1_n16x512_w4_s9",
                "gv1_n8x512_w4_s3_mma", "gv1_n16x512_w4_s3_pdl_mma", "gv01_n16x512_w4_s3", "gv0_n16x512_w4_s3",
                "gv1_n16x512_w16_s3", "dk1_n32x256_w4_s4", "gv1_n16x512_w4_s3_mma_lr", "gv1_n16x512_w4_s3_pdl_lr"):
        with pytest.raises(ConfigError):
            parse_gemv(bad)
    with pytest.raises(ConfigError, match="BN=12 not allowed"):
        make_gemv(12, 512, 4, 3)
    grid = gemv_grid()
    assert len({c.id for c in grid}) == len(grid) and all(parse_gemv(c.id) == c for c in grid)
    assert {c.param("dot") for c in grid} == {False, True} and {c.param("pdl") for c in grid} == {False, True}
    assert {c.param("late") for c in grid} == {False, True} and not any(c.param("late") and c.param("dot") for c in grid)
    assert rows_padded(1, False) == 1 and rows_padded(3, False) == 4 and rows_padded(2, True) == 16


def test_gemv_rules():
    fma, mma = parse_gemv("gv1_n16x512_w4_s3"), parse_gemv("gv1_n16x512_w4_s3_mma")
    assert gemv_reason(fma, 4096, 4096, 1) is None
    assert "M <= 4, not M=5" in gemv_reason(fma, 4096, 4096, 5)
    assert gemv_reason(mma, 4096, 4096, 16) is None
    assert "M <= 16, not M=17" in gemv_reason(mma, 4096, 4096, 17)
    assert "not M=0" in gemv_reason(mma, 4096, 4096, 0)
    # the FMA product tile: [MP, BN, BK] over 32 x warps threads, 128 registers at most
    assert gemv_reason(fma, 4096, 4096, 2) is None  # 2 x 16 x 512 / 128 = 128
    assert "256 registers" in gemv_reason(fma, 4096, 4096, 3)  # MP 4
    assert gemv_reason(parse_gemv("gv1_n4x512_w2_s3"), 4096, 4096, 4) is None
    assert "split_k=8 > 4 K tiles" in gemv_reason(parse_gemv("gv8_n16x128_w4_s3"), 4096, 500, 1)
    assert "not 'fp32'" in gemv_reason(mma, 4096, 4096, 1, "fp32")
    assert "Triton 3.4+" in gemv_reason(parse_gemv("gv1_n16x512_w4_s3_pdl"), 4096, 4096, 1, pdl_ok=False)
    # the late reduction holds the same [MP, BN, BK] tile across the loop: the same bound
    assert "256 registers" in gemv_reason(parse_gemv("gv1_n16x512_w4_s3_lr"), 4096, 4096, 3)


def test_prebuild_jobs_are_the_binaries_a_run_launches():
    from tunedb.families.gemm.prebuild_gemv import GemvJob, jobs

    got = jobs(["gv1_n16x512_w4_s5", "gv2_n16x256_w4_s5_mma_pdl"], [(4096, 4096), (80, 200)], (1, 3, 8, 16))
    # FMA: MP 1 at M=1 (M=3 needs MP 4: 256 registers; 8, 16 not served); mma: MP 16 at every M,
    # not at K=200 (one K tile for two splits); N=80 is 16-divisible, K=200 is not
    assert got == [GemvJob("gv1_n16x512_w4_s5", 1, "bf16", True, False), GemvJob("gv1_n16x512_w4_s5", 1),
                   GemvJob("gv2_n16x256_w4_s5_mma_pdl", 16)]


def test_the_bench_arms_are_valid_where_it_runs_them():
    """bench/decode_gemv_bf16.py times every gv and dk config it names at each weight and M: a
    typo or a rule change would drop an arm silently on the device, so check them here."""
    from bench_modules import bench_module

    from tunedb.arch import shipped_profile
    from tunedb.families.gemm import FAMILY

    bench = bench_module("decode_gemv_bf16")
    for n, k in bench.LLAMA + bench.EXTRA:
        sig = FAMILY.make_signature("gemm", "bf16", n, k)
        for m in bench.MS:
            for quick in (False, True):
                ids = bench.gv_ids(m, quick)
                assert [(c, gemv_reason(parse_gemv(c), n, k, m)) for c in ids if gemv_reason(parse_gemv(c), n, k, m)] == []
                assert any(c.endswith("_pdl") for c in ids) and any(not c.endswith("_pdl") for c in ids)
                assert any("_mma" not in c for c in ids) == (m <= 4)  # the FMA path where it serves
                for cid in bench.dk_ids(quick):
                    assert FAMILY.invalid_reason(FAMILY.parse_config(cid), sig, m, shipped_profile("sm90")) is None
    arms = {"torch": {"us": 10.0, "share": 0.5, "x_cublas": 1.0}, "gv1_n16x512_w4_s5": {"us": 8.0, "share": 0.6, "x_cublas": 1.25},
            "dk1_n64x128_w4_s4": {"us": 12.5, "share": 0.4, "x_cublas": 0.8}}
    pt = {"arms": arms, "best_gv": "gv1_n16x512_w4_s5", "best_gv_nopdl": "gv1_n16x512_w4_s5", "best_dk": "dk1_n64x128_w4_s4",
          "best_dk_nopdl": "dk1_n64x128_w4_s4"}
    got = bench.summarize([{"N": 4096, "K": 4096, "MB": 33.6, "read_share": 0.9, "M": {"1": pt, "16": pt}},
                           {"N": 1, "K": 1, "error": "x"}])
    assert got["best_gv"] == {"points": 2, "x_cublas_geomean": 1.25, "x_cublas_min": 1.25, "share_min_m1_16MB_plus": 0.6}
    assert got["best_dk"]["x_cublas_geomean"] == 0.8 and got["best_of_both"]["x_cublas_min"] == 1.25
    assert got["best_of_both"]["through_gate_geomean"] == 1.25
    assert got["cublas_share_min_m1_16MB_plus"] == 0.5 and got["read_share_min_16MB_plus"] == 0.9


def _child() -> None:
    import torch

    from tunedb.families.gemm import FAMILY
    from tunedb.families.gemm.launch_gemv import launcher

    failures = []
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for n, k in SHAPES:
        for m in (1, 2, 3, 9, 16):
            ids = [c for c in FMA_IDS + MMA_IDS if gemv_reason(parse_gemv(c), n, k, m) is None]
            if (FMA_IDS[0] in ids) != (m <= 4) or any(c not in ids for c in MMA_IDS):
                failures.append(f"N={n} K={k} M={m}: valid gv ids {ids}")
            for cid in ids:
                for dt in ("fp16",) if "_mma" in cid else ("bf16", "fp16") if cid == FMA_IDS[0] else ("bf16",):
                    bias = (m + len(cid)) % 2 == 1  # about half the cases with a bias
                    sig = FAMILY.make_signature("gemm_act" if bias else "gemm", dt, n, k, bias=bias)
                    g = torch.Generator().manual_seed(m + n + k)
                    x = (torch.rand(m, k, generator=g) * 2 - 1).to(dts[dt])
                    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dts[dt])
                    b = torch.randn(n, generator=g).to(dts[dt]) if bias else None
                    ref = x.double() @ w.double().t() + (b.double() if bias else 0)
                    # one ulp of the output at its peak (the interpreter truncates fp32 -> bf16)
                    bound = (2 ** -7 if dt == "bf16" else 2 ** -10) * ref.abs().max().item()
                    run = launcher(cid, sig)
                    first = run(x, w, b, None)
                    err = (first.double() - ref).abs().max().item()
                    if first.dtype != dts[dt] or not err <= bound:
                        failures.append(f"{cid} {dt} N={n} K={k} M={m} bias={bias}: error {err:.3g} > {bound:.3g}")
                    if not torch.equal(run(x, w, b, None), first):  # the split counters left zero
                        failures.append(f"{cid} {dt} N={n} K={k} M={m}: second call not bitwise equal")
    sig = FAMILY.make_signature("gemm", "bf16", 80, 520)
    x, w = torch.ones(5, 520, dtype=torch.bfloat16), torch.ones(80, 520, dtype=torch.bfloat16)
    try:
        launcher(FMA_IDS[0], sig)(x, w, None, None)
        failures.append("the FMA path launched at M=5")
    except ValueError as exc:
        if "M <= 4" not in str(exc):
            failures.append(f"the FMA path at M=5: unclear error {exc}")
    interpret_child.report(failures)


@pytest.mark.slow
def test_gemv_kernel_under_interpreter():
    assert interpret_child.failures(__file__) == []


def _bench_child() -> None:
    """bench/decode_gemv_bf16.one_weight on the CPU at a small weight (timers and the read faked:
    this checks the bench's flow, not its numbers): every gv arm it names at M <= 4 or with a
    tensor-core checked and 'timed', the table row printed, the summary made."""
    from bench_modules import bench_module

    bench = bench_module("decode_gemv_bf16")
    sys.path.insert(0, str(Path(bench.__file__).parent))
    import decode_gemv_fp8
    import decode_limit

    bench.DEVICE = "cpu"
    bench.protocol_ms = lambda body, n: (body(0), body(1), 0.01)[-1]
    decode_gemv_fp8.read_best = lambda *a: ("torch.sum", 5.0)
    decode_limit.copies_for = lambda nbytes: 2
    failures = []
    row = bench.one_weight(40, 1024, True, 4, set())
    for m, pt in row["M"].items():
        bench.print_point(row, m, pt)
        gv = [c for c in pt["arms"] if c.startswith("gv")]
        bad = {c: a for c, a in pt["arms"].items() if c.startswith("gv") and "us" not in a}
        # the tensor-core path is checked in fp16 only (the interpreter's bf16 tl.dot): its bf16
        # arms may fail the check here; the FMA arms must pass
        if not gv or any("_mma" not in c for c in bad) or (int(m) <= 4) != any("_mma" not in c for c in gv):
            failures.append(f"M={m}: gv arms {gv}, failed {bad}")
        if pt["arms"]["torch"].get("x_cublas") != 1.0:
            failures.append(f"M={m}: torch arm {pt['arms']['torch']}")
    summary = bench.summarize([row])
    if summary["best_gv"]["points"] != 0 or summary["read_share_min_16MB_plus"] is not None:
        failures.append(f"summary of a non-Llama weight below 16 MB: {summary}")
    interpret_child.report(failures)


@pytest.mark.slow
def test_the_bench_runs_its_flow_on_the_cpu():
    assert interpret_child.failures(__file__, "bench") == []


COMPILE_CASES = [  # (config, M, dtype): each kernel shape of the gv space once
    ("gv1_n8x512_w4_s5_lr_p4_pdl", 1, "bf16"), ("gv1_n16x256_w4_s5_lr_p2_pdl", 1, "bf16"),
    ("gv1_n8x512_w8_s5_p8_pdl", 1, "bf16"), ("gv1_n16x256_w1_s5_mma_pdl", 16, "bf16"),
    ("gv1_n16x512_w4_s5", 1, "bf16"), ("gv1_n16x1024_w8_s3_pdl", 1, "bf16"), ("gv4_n8x256_w2_s5", 2, "fp16"),
    ("gv2_n4x512_w2_s3_pdl", 4, "bf16"), ("gv8_n32x512_w8_s3", 1, "bf16"), ("gv1_n16x512_w4_s5_mma", 16, "bf16"),
    ("gv2_n16x256_w4_s5_mma_pdl", 9, "bf16"), ("gv4_n64x256_w4_s4_mma", 1, "fp16"),
    ("gv1_n16x512_w4_s5_lr", 1, "bf16"), ("gv2_n8x512_w4_s5_lr_pdl", 4, "bf16"), ("gv1_n16x256_w4_s3_lr", 2, "fp16"),
]
# N and K without a 16-divisibility hint (the GPU test's 80x200, 136x1000): 2-byte loads, so no
# 16-byte checks, but it must compile
ODD_CASES = [("gv2_n8x256_w2_s3_pdl", 3, "bf16"), ("gv4_n32x256_w4_s3_mma", 16, "bf16"), ("gv1_n8x256_w2_s3_lr", 1, "bf16")]


def _sass_spills(ptx: str) -> int:
    """Spill store bytes ptxas reports assembling `ptx` for sm90a (Triton's own ptxas): PTX has no
    spills, so a register-hungry kernel looks clean until ptxas runs (session 34: a 512-byte-a-thread
    first tile spilled 200 bytes and ran 1.6x slower)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    return sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", out))


def _compile_child(cases, odd=()) -> None:
    """Compile each case for sm90 (no GPU: triton.compile) and print one JSON line per case."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tunedb.families.gemm.kernels_gemv import gemm_gemv_kernel
    from tunedb.families.gemm.kernels_gemv import spec

    for cid, m, dt in [*cases, *odd]:
        cfg = parse_gemv(cid)
        kw = spec(cfg).kwargs(rows_padded(m, bool(cfg.param("dot"))))
        opts = dict(num_warps=kw.pop("num_warps"), num_stages=kw.pop("num_stages"))
        kw.pop("launch_pdl", None)
        io = f"*{dt}"
        signature = {"x_ptr": io, "w_ptr": io, "y_ptr": io, "b_ptr": io, "ws_ptr": "*fp32", "cnt_ptr": "*i32",
                     "M": "i32", "N": "i32", "K": "i32", "HAS_BIAS": "i32", "ACT": "i32"}
        signature.update(dict.fromkeys(kw, "constexpr"))
        # the launch specializes 16-divisible pointers, N and K (the Llama widths): so does this
        hinted = (0, 1, 2, 3, 4, 5) if (cid, m, dt) in odd else (0, 1, 2, 3, 4, 5, 7, 8)
        attrs = {(i,): [["tt.divisibility", 16]] for i in hinted}
        row = {"id": cid, "m": m, "dt": dt, "odd": (cid, m, dt) in odd}
        try:
            kern = triton.compile(ASTSource(fn=gemm_gemv_kernel, signature=signature, constexprs=kw, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options=opts)
            ptx = kern.asm["ptx"]
            row["spill_bytes"] = _sass_spills(ptx)
            # the first W tile by a 16-byte evict-first load, the loop's by 16-byte cp.async copies
            row.update(ok=True, wide_w=bool(re.search(r"ld\.global\.L1::evict_first\S*\.v4", ptx)),
                       cp_async=bool(re.search(r"cp\.async\.cg\.shared\.global[^;]*0x10", ptx)),
                       local=bool(re.search(r"\b(ld|st)\.local", ptx)), griddep="griddepcontrol.wait" in ptx,
                       mma=bool(re.search(r"\b(w?gmma|mma)\.", ptx)))
        except Exception as exc:  # noqa: BLE001 - reported per case
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[-800:]}")
        print(json.dumps(row), flush=True)


@pytest.mark.slow
def test_gemv_kernels_compile_for_sm90_with_the_device_triton():
    proc = device_triton.run_child([__file__, "compile"], 600, str(Path(__file__).parent))
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == len(COMPILE_CASES) + len(ODD_CASES), proc.stderr[-3000:]
    assert [r for r in rows if not r["ok"]] == []
    for r in rows:
        assert not r["local"], f"{r['id']}: spills to local memory"
        assert r["griddep"] == r["id"].endswith("_pdl"), r
        if r["odd"]:  # unaligned N, K: narrower loads (gv4_n32x256_w4_s3_mma spills 272 bytes there)
            continue
        assert r["spill_bytes"] == 0, f"{r['id']}: ptxas spills {r['spill_bytes']} bytes"
        assert r["wide_w"], f"{r['id']}: no 16-byte weight loads"
        assert r["cp_async"], f"{r['id']}: the K loop is not pipelined (16-byte cp.async)"
        assert not r["local"], f"{r['id']}: spills to local memory"
        assert r["griddep"] == r["id"].endswith("_pdl"), r
        assert r["mma"] == ("_mma" in r["id"]), f"{r['id']}: tensor cores used {r['mma']}"


if __name__ == "__main__":
    if sys.argv[1:] == ["compile"]:
        _compile_child(COMPILE_CASES, ODD_CASES)
    elif sys.argv[1:] == ["bench"]:
        _bench_child()
    else:
        _child()
