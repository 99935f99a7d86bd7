"""The triton_decode lane's prefetch twins (`dk..._pf{P}[_pdl]`, kernels_decode_pf.py): ids and the
validity predicate (pure Python), the launch (which kernel, constexprs, PDL and prefetch off under
the interpreter), and under the Triton interpreter: the kernel at M = 1..16 on odd N and K against an
fp32 reference (both reductions, bias, activations), the deterministic reduction's bitwise
repeatability, and the prefetch's addresses (every line of each CTA's first P tiles asked for, none
outside W or the CTA's rows).

TRITON_INTERPRET must be set before any kernel is defined, so the kernel checks run in a child
process (this file run as a script). fp16: the interpreter's tl.dot mishandles bf16 on CPU.
"""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.errors import ConfigError
from tunedb.families.gemm import FAMILY, configs_decode

from decode_interp_checks import arches, sig  # noqa: E402

SM90, SM80 = arches()


def test_pf_ids_round_trip_and_leave_other_configs_unchanged():
    cfg = FAMILY.parse_config("dk8_n32x256_w4_s2_at_pf2_pdl")
    assert cfg.to_json() == {"lane": "triton_decode", "block": [16, 32, 256], "warps": 4, "stages": 2, "group_m": 1,
                             "split_k": 8, "atomic": True, "pdl": True, "pf": 2}
    assert configs_decode.make(32, 256, 4, 2, 8, atomic=True, pdl=True, pf=2) == cfg
    assert "pf" not in FAMILY.parse_config("dk8_n32x256_w4_s2_at_pdl").to_json()  # shipped ids keep their params
    assert configs_decode.pdl_twin(FAMILY.parse_config("dk4_n64x256_w4_s2_pf4")).id == "dk4_n64x256_w4_s2_pf4_pdl"
    pfn = FAMILY.parse_config("dk2_n64x256_w4_s2_pfn8_pdl")
    assert pfn.param("pf") == 8 and pfn.param("pf_normal") is True and "pf_normal" not in cfg.to_json()
    assert configs_decode.make(64, 256, 4, 2, 2, pdl=True, pf=8, pf_normal=True) == pfn
    with pytest.raises(ConfigError, match="need P >= 1"):
        configs_decode.make(64, 256, 4, 2, 2, pf_normal=True)
    late = FAMILY.parse_config("dk2_n64x256_w4_s2_pfnw8_pdl")
    assert (late.param("pf"), late.param("pf_normal"), late.param("pf_late")) == (8, True, True)
    with pytest.raises(ConfigError, match="_pfw .* needs _pdl"):
        FAMILY.parse_config("dk2_n64x256_w4_s2_pfw8")
    for bad, why in (("dk4_n32x256_w4_s2_pf3", "prefetch tiles P"), ("dk4_n32x256_w4_s2_pfn0", "need P >= 1"),
                     ("dk4_n32x256_w4_s2_pf0", "not canonical"), ("dk4_n32x256_w4_s2_pf02", "not canonical"),
                     ("dk4_n32x256_w4_s2_pdl_pf2", "bad triton_decode config id"),
                     ("dk4_n32x256_w4_s2_pf2_at", "bad triton_decode config id"),
                     ("dk4_n32x256_w4_s2_pfwn2_pdl", "bad triton_decode config id")):
        with pytest.raises(ConfigError, match=why):
            FAMILY.parse_config(bad)


def test_pf_predicate_pdl_needs_sm90_and_gdc(monkeypatch):
    pf, pf_pdl = FAMILY.parse_config("dk4_n32x256_w4_s2_pf4"), FAMILY.parse_config("dk4_n32x256_w4_s2_pf4_pdl")
    assert FAMILY.invalid_reason(pf, sig(), 1, SM80) is None  # the prefetch alone: sm80's PTX has it
    assert "sm90 or newer" in FAMILY.invalid_reason(pf_pdl, sig(), 1, SM80)
    assert configs_decode.arch_reason(pf, 75).startswith("L2 prefetch with an eviction priority")
    monkeypatch.setattr(configs_decode, "pdl_supported", lambda: False)
    assert "gdc_wait / launch_pdl" in FAMILY.invalid_reason(pf_pdl, sig(), 1, SM90)
    assert FAMILY.invalid_reason(pf, sig(), 1, SM90) is None
    assert "M <= 16, not M=17" in FAMILY.invalid_reason(pf, sig(), 17, SM90)
    assert "split_k=16 exceeds the 1 K tiles" in FAMILY.invalid_reason(
        FAMILY.parse_config("dk16_n32x256_w4_s2_pf1"), sig(80, 136), 1, SM90)


