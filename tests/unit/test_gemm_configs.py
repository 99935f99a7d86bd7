"""GEMM family: config ids, validity rules, default, compile set, signatures, registry errors."""
import dataclasses
import subprocess
import sys

import pytest
import torch

from tunedb import families, settings
from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError, RegistryError, SignatureError
from tunedb.families.gemm import FAMILY, configs
from tunedb.records import Config, Signature

SM90 = shipped_profile("sm90")
SM80 = dataclasses.replace(SM90, arch_family="sm80", sku="NVIDIA A100", smem_per_block=166912)


def sig(op="gemm", dt="bf16", n=512, k=256, act="none", bias=False):
    return FAMILY.make_signature(op, dt, n, k, act, bias)


def test_registry_returns_family_and_names_registered_ones_on_error():
    assert families.get("gemm") is FAMILY
    assert isinstance(FAMILY, families.KernelFamily)
    with pytest.raises(RegistryError, match=r"unknown kernel family 'gemmm'.*registered: .*gemm"):
        families.get("gemmm")
    with pytest.raises(RegistryError, match=r"unknown op 'matmul'.*gemm, gemm_act"):
        families.check_op(FAMILY, "matmul")


@pytest.mark.parametrize("cid", [c.id for c in configs.full_grid()])
def test_every_grid_id_round_trips(cid):
    cfg = FAMILY.parse_config(cid)
    assert cfg.id == cid
    if cfg.param("kernel") == "gemv":  # the GEMV kernel's own parameters (dot, late): configs_gemv
        from tunedb.families.gemm.configs_gemv import make_gemv

        again = make_gemv(*cfg.param("block")[1:], cfg.param("warps"), cfg.param("stages"), cfg.param("split_k"),
                          cfg.param("dot"), cfg.param("pdl"), cfg.param("late"), cfg.param("pre", 1))
    else:
        again = configs.make(cfg.lane, *cfg.param("block"), cfg.param("warps"), cfg.param("stages"),
                             cfg.param("group_m"), cfg.param("split_k"), bool(cfg.param("ws")),
                             bool(cfg.param("atomic")), bool(cfg.param("pdl")))
    assert again == cfg
    data = cfg.to_json()
    assert {"lane", "block", "warps", "stages", "group_m", "split_k"} <= set(data)
    assert configs.from_json(cid, data) == cfg


def test_id_examples_and_explicit_parameters():
    assert FAMILY.parse_config("b128x128x64_w8_s3_g8").to_json() == {
        "lane": "triton_mma", "block": [128, 128, 64], "warps": 8, "stages": 3, "group_m": 8, "split_k": 1}
    sk = FAMILY.parse_config("sk4_b16x64x256_w4_s4").to_json()
    assert sk["lane"] == "triton_splitk" and sk["split_k"] == 4 and sk["block"] == [16, 64, 256]
    ws = FAMILY.parse_config("tma_b128x256x64_w8_s3_g8_ws")
    assert ws.lane == "triton_tma" and ws.param("ws") is True
    assert FAMILY.parse_config("torch") == Config.sentinel("torch")


@pytest.mark.parametrize("bad", ["b128x128x64", "b128x128x64_w8_s3", "b100x128x64_w8_s3_g8",
                                 "b128x128x64_w3_s3_g8", "sk1_b16x64x256_w4_s4", "sk4_b16x64x256_w4_s4_g8",
                                 "b128x128x64_w8_s3_g8_ws", "b0128x128x64_w8_s3_g8", "cublas", ""])
def test_malformed_ids_are_config_errors_naming_the_id(bad):
    with pytest.raises(ConfigError) as info:
        FAMILY.parse_config(bad)
    assert repr(bad) in str(info.value) or "not allowed" in str(info.value)


def test_from_json_rejects_parameters_that_contradict_the_id():
    with pytest.raises(ConfigError, match="do not match"):
        configs.from_json("b128x128x64_w8_s3_g8", {"lane": "triton_mma", "block": [64, 64, 64], "warps": 8,
                                                   "stages": 3, "group_m": 8, "split_k": 1})


def test_space_size_is_modest_and_every_lane_is_present():
    space = FAMILY.config_space("sm90")
    assert 100 <= len(space) <= 300  # 213 + 14 triton_decode
    assert {c.lane for c in space} == set(configs.TRITON_LANES)
    assert not any(c.lane == "triton_tma" for c in FAMILY.config_space("sm80"))
    assert FAMILY.config_space("sm90", ["triton_splitk"]) == tuple(c for c in space if c.lane == "triton_splitk")
    with pytest.raises(ConfigError, match="unknown GEMM lane 'cutlass'"):
        FAMILY.config_space("sm90", ["cutlass"])


