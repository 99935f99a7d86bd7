"""The triton_decode lane's GEMV kernel (`gv` configs, kernels_gemv.py): ids and THE validity
predicate's gemv rules (pure Python); the kernel under TRITON_INTERPRET=1 at small odd shapes
(the interpreter runs fp8 by upcasting, so fp8 is checked there too): fp8 per-tensor / row / block
scales against the fp32 product of the dequantized operands (the gate's 4x-rounding bound: the
interpreter truncates fp32 -> bf16), int8 bitwise equal to the CPU path for every split (int32
products summed exactly) on two calls (the counters the kernel leaves zero), the gate over a gv
config, and the launch refusing an M the predicate refuses; and every gv kernel shape compiled for
sm90 by the device's Triton 3.6 (16-byte weight loads, the FMA loop pipelined through cp.async,
no spills, griddepcontrol only in _pdl twins)."""
import json
import sys
from pathlib import Path

import pytest

import device_triton
import interpret_child

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.scaled_mm import configs, keys
from tunedb.families.scaled_mm.configs_gemv import gemv_grid, rows_padded
from tunedb.records import ArchProfile

SM90 = shipped_profile("sm90")
SM80 = ArchProfile("sm80", "A100", 108, 167936, 166912, 41943040, 65536, 1500.0, 300.0, 300.0,
                   2.0, 5.0, "shipped")
SHAPES = ((80, 520), (36, 200))  # N, K: K not a multiple of the K block, N not of BN
FMA_IDS = ("gv1_n8x256_w2_s3", "gv2_n4x128_w2_s3_pdl", "gv3_n16x128_w4_s2")
# one warp a 16-row slab; 32 rows on 4 warps; a 64-row warpgroup slab split 2 ways (N=36, 80: every
# slab wraps past N); 128 rows wider than N
MMA_IDS = ("gv1_n16x256_w1_s3_mma", "gv2_n32x128_w4_s3_mma_pdl", "gv2_n64x128_w4_s3_mma", "gv1_n128x128_w4_s2_mma")


def sig(n=4096, k=4096, scale="row", family="scaled_mm_fp8"):
    if family == "scaled_mm":
        return keys.make_signature(family, "scaled_mm", n, k, "bf16")
    return keys.make_signature(family, "scaled_mm", n, k, "bf16", scale)


def test_gemv_ids_round_trip_and_bad_values():
    cfg = configs.parse("gv2_n16x512_w4_s5_mma_pdl")
    assert cfg.lane == "triton_decode" and cfg.param("block") == (16, 16, 512)
    assert cfg.param("kernel") == "gemv" and cfg.param("dot") is True and cfg.param("pdl") is True
    assert cfg.param("split_k") == 2 and cfg.param("stages") == 5
    fma = configs.parse("gv1_n4x1024_w2_s3")
    assert fma.param("dot") is False and fma.param("pdl") is False
    for bad in ("gv1_n12x512_w4_s3", "gv17_n16x512_w4_s3", "gv1_n16x64_w4_s3", "gv1_n16x512_w4_s9",
                "gv1_n8x512_w4_s3_mma", "gv1_n16x512_w4_s3_pdl_mma", "gv01_n16x512_w4_s3", "gv1_n16x512_w16_s3"):
        with pytest.raises(ConfigError):
            configs.parse(bad)
    space = [c for c in configs.config_space("sm90") if c.id.startswith("gv")]
    assert len(space) == len(gemv_grid()) and all(configs.parse(c.id) == c for c in space)
    assert {c.param("dot") for c in space} == {False, True} and {c.param("pdl") for c in space} == {False, True}
    assert rows_padded(1, False) == 1 and rows_padded(3, False) == 4 and rows_padded(2, True) == 16


def test_gemv_predicate_rules():
    fma, mma = configs.parse("gv1_n16x512_w4_s3"), configs.parse("gv1_n16x512_w4_s3_mma")
    assert configs.invalid_reason(fma, sig(), 1, SM90) is None
    assert "M <= 4, not M=5" in configs.invalid_reason(fma, sig(), 5, SM90)
    assert configs.invalid_reason(mma, sig(), 16, SM90) is None
    assert "M <= 16, not M=17" in configs.invalid_reason(mma, sig(), 17, SM90)
    assert "not every M" in configs.invalid_reason(fma, sig(), None, SM90)
    # the FMA product tile: [MP, BN, BK] over 32 x warps threads, 128 registers at most
    assert configs.invalid_reason(fma, sig(), 2, SM90) is None  # 2 x 16 x 512 / 128 = 128
    assert "256 registers" in configs.invalid_reason(fma, sig(), 3, SM90)  # MP 4
    assert configs.invalid_reason(configs.parse("gv1_n4x512_w2_s3"), sig(), 4, SM90) is None
    assert "split_k=8 > 4 K tiles" in configs.invalid_reason(configs.parse("gv8_n16x128_w4_s3"), sig(k=500), 1, SM90)
    assert "BLOCK_K dividing 128" in configs.invalid_reason(fma, sig(scale="block"), 1, SM90)
    assert configs.invalid_reason(configs.parse("gv2_n16x128_w4_s3"), sig(scale="block"), 1, SM90) is None
    pdl = configs.parse("gv1_n16x512_w4_s3_pdl")
    assert "sm90+" in configs.invalid_reason(pdl, sig(family="scaled_mm"), 1, SM80)
    assert configs.invalid_reason(fma, sig(family="scaled_mm"), 1, SM80) is None


