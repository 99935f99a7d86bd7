"""The linear_rows row pass and the rowfix kernels with the divisibility hint (VEC) the
row pass under PDL (`lr_..._pdl`) and persistent (`lr_..._p{P}`): ids and the predicate, launch.row_vec's rule, the kernels
under the interpreter against a float64 reference at vocabularies that are multiples of 8 but
not 16 (where the hint matters on the GPU), and the sm90 PTX of the device's Triton (16-byte
loads and stores at N=5000 with the hint, 2-byte ones without)."""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import device_triton  # noqa: E402
import interpret_child  # noqa: E402

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import FAMILY, configs
from tunedb.families.gemm_log_softmax.launch import row_vec

SM90 = shipped_profile("sm90")


def test_pdl_row_ids_round_trip_and_the_predicate():
    cfg = configs.parse("lr_r1_c8192_w8_pdl")
    assert cfg.lane == "linear_rows" and cfg.param("launch") == "pdl" and cfg.param("chunk") == 8192
    assert configs.parse("lr_r1_c8192_w8").param("launch") is None  # plain ids keep their params
    assert configs.make_rows(1, 8192, 8, pdl=True) == cfg
    with pytest.raises(ConfigError):
        configs.parse("lr_r1_c8192_w8_pdl2")
    space = {c.id for c in FAMILY.config_space("sm90")}
    assert {"lr_r1_c2048_w8_pdl", "lr_r1_c16384_w16_pdl"} <= space
    sig = FAMILY.make_signature(5000, 256, "bf16", 1)
    assert FAMILY.invalid_reason(cfg, sig, 64, SM90) is None
    sm80 = dataclasses.replace(SM90, arch_family="sm80")
    assert "sm90 or newer" in FAMILY.invalid_reason(cfg, sig, 64, sm80)
    assert FAMILY.invalid_reason(configs.parse("lr_r1_c8192_w8"), sig, 64, sm80) is None
    # the row rules still apply to the twin
    assert "exceeds N" in FAMILY.invalid_reason(configs.parse("lr_r1_c16384_w16_pdl"), sig, 64, SM90)


def test_persistent_row_ids_and_their_rules():
    cfg = configs.parse("lr_r1_c8192_w8_p4")
    assert cfg.param("persist") == 4 and cfg.param("launch") is None
    assert configs.parse("lr_r1_c8192_w8_p4_pdl").param("launch") == "pdl"
    with pytest.raises(ConfigError):
        configs.parse("lr_r1_c8192_w8_p3")
    with pytest.raises(ConfigError):
        configs.parse("lr_r1_c8192_w8_pdl_p4")  # one canonical order
    space = {c.id for c in FAMILY.config_space("sm90")}
    assert {"lr_r1_c8192_w8_p4", "lr_r1_c32768_w16_p1"} <= space
    s5, s32 = FAMILY.make_signature(5000, 256, "bf16", 1), FAMILY.make_signature(32000, 512, "bf16", 1)
    assert FAMILY.invalid_reason(cfg, s5, 8192, SM90) is None
    # whole rows only: 8192 columns do not hold a 32k row (the plain config's chunks do)
    assert "whole rows" in FAMILY.invalid_reason(cfg, s32, 8192, SM90)
    assert FAMILY.invalid_reason(configs.parse("lr_r1_c8192_w8"), s32, 8192, SM90) is None
    # the prefetched block beside the fp32 one: 128 values a thread is too many
    assert "persistent" in FAMILY.invalid_reason(configs.parse("lr_r1_c32768_w8_p1"), s32, 8192, SM90)
    assert FAMILY.invalid_reason(configs.parse("lr_r1_c32768_w8"), s32, 8192, SM90) is None


def test_row_vec_is_the_widest_divisor_of_n_strides_and_alignment():
    a = torch.empty(4, 5000, dtype=torch.bfloat16)
    assert row_vec(5000, a) == 8
    assert row_vec(5000, a, torch.empty(4, 5000, dtype=torch.bfloat16)) == 8
    assert row_vec(5004, torch.empty(4, 5004, dtype=torch.bfloat16)) == 4
    assert row_vec(37, torch.empty(4, 37, dtype=torch.bfloat16)) == 1
    wide = torch.empty(4, 5002, dtype=torch.bfloat16)
    assert row_vec(5000, wide[:, :5000]) == 2  # the row stride (5002) divides by 2 only
    off = torch.empty(4 * 5000 + 1, dtype=torch.bfloat16)[1:].view(4, 5000)
    assert row_vec(5000, off) == 1  # a pointer one element off any 4-byte boundary