def test_tma_alignment_rule():
    tma = FAMILY.parse_config("tma_b64x128x64_w4_s4_g8")
    assert FAMILY.invalid_reason(tma, sig(n=512, k=256), None, SM90) is None
    assert "K*2 bytes" in FAMILY.invalid_reason(tma, sig(n=512, k=260), None, SM90)
    assert "N*2 bytes" in FAMILY.invalid_reason(tma, sig(n=84, k=256), None, SM90)
    assert FAMILY.invalid_reason(tma, sig(n=80, k=72), 1, SM90) is None  # 160 and 144 bytes
    assert "sm90 or newer" in FAMILY.invalid_reason(tma, sig(), None, SM80)


def test_split_may_not_exceed_k_tiles():
    sk = FAMILY.parse_config("sk8_b16x64x256_w4_s3")
    assert FAMILY.invalid_reason(sk, sig(k=2048), 1, SM90) is None  # 8 tiles
    why = FAMILY.invalid_reason(sk, sig(k=1800), 1, SM90)  # 8 tiles (ceil)
    assert why is None
    why = FAMILY.invalid_reason(sk, sig(k=1792), 1, SM90)  # 7 tiles
    assert "split_k=8 exceeds the 7 K tiles" in why


def test_shared_memory_rule_uses_the_arch_limit():
    big = FAMILY.parse_config("tma_b128x256x64_w8_s5_g8")
    assert "shared memory" in FAMILY.invalid_reason(big, sig(), None, SM90)
    assert configs.smem_bytes(big) > SM90.smem_per_block
    mma = FAMILY.parse_config("b128x128x64_w8_s4_g8")
    assert FAMILY.invalid_reason(mma, sig(), None, SM90) is None
    small = dataclasses.replace(SM80, smem_per_block=101376)
    assert "shared memory" in FAMILY.invalid_reason(mma, sig(), None, small)


def test_bad_signatures_and_m_are_reasons():
    cfg = FAMILY.parse_config("b64x64x64_w4_s3_g8")
    other = Signature.make("gemm", "conv", "bf16", N=8, K=8)
    assert "op 'conv'" in FAMILY.invalid_reason(cfg, other, 1, SM90)
    fp32 = Signature.make("gemm", "gemm", "fp32", N=8, K=8)
    assert "fp32" in FAMILY.invalid_reason(cfg, fp32, 1, SM90)
    assert "M=0" in FAMILY.invalid_reason(cfg, sig(), 0, SM90)
    assert FAMILY.invalid_reason(Config.sentinel("heuristic"), sig(), 1, SM90)


def test_fused_arm_rules_and_approximation_opt_in():
    relu = sig("gemm_act", act="relu", bias=True)
    gelu = sig("gemm_act", act="gelu", bias=True)
    fused = Config.sentinel("fused")
    assert FAMILY.sentinels(relu) == ("default", "torch", "fused")
    assert FAMILY.sentinels(sig()) == ("default", "torch")
    assert FAMILY.sentinels(gelu) == ("default", "torch")
    assert FAMILY.sentinels(gelu, approximate=True) == ("default", "torch", "fused")
    assert FAMILY.sentinels(sig("gemm_act", act="gelu_tanh", bias=True)) == ("default", "torch", "fused")
    assert FAMILY.sentinels(sig("gemm_act", act="relu", bias=False)) == ("default", "torch")
    with settings.override(APPROXIMATE="0"):
        assert "TUNEDB_APPROXIMATE" in FAMILY.invalid_reason(fused, gelu, 1, SM90)
    with settings.override(APPROXIMATE="1"):
        assert FAMILY.invalid_reason(fused, gelu, 1, SM90) is None
    assert FAMILY.invalid_reason(fused, sig(), 1, SM90)


def test_default_rule():
    assert FAMILY.default_config(sig(n=4096, k=4096)).id == "b128x128x64_w8_s3_g8"
    assert FAMILY.default_config(sig(n=512, k=4096)).id == "b64x64x64_w4_s3_g8"
    tiny = dataclasses.replace(SM80, smem_per_block=64 * 1024)
    assert FAMILY.default_config(sig(n=4096, k=4096), tiny).id == "b64x64x32_w4_s3_g8"
    for s in (sig(n=80, k=72), sig(n=4096, k=4096)):
        assert FAMILY.invalid_reason(FAMILY.default_config(s), s, None, SM90) is None


def test_compile_set_holds_referenced_default_and_basis():
    basis = FAMILY.compile_set("sm90", [])
    ids = [c.id for c in basis]
    assert 8 <= len(ids) <= 20 and len(set(ids)) == len(ids)
    assert "b128x128x64_w8_s3_g8" in ids and "b64x64x64_w4_s3_g8" in ids
    assert {c.lane for c in basis} == set(configs.TRITON_LANES)
    with_ref = FAMILY.compile_set("sm90", ["b32x32x64_w4_s4_g8", "torch", "not-an-id", "tma_b128x256x64_w8_s5_g8"])
    got = [c.id for c in with_ref]
    assert "b32x32x64_w4_s4_g8" in got
    assert "torch" not in got and "tma_b128x256x64_w8_s5_g8" not in got  # sentinel; infeasible on sm90
    assert not any(c.lane == "triton_tma" for c in FAMILY.compile_set("sm80", []))
    with settings.override(COMPILE_SET="all"):
        assert FAMILY.compile_set("sm90", []) == FAMILY.config_space("sm90")