def test_pruning_model_costs_the_fma_path_on_cuda_cores():
    """The FMA path's estimate grows with M (per activation row and weight byte an FMA, x's
    conversion and the row sums: issue-bound at M=4), the tensor-core path's only by the M rows of
    x it reads; so at M=4 a build ranks a tensor-core gv config first among the gv ones, and at
    M=1 its top 6 still measures the FMA path at Llama's 4096 widths."""
    from tunedb.families.scaled_mm.pruning import PruningModel

    model = PruningModel(SM90)
    s = sig(4096, 14336)
    assert model.predict(s, 1, "gv1_n8x512_w4_s5") < 0.7 * model.predict(s, 4, "gv1_n8x512_w4_s5")
    mma = "gv4_n64x256_w4_s3_mma"
    t1, t4, t16 = (model.predict(s, m, mma) for m in (1, 4, 16))
    assert t1 < t4 < t16 < 1.1 * t1
    for n, k in ((4096, 4096), (4096, 14336), (14336, 4096)):
        cands = [c for c in configs.config_space("sm90") if c.id.startswith("gv")
                 and configs.invalid_reason(c, sig(n, k), 4, SM90) is None]
        assert configs.parse(model.rank(sig(n, k), 4, cands, 1)[0]).param("dot"), (n, k)
    for n, k in ((4096, 4096), (4096, 14336)):
        cands = [c for c in configs.config_space("sm90") if configs.invalid_reason(c, sig(n, k), 1, SM90) is None]
        top = model.rank(sig(n, k), 1, cands, 6)[:6]
        assert any(c.startswith("gv") and not configs.parse(c).param("dot") for c in top), top


def test_the_bench_arms_are_valid_where_it_runs_them():
    """bench/decode_gemv_fp8.py times every gv and pre-gv config it names at each width and M: a
    typo or a predicate change would drop an arm silently on the device, so check them here."""
    from bench_modules import bench_module

    bench = bench_module("decode_gemv_fp8")
    for n, k in bench.SHAPES:
        s = sig(n, k)
        for m in bench.MS:
            for quick in (False, True):
                ids = ("torch",) + bench.gv_ids(m, quick) + bench.CURRENT
                assert [(c, configs.invalid_reason(configs.parse(c), s, m, SM90)) for c in ids
                        if configs.invalid_reason(configs.parse(c), s, m, SM90)] == []
        assert any(not configs.parse(c).param("dot") for c in bench.gv_ids(1, True))  # the FMA path
        assert any(not configs.parse(c).param("dot") for c in bench.gv_ids(4, True))
    assert bench.summarize([{"N": 4096, "K": 4096, "MB": 16.8, "read_share": 0.6, "M": {"1": {
        "best_gv": "g", "best_current": "d", "arms": {"g": {"us": 5.0, "x_torch": 2.0, "share": 0.8},
                                                     "d": {"us": 9.0, "x_torch": 1.0, "share": 0.4}}}}}]) == {
        "goal": {"share_at_16MB_plus": 0.8, "x_torch_geomean": 1.2},
        "best_gv": {"points": 1, "x_torch_geomean": 2.0, "x_torch_min": 2.0, "share_min_16MB_plus": 0.8},
        "best_current": {"points": 1, "x_torch_geomean": 1.0, "x_torch_min": 1.0, "share_min_16MB_plus": 0.4},
        "read_share_min_16MB_plus": 0.6}
    # --xm: the probe's best gets its own line where it ran
    got = bench.summarize([{"N": 4096, "K": 4096, "MB": 16.8, "read_share": 0.6, "M": {"1": {
        "best_gv": "g", "best_current": None, "best_xm": "x", "arms": {"g": {"us": 5.0, "x_torch": 2.0, "share": 0.8},
                                                                   "x": {"us": 4.0, "x_torch": 2.5, "share": 0.9}}}}}])
    assert got["best_xm"] == {"points": 1, "x_torch_geomean": 2.5, "x_torch_min": 2.5, "share_min_16MB_plus": 0.9}