def test_pf_grid_is_valid_on_the_llama_weights_and_stays_out_of_the_build_space():
    grid = configs_decode.pf_grid()
    assert len({c.id for c in grid}) == len(grid) == 8 and all(c.param("pf") for c in grid)
    space = {c.id for c in FAMILY.config_space("sm90")}
    for cfg in grid:
        assert cfg.id not in space and configs_decode.pdl_twin(cfg).id not in space
        for n, k in ((6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)):
            for m in (1, 16):
                assert FAMILY.invalid_reason(configs_decode.pdl_twin(cfg), sig(n, k), m, SM90) is None, cfg.id


def test_pf_launch_spec():
    pytest.importorskip("triton")
    from tunedb.families.gemm import kernels_decode, kernels_decode_pf

    sp = kernels_decode.spec(configs_decode.parse("dk2_n64x256_w4_s2_pf8_pdl"))
    assert isinstance(sp, kernels_decode_pf.PrefetchSpec) and sp.kernel is kernels_decode_pf.decode_pf_kernel
    cx = dict(sp.constexprs)
    assert (cx["PF"], cx["CH"], cx["SPLIT"], cx["LAST"], cx["PDL"]) == (8, 1024, 2, True, True)  # 64 x 32 lines: 2 steps
    assert cx["EARLY"] is True
    assert dict(kernels_decode.spec(configs_decode.parse("dk2_n64x256_w4_s2_pfn8_pdl")).constexprs)["LAST"] is False
    assert dict(kernels_decode.spec(configs_decode.parse("dk2_n64x256_w4_s2_pfw8_pdl")).constexprs)["EARLY"] is False
    assert sp.kwargs()["launch_pdl"] is True and sp.kwargs()["PF"] == 8
    assert sp.kwargs(interpret=True)["PF"] == 0 and sp.kwargs(interpret=True)["PDL"] is False
    assert "launch_pdl" not in sp.kwargs(interpret=True)
    assert dict(kernels_decode.spec(configs_decode.parse("dk16_n32x256_w4_s2_pf1")).constexprs)["CH"] == 128
    assert kernels_decode.grid_of(sp, 4100, 4096)(1, 132) == (65, 2)
    assert kernels_decode.workspace_sizes(sp, 4100, 4096) == (65 * 2 * 16 * 64, 65)
    assert kernels_decode.spec(configs_decode.parse("dk2_n64x256_w4_s2")).kernel is kernels_decode.decode_kernel


# (config id, op, N, K, act, bias, Ms): odd N and K not a multiple of BK
CASES = [
    ("dk1_n32x64_w4_s2_pf2", "gemm", 80, 136, "none", False, tuple(range(1, 17))),
    ("dk3_n16x64_w4_s2_pf1", "gemm_act", 80, 136 + 64 * 4, "silu", True, (1, 5, 16)),
    ("dk2_n16x64_w4_s3_at_pfw4_pdl", "gemm_act", 48, 200, "gelu", True, (1, 9, 16)),
    ("dk4_n32x64_w2_s2_pfn2_pdl", "gemm_act", 37, 300, "relu", True, (3, 16)),
]


def _lines_kernel():
    """A kernel storing slab_lines' offsets and flags per CTA (module level: the interpreter runs
    a kernel against its module's globals)."""
    global pf, tl
    import triton
    import triton.language as tl

    from tunedb.families.gemm import kernels_decode_pf as pf

    @triton.jit
    def lines_kernel(out_ptr, on_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                     PF: tl.constexpr, CH: tl.constexpr):
        pid_n, split = tl.program_id(0), tl.program_id(1)
        k_tiles = tl.cdiv(K, BK)
        kt_lo, kt_hi = split * k_tiles // SPLIT, (split + 1) * k_tiles // SPLIT
        LINES: tl.constexpr = PF * BK // 64
        base = (pid_n * SPLIT + split) * (BN * LINES)
        for c in range(0, BN * LINES, CH):
            offs, on = pf.slab_lines(pid_n, N, K, kt_lo, kt_hi, c, BN, BK, PF, CH)
            tl.store(out_ptr + base + c + tl.arange(0, CH), offs)
            tl.store(on_ptr + base + c + tl.arange(0, CH), on.to(tl.int32))

    return lines_kernel