_INTERPRET = r"""
import torch
from tunedb.families.gemm_log_softmax import FAMILY, configs
from tunedb.families.gemm_log_softmax.launch import launch, make_inputs, rows_pass, row_vec
from tunedb.families.gemm_log_softmax.launch_rowfix import rowfix_arm
gen = torch.Generator().manual_seed(3)
# the row pass alone over rounded logits: one read (C >= N) and chunked, R rows over a ragged M,
# vec 8 / 4 / 1 (forced 1: the kernel as before the hint), plain and pdl (no gdc under the
# interpreter), into a NaN-poisoned output and in place; against float64 log_softmax of the
# same rounded logits, within the output's rounding + fp32 noise: half an fp16 ulp of |y|; for
# bf16 one ulp (the interpreter's fp32 -> bf16 cast truncates; the GPU test asserts half an ulp)
for dt in (torch.bfloat16, torch.float16):
    u = 2.0 ** -7 if dt == torch.bfloat16 else 2.0 ** -11
    for n, m in ((40, 5), (2504, 7), (1100, 3), (37, 6)):
        lg = (torch.randn(m, n, generator=gen) * 3).to(dt)
        ref = torch.log_softmax(lg.double(), dim=-1)
        for r, c, w in ((1, 1024, 4), (2, 4096, 4), (4, 2048, 4), (1, 4096, 8)):
            for vec in (None, 1):
                for pdl in (False, True):
                    y = torch.full((m, n), float("nan"), dtype=dt)
                    rows_pass(lg, y, r, c, w, pdl=pdl, vec=vec)
                    err = (y.double() - ref).abs()
                    tol = u * ref.abs() + 1e-5
                    assert not torch.isnan(y).any() and (err <= tol).all(), (dt, n, m, r, c, vec, pdl, err.max().item())
                    z = lg.clone()
                    rows_pass(z, z, r, c, w, pdl=pdl, vec=vec)
                    assert torch.equal(z, y), (dt, n, m, r, c, vec, pdl)
    assert row_vec(40, lg) in (1, 8)
# the persistent pass: P x 2 programs (the interpreter's 2 SMs) walking 1 to 7 blocks each with
# the next block prefetched, ragged last blocks, in place (a block is stored only after it was read)
for dt in (torch.bfloat16, torch.float16):
    u = 2.0 ** -7 if dt == torch.bfloat16 else 2.0 ** -11
    for n, m in ((40, 29), (1000, 9), (37, 3)):
        lg = (torch.randn(m, n, generator=gen) * 3).to(dt)
        ref = torch.log_softmax(lg.double(), dim=-1)
        for r, c, w, p in ((1, 1024, 4, 1), (4, 1024, 8, 2), (2, 1024, 4, 4)):
            for vec in (None, 1):
                y = torch.full((m, n), float("nan"), dtype=dt)
                rows_pass(lg, y, r, c, w, vec=vec, persist=p, pdl=p == 2)
                err = (y.double() - ref).abs()
                assert not torch.isnan(y).any() and (err <= u * ref.abs() + 1e-5).all(), (dt, n, m, r, p, vec)
                z = lg.clone()
                rows_pass(z, z, r, c, w, vec=vec, persist=p)
                assert torch.equal(z, y), (dt, n, m, r, p, vec)
# the whole linear_rows arm (pdl twin included) and the rowfix lane with the hint against the
# float64 product's log_softmax (fp16: the interpreter's tl.dot mishandles bf16), within 4x
# the torch arm's own error; N = 40 / 200 are multiples of 8, not 16 (vec 8)
for n, k, m, bias in ((40, 32, 9, 1), (200, 40, 37, 0)):
    sig = FAMILY.make_signature(n, k, "fp16", bias)
    args, _ = make_inputs(sig, m, "cpu", 5)
    x, w, b = args
    ref = torch.log_softmax(torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double()), -1)
    rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
    base = rel(launch(configs.parse("torch"), sig, *args))
    for cid in ("lr_r1_c1024_w4_pdl", "lr_r1_c2048_w8_pdl", "lr_r2_c4096_w4", "lr_r1_c1024_w4_p2", "lr_r4_c1024_w8_p1_pdl"):
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        y = launch(configs.parse(cid), sig, *args, out=out)
        assert y is out and not torch.isnan(y).any() and rel(y) <= 4 * base + 1e-6, (cid, n, rel(y), base)
    for cid in ("rf_b16x32x32_w4_s2_pdl", "rf_b64x64x64_w4_s3_two"):
        cfg = configs.parse(cid)
        for vec in (None, 1):
            out = torch.full((m, n), float("nan"), dtype=torch.float16)
            y = rowfix_arm(cfg, *args, out=out, vec=vec)
            assert not torch.isnan(y).any() and rel(y) <= 4 * base + 1e-6, (cid, vec, n, rel(y), base)
from interpret_child import gate_failures
bad = gate_failures(FAMILY, FAMILY.make_signature(40, 32, "fp16", 1), 11, ["torch", "lr_r1_c1024_w4_pdl", "lr_r1_c2048_w8_pdl", "lr_r1_c1024_w4_p2"])
assert not bad, bad
print("ok")
"""