def _child() -> None:
    import torch

    from tunedb import families
    from tunedb.families.scaled_mm import ops  # noqa: F401 -- the CPU path to compare with

    failures = []
    int8, fp8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")
    for n, k in SHAPES:
        # MP 1 and 4 of the FMA path; 8 and 16 the tensor-core path only (M = 4 and 8 at one
        # shape: the interpreter's time)
        for m in (1, 3, 4, 8, 16) if (n, k) == SHAPES[0] else (1, 3, 16):
            ids = [c for c in FMA_IDS + MMA_IDS if configs.invalid_reason(configs.parse(c), sig(n, k), m, SM90) is None]
            if (FMA_IDS[0] in ids) != (m <= 4) or any(c not in ids for c in MMA_IDS):
                failures.append(f"M={m}: valid gv ids {ids}")
            for scale in ("tensor", "row", "block") if m in (1, 3, 16) else ("row", "block"):
                s = fp8.make_signature("scaled_mm", n, k, "bf16", scale)
                args, _ = fp8.make_inputs(s, m, "cpu", seed=m + k)
                ref = fp8.reference(s, *args)
                bound = 4 * 2 ** -7 * ref.abs().max()
                for cid in ids:
                    cfg = configs.parse(cid)
                    if configs.invalid_reason(cfg, s, m, SM90):
                        continue
                    got = fp8.launch(cfg, s, *args).float()
                    if not torch.isfinite(got).all() or (got - ref).abs().max() > bound:
                        failures.append(f"fp8 {scale} {cid} N={n} K={k} M={m}: error "
                                        f"{(got - ref).abs().max().item():.3g} > {bound.item():.3g}")
            s = int8.make_signature("scaled_mm", n, k, "fp16")
            args, _ = int8.make_inputs(s, m, "cpu", seed=m + n)
            want = ops._cpu(s, *args)
            for cid in ids:
                for call in range(2):  # the second call finds the split counters reset
                    if not torch.equal(int8.launch(configs.parse(cid), s, *args), want):
                        failures.append(f"int8 {cid} N={n} K={k} M={m} call {call}: not bitwise")
    bad = fp8.make_signature("scaled_mm", 80, 520, "bf16", "row")
    try:
        fp8.launch(configs.parse(FMA_IDS[0]), bad, *fp8.make_inputs(bad, 5, "cpu", seed=0)[0])
        failures.append("the FMA path launched at M=5")
    except ValueError as exc:
        if "M <= 4" not in str(exc):
            failures.append(f"the FMA path at M=5: unclear error {exc}")
    bad = interpret_child.gate_failures(fp8, fp8.make_signature("scaled_mm", 80, 520, "bf16", "row"), 3,
                                        ["heuristic", FMA_IDS[1], MMA_IDS[1]])
    if bad:
        failures.append(f"the gate failed {bad}")
    interpret_child.report(failures)


@pytest.mark.slow
def test_gemv_kernel_under_interpreter():
    assert interpret_child.failures(__file__) == []


COMPILE_CASES = [  # (config, M, operand, scale): each kernel shape of the gv space once
    ("gv1_n16x512_w4_s3", 1, "fp8", "row"), ("gv1_n16x1024_w8_s5_pdl", 1, "fp8", "row"),
    ("gv4_n8x256_w2_s5", 2, "fp8", "tensor"), ("gv2_n4x512_w2_s3_pdl", 4, "fp8", "row"),
    ("gv8_n32x512_w8_s3", 1, "fp8", "row"), ("gv1_n4x1024_w2_s5", 1, "int8", "row"),
    ("gv2_n16x256_w1_s3_mma", 16, "fp8", "row"), ("gv8_n32x512_w2_s5_mma_pdl", 9, "fp8", "row"),
    ("gv4_n16x512_w1_s3_mma", 16, "int8", "row"), ("gv2_n16x128_w1_s3_mma_pdl", 16, "fp8", "block"),
    ("gv2_n32x256_w4_s5_mma", 4, "fp8", "row"), ("gv4_n64x256_w4_s3_mma", 8, "fp8", "row"),
    ("gv1_n64x128_w4_s5_mma_pdl", 16, "int8", "row"), ("gv8_n128x128_w4_s5_mma", 1, "fp8", "tensor"),
    ("gv2_n64x128_w4_s5_mma", 16, "fp8", "block"),
]
# the tensor-core path's K loop, instructions per weight byte a thread streams (Triton 3.6 sm90
# PTX): 0.9-1.2 for a wgmma slab (2.1 with block scales), 1.9-3.3 for mma.sync; the x @ w^T
# orientation before session 16 ran 4.9 at 16 x 512 on 4 warps (duplicated warps); ~8 a byte is
# all 132 SMs issue at 4.3 TB/s
MMA_LOOP_PER_BYTE = 3.5