def _slab_failures() -> list:
    """slab_lines under the interpreter: each CTA's fetched lines cover its rows' first P tiles."""
    import torch

    from tunedb.families.gemm import kernels_decode_pf as pf

    lines_kernel = _lines_kernel()
    failures = []
    for n, k, bn, bk, split, p in ((80, 1024, 32, 128, 2, 2), (37, 4096, 16, 256, 4, 8), (48, 640, 16, 64, 3, 1),
                                   (40, 100, 16, 64, 1, 2)):
        lines = p * bk // 64
        blocks = -(-n // bn)
        ch = pf.chunk(bn, bk, p)
        out = torch.full((blocks * split * bn * lines,), -1, dtype=torch.int64)
        on = torch.zeros_like(out, dtype=torch.int32)
        lines_kernel[(blocks, split)](out, on, n, k, BN=bn, BK=bk, SPLIT=split, PF=p, CH=ch)
        out, on = out.view(blocks, split, bn * lines), on.view(blocks, split, bn * lines).bool()
        k_tiles = -(-k // bk)
        for b in range(blocks):
            for s in range(split):
                lo, hi = s * k_tiles // split, (s + 1) * k_tiles // split
                c0, c1 = lo * bk, min(min(lo + p, hi) * bk, k)
                rows = {(b * bn + i) % n for i in range(bn)}
                got = out[b, s][on[b, s]].tolist()
                want = {((r * k + c) // 64) for r in rows for c in range(c0, c1)}  # every 64-element line
                if any(o < 0 or o >= n * k for o in out[b, s].tolist()):
                    failures.append(f"slab {n}x{k} bn{bn} bk{bk} p{p} CTA ({b},{s}): an address outside W")
                if any(not any(r * k + c0 - 63 <= o < r * k + c1 for r in rows) for o in got):
                    failures.append(f"slab {n}x{k} bn{bn} bk{bk} p{p} CTA ({b},{s}): a line outside its slab")
                missed = want - {o // 64 for o in got}
                if k % 64 == 0 and missed:  # aligned rows: every line; ragged rows may leave one each
                    failures.append(f"slab {n}x{k} bn{bn} bk{bk} p{p} CTA ({b},{s}): {len(missed)} lines not asked for")
                if len(missed) > len(rows):
                    failures.append(f"slab {n}x{k} CTA ({b},{s}): {len(missed)} lines missed (> one per row)")
    return failures


def _child() -> None:
    from decode_interp_checks import decode_failures

    got = decode_failures(CASES, det_k=64 * 7 + 5, det_cids=("dk3_n16x64_w4_s2_pf2", "dk3_n16x64_w4_s2_pf2_pdl"))
    interpret_child.report(got + _slab_failures())


def test_pf_kernel_and_its_prefetch_addresses_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=600, TRITON_DEFAULT_FP_FUSION="1") == []


if __name__ == "__main__":
    _child()


_PTX = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tunedb.families.gemm import configs_decode, kernels_decode

sp = kernels_decode.spec(configs_decode.parse(sys.argv[1]))
kw = sp.kwargs()
opts = {"num_warps": kw.pop("num_warps"), "num_stages": kw.pop("num_stages")}
kw.pop("launch_pdl", None)
sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "b_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
       "M": "i32", "N": "i32", "K": "i32", "HAS_BIAS": "i32", "ACT": "i32", **{k: "constexpr" for k in kw}}
names = list(sig)
src = ASTSource(fn=sp.kernel, signature=sig, constexprs={(names.index(k),): v for k, v in kw.items()},
                attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 7, 8)})
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
at = lambda pat: [m.start() for m in re.finditer(pat, ptx)]
print(json.dumps({"launch": at(r"griddepcontrol\.launch_dependents"), "wait": at(r"griddepcontrol\.wait"),
                  "prefetch": at(r"prefetch\.global\.L2(::evict_last)? "),
                  "last": at(r"prefetch\.global\.L2::evict_last"), "w_loads": at(r"cp\.async|ld\.global")}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("cid", ["dk8_n32x256_w4_s2_pf2_pdl", "dk4_n32x256_w4_s2_pf4", "dk2_n64x256_w4_s2_pfn8_pdl",
                                 "dk2_n64x256_w4_s2_pfw8_pdl"])
def test_sm90_ptx_prefetches_before_the_wait_and_launches_dependents_first(cid):
    """Compiled for sm90 (no GPU): the inline prefetch survives, and under PDL the order is
    launch_dependents, the prefetches, the wait, then every global load (`_pfw`: the prefetches,
    the wait, launch_dependents, the loads)."""
    import os
    import subprocess

    pytest.importorskip("triton")
    from tunedb.families.gemm import prebuild

    if prebuild.ptxas_problem(90):
        pytest.skip(prebuild.ptxas_problem(90))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _PTX, cid], capture_output=True, text=True, timeout=300,
                         env=dict(env, PYTHONPATH=os.pathsep.join(sys.path)))
    assert res.returncode == 0, res.stderr[-3000:]
    at = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert at["prefetch"] and at["w_loads"]
    assert len(at["last"]) == (0 if "_pfn" in cid else len(at["prefetch"]))
    if "_pfw" in cid:  # dependents launched right after the wait, still before any load
        assert len(at["launch"]) == len(at["wait"]) == 1
        assert max(at["prefetch"]) < at["wait"][0] < at["launch"][0] < min(at["w_loads"])
    elif cid.endswith("_pdl"):
        assert len(at["launch"]) == len(at["wait"]) == 1
        assert at["launch"][0] < min(at["prefetch"]) and max(at["prefetch"]) < at["wait"][0] < min(at["w_loads"])
    else:
        assert not at["launch"] and not at["wait"] and max(at["prefetch"]) < min(at["w_loads"])