def test_coverage_basis_ids_are_in_the_grid():
    grid = {c.id for c in configs.full_grid()}
    assert set(configs.COVERAGE_BASIS) <= grid


def test_signature_of_meta_tensors():
    x = torch.empty(4, 375, 1280, dtype=torch.bfloat16, device="meta")
    w = torch.empty(5120, 1280, dtype=torch.bfloat16, device="meta")
    b = torch.empty(5120, dtype=torch.bfloat16, device="meta")
    s, m = FAMILY.signature_of("gemm", x, w)
    assert (s.format(), m) == ("gemm|op=gemm|dt=bf16|N=5120|K=1280", 1500)
    s, m = FAMILY.signature_of("gemm_act", x.half(), w.half(), b.half(), act="gelu")
    assert s.format() == "gemm|op=gemm_act|dt=fp16|N=5120|K=1280|act=gelu|bias=1"
    s, _ = FAMILY.signature_of("gemm_act", x, w, None, act="silu")
    assert s.format().endswith("|act=silu|bias=0")


def test_signature_of_rejects_bad_calls_clearly():
    x = torch.empty(3, 72, dtype=torch.bfloat16, device="meta")
    w = torch.empty(80, 72, dtype=torch.bfloat16, device="meta")
    with pytest.raises(SignatureError, match="float32"):
        FAMILY.signature_of("gemm", x.float(), w.float())
    with pytest.raises(SignatureError, match="K=64"):
        FAMILY.signature_of("gemm", x, w[:, :64])
    with pytest.raises(SignatureError, match="act='tanh'.*relu"):
        FAMILY.signature_of("gemm_act", x, w, act="tanh")
    with pytest.raises(SignatureError, match="use gemm_act"):
        FAMILY.signature_of("gemm", x, w, torch.empty(80, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(SignatureError, match="unknown GEMM op 'mm'"):
        FAMILY.signature_of("mm", x, w)


def test_work_counts_flops_and_bytes():
    flops, moved = FAMILY.work(sig("gemm_act", n=80, k=72, act="relu", bias=True), 3)
    assert flops == 2 * 3 * 80 * 72
    assert moved == 2 * (3 * 72 + 80 * 72 + 3 * 80 + 80)


def test_impl_hash_is_12_hex_and_stable():
    h = FAMILY.impl_hash()
    assert len(h) == 12 and int(h, 16) >= 0 and h == FAMILY.impl_hash()


def test_pure_modules_import_neither_torch_nor_triton():
    code = ("import sys, tunedb.families as f; g = f.get('gemm'); g.config_space('sm90'); "
            "g.compile_set('sm90', []); g.parse_config('b64x64x64_w4_s3_g8'); "
            "print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_gemm_act_is_served_by_its_own_entry_then_the_plain_gemms():
    from tunedb.families.gemm import FAMILY

    sig = FAMILY.make_signature("gemm_act", "bf16", 512, 2048, act="gelu", bias=True)
    assert [k.format() for k in FAMILY.serving_keys(sig)] == [
        "gemm|op=gemm_act|dt=bf16|N=512|K=2048|act=gelu|bias=1",
        "gemm|op=gemm_act|dt=half|N=512|K=2048|act=gelu|bias=1",
        "gemm|op=gemm|dt=bf16|N=512|K=2048",
        "gemm|op=gemm|dt=half|N=512|K=2048",
    ]
    plain = FAMILY.make_signature("gemm", "fp16", 512, 2048)
    assert FAMILY.serving_keys(plain) == plain.lookup_keys()


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [False, True])
def test_torch_arm_writes_out_with_the_models_kernels_and_no_copy(act, bias):
    """A measurement passes `out`; the torch arm must run the model's kernels straight into it
    (a copy of the result would charge it a pass over the output that the model never pays)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tunedb.families.gemm.arms import reference, torch_arm

    sig = FAMILY.make_signature("gemm_act", "bf16", 24, 16, act=act, bias=bias)  # fp32 tensors: exact on the CPU
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, generator=gen)
    w = torch.randn(24, 16, generator=gen)
    b = torch.randn(24, generator=gen) if bias else None
    run = torch_arm(sig)
    out = torch.full((2, 5, 24), float("nan"))

    def copies(*args):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = run(*args)
        return result, sum(e.name == "aten::copy_" for e in prof.events())

    got, measured = copies(x, w, b, out)
    model_y, model = copies(x, w, b, None)  # how the model calls it
    assert got is out
    assert measured <= model, f"the measured call copies {measured} times, the model's call {model}"
    torch.testing.assert_close(out, reference(sig, x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model_y, out, rtol=1e-5, atol=1e-5)