def _compile_child(cases) -> None:
    """Compile each case for sm90 (no GPU: triton.compile) and print one JSON line per case."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tunedb.families.scaled_mm.kernels_gemv import scaled_mm_gemv_kernel

    for cid, m, dt, scale in cases:
        cfg = configs.parse(cid)
        _, bn, bk = cfg.param("block")
        dot = bool(cfg.param("dot"))
        op = "*fp8e4nv" if dt == "fp8" else "*i8"
        signature = {"x_ptr": op, "w_ptr": op, "y_ptr": "*bf16", "sx_ptr": "*fp32", "sw_ptr": "*fp32",
                     "ws_ptr": "*i32" if dt == "int8" else "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
                     "K": "i32"}
        cx = dict(SCALE={"tensor": 0, "row": 1, "block": 2}[scale], INT=dt == "int8", BN=bn, BK=bk,
                  SPLIT=cfg.param("split_k"), MP=rows_padded(m, dot), DOT=dot, PDL=bool(cfg.param("pdl")),
                  STAGES=cfg.param("stages"))
        signature.update(dict.fromkeys(cx, "constexpr"))
        # the launch specializes 16-divisible pointers, N and K (the Llama widths): so does this
        attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)}
        row = {"id": cid, "m": m, "dt": dt, "scale": scale}
        try:
            kern = triton.compile(ASTSource(fn=scaled_mm_gemv_kernel, signature=signature, constexprs=cx, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=cfg.param("warps"), num_stages=cfg.param("stages")))
            ptx = kern.asm["ptx"]
            # the first W tile by a 16-byte evict-first load, the loop's by 16-byte cp.async copies
            threads = 32 * cfg.param("warps")
            row.update(mma="wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else None,
                       loop_per_byte=_loop_instructions(ptx) * threads / (bn * bk))
            row.update(ok=True, wide_w=bool(re.search(r"ld\.global\.L1::evict_first\S*\.v4", ptx)),
                       cp_async=bool(re.search(r"cp\.async\.cg\.shared\.global[^;]*0x10", ptx)), local=bool(re.search(r"\b(ld|st)\.local", ptx)),
                       griddep="griddepcontrol.wait" in ptx)
        except Exception as exc:  # noqa: BLE001 - reported per case
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[-800:]}")
        print(json.dumps(row), flush=True)


def _loop_instructions(ptx: str) -> int:
    """Instructions in the kernel's K loop: the longest block that branches back to its label."""
    import re

    lines, starts, best = ptx.splitlines(), {}, 0
    for i, ln in enumerate(lines):
        if (lab := re.match(r"^(\$L__BB\d+_\d+):", ln)):
            starts[lab.group(1)] = i
        back = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln)
        if back and starts.get(back.group(1), i) < i:
            body = lines[starts[back.group(1)]:i + 1]
            best = max(best, sum(1 for b in body if re.match(r"\s+(@!?%p\d+\s+)?[a-z]", b)))
    return best


@pytest.mark.slow
def test_gemv_kernels_compile_for_sm90_with_the_device_triton():
    proc = device_triton.run_child([__file__, "compile"], 600, str(Path(__file__).parent))
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == len(COMPILE_CASES), proc.stderr[-3000:]
    assert [r for r in rows if not r["ok"]] == []
    for r in rows:
        assert r["wide_w"], f"{r['id']}: no 16-byte weight loads"
        assert r["cp_async"], f"{r['id']}: the K loop is not pipelined (16-byte cp.async)"
        assert not r["local"], f"{r['id']}: spills to local memory"
        assert r["griddep"] == r["id"].endswith("_pdl"), r
        if "_mma" in r["id"]:
            _, bn, _ = configs.parse(r["id"]).param("block")
            warps = configs.parse(r["id"]).param("warps")
            # 64+ weight rows on one warpgroup: wgmma (the weight read by the tensor cores from
            # shared memory); narrower slabs mma.sync
            assert r["mma"] == ("wgmma" if bn >= 64 and warps == 4 else "mma.sync"), r
            assert 0 < r["loop_per_byte"] <= MMA_LOOP_PER_BYTE, r


if __name__ == "__main__":
    if sys.argv[1:] == ["compile"]:
        _compile_child(COMPILE_CASES)
    else:
        _child()