@pytest.mark.slow
def test_row_pass_and_rowfix_with_the_hint_under_the_interpreter():
    res = interpret_child.snippet(_INTERPRET)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


_PTX = r"""
import json, re
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from tunedb.families.gemm_log_softmax import kernels, kernels_rowfix as kr
# pointers 16-byte aligned (what the runtime specialises), N and strides NOT (5000 % 16 = 8)
ptr16 = [["tt.divisibility", 16]]
def widths(fn, sig, const, ptrs, warps):
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs={(i,): ptr16 for i in ptrs})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps)).asm["ptx"]
    return sorted(set(re.findall(r"(?:ld|st)\.global[.\w]*", ptx))), "griddepcontrol.wait" in ptx
rows = {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "stride_xm": "i32", "stride_ym": "i32",
        "R": "constexpr", "C": "constexpr", "ONE": "constexpr", "VEC": "constexpr", "GDC": "constexpr"}
fix = {"y_ptr": "*bf16", "pmax_ptr": "*fp32", "psum_ptr": "*fp32", "M": "i32", "N": "i32", "T": "i32",
       "stride_ym": "i32", "FN": "constexpr", "TB": "constexpr", "GDC": "constexpr", "VEC": "constexpr"}
out = {}
for vec in (1, 8):
    for one, c in ((True, 8192), (False, 2048)):
        out[f"rows vec{vec} one{int(one)}"] = widths(kernels._rows_kernel, rows, dict(R=1, C=c, ONE=one, VEC=vec, GDC=True), (0, 1), 8)
    out[f"fix vec{vec}"] = widths(kr._fix_kernel, fix, dict(FN=2048, TB=64, GDC=True, VEC=vec), (0, 1, 2), 4)
    tiles = {"x_ptr": "*bf16", "w_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16", "pmax_ptr": "*fp32",
             "psum_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "T": "i32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_ym": "i32", "HAS_BIAS": "constexpr", "BM": "constexpr", "BN": "constexpr",
             "BK": "constexpr", "GDC": "constexpr", "VEC": "constexpr"}
    ops, _ = widths(kr._tiles_kernel, tiles, dict(HAS_BIAS=True, BM=64, BN=128, BK=64, GDC=True, VEC=vec),
                    (0, 1, 2, 3, 4, 5, 8, 10, 11), 4)  # K = strides = 256: specialised as the runtime does
    out[f"tiles vec{vec}"] = ([o for o in ops if o.startswith("st.global")], True)  # the logits' stores
    stream = {k: v for k, v in rows.items() if k != "ONE"}
    out[f"stream vec{vec}"] = widths(kernels._rows_stream_kernel, stream, dict(R=1, C=8192, VEC=vec, GDC=True), (0, 1), 8)
print("PTX " + json.dumps(out))
"""


@pytest.mark.slow
def test_the_hint_vectorises_n5000_rows_on_sm90_with_the_device_triton():
    import json

    proc = device_triton.run_child(["-c", _PTX], 600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PTX ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][4:])
    for name, (ops, waits) in got.items():
        assert waits, name  # GDC=True: the wait on the GEMM is in the code
        if name.startswith("tiles"):
            assert ("st.global.v4.b32" in ops) == (name == "tiles vec8") and ("st.global.b16" in ops) == (name == "tiles vec1"), (name, ops)
        elif "vec8" in name:
            assert any(o.startswith("ld.global") and o.endswith("v4.b32") for o in ops), (name, ops)
            assert "st.global.v4.b32" in ops, (name, ops)
            assert not any(o.endswith(".b16") for o in ops), (name, ops)
        elif name.startswith(("rows", "stream")):  # the kernels without the hint: 2-byte accesses at N=5000
            assert "ld.global.b16" in ops and "st.global.b16" in ops, (name, ops)
