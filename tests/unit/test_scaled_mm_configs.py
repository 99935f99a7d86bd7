"""The quantized GEMM families' pure parts: config ids, THE validity predicate, the heuristic
sentinel, signatures per scale mode, scale-layout errors, the built-in registry entries."""
import pytest

from tunedb import families
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.scaled_mm import configs, keys, simplicity
from tunedb.records import ArchProfile, Config, Signature

SM90 = ArchProfile("sm90", "NVIDIA H200", 132, 233472, 232448, 62914560, 65536, 4000.0, 900.0, 900.0,
                   2.0, 5.0, "shipped")
SM80 = ArchProfile("sm80", "A100", 108, 167936, 166912, 41943040, 65536, 1500.0, 300.0, 300.0,
                   2.0, 5.0, "shipped")


class _Shape:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def int8_sig(n=4096, k=4096, op="scaled_mm", out="bf16"):
    return keys.make_signature("scaled_mm", op, n, k, out)


def fp8_sig(n=4096, k=4096, scale="row", op="scaled_mm", out="bf16"):
    return keys.make_signature("scaled_mm_fp8", op, n, k, out, scale)


def test_registry_has_both_families():
    int8, fp8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")
    assert (int8.name, int8.dt, fp8.name, fp8.dt) == ("scaled_mm", "int8", "scaled_mm_fp8", "fp8")
    assert {"scaled_mm", "scaled_mm_fp8"} <= set(families.names())
    assert int8.ops == ("scaled_mm", "scaled_mm_quant")


def test_signature_text_per_mode():
    assert int8_sig().format() == "scaled_mm|op=scaled_mm|dt=int8|N=4096|K=4096|out=bf16"
    assert fp8_sig(scale="block", op="scaled_mm_quant", out="fp8").format() == \
        "scaled_mm_fp8|op=scaled_mm_quant|dt=fp8|N=4096|K=4096|scale=block|out=fp8"
    assert Signature.parse(fp8_sig().format()) == fp8_sig()
    # the quant op is keyed separately from the plain one
    assert int8_sig(op="scaled_mm_quant", out="int8") != int8_sig()


@pytest.mark.parametrize("call, needle", [
    (lambda: keys.make_signature("scaled_mm", "scaled_mm", 64, 64, "bf16", "block"), "scale='row' only"),
    (lambda: keys.make_signature("scaled_mm_fp8", "scaled_mm", 64, 64, "bf16", "col"), "scale='col'"),
    (lambda: keys.make_signature("scaled_mm_fp8", "scaled_mm", 64, 64, "fp16"), "out='fp16'"),
    (lambda: keys.make_signature("scaled_mm", "scaled_mm_quant", 64, 64, "bf16"), "out='bf16' not allowed"),
    (lambda: keys.make_signature("scaled_mm", "matmul", 64, 64, "bf16"), "op='matmul'"),
])
def test_bad_signatures_name_the_field(call, needle):
    with pytest.raises(SignatureError, match=needle.replace("(", r"\(")):
        call()


def test_signature_of_tensors_and_scale_inference():
    x, w = _Shape((2, 5, 256), "torch.float8_e4m3fn"), _Shape((384, 256), "torch.float8_e4m3fn")
    f32 = "torch.float32"
    for w_scale, mode, x_scale in (((), "tensor", ()), ((384, 1), "row", (10, 1)), ((3, 2), "block", (10, 2))):
        sig, m = keys.signature_of("scaled_mm", x, w, _Shape(x_scale, f32), _Shape(w_scale, f32), "torch.bfloat16")
        assert (m, sig.get("scale"), sig.get("N"), sig.get("K")) == (10, mode, 384, 256)
    xi, wi = _Shape((17, 64), "torch.int8"), _Shape((32, 64), "torch.int8")
    sig, m = keys.signature_of("scaled_mm_quant", xi, wi, _Shape((17,), f32), _Shape((32,), f32), "torch.int8")
    assert sig.format() == "scaled_mm|op=scaled_mm_quant|dt=int8|N=32|K=64|out=int8" and m == 17


@pytest.mark.parametrize("xs, ws, sdt, needle", [
    ((16,), (31,), "torch.float32", r"w_scale has shape \[31\]"),
    ((15, 1), (32,), "torch.float32", r"x_scale has shape \[15, 1\]"),
    ((16,), (32,), "torch.float16", "must be torch.float32"),
])
def test_bad_scales_get_clear_errors(xs, ws, sdt, needle):
    x, w = _Shape((16, 64), "torch.int8"), _Shape((32, 64), "torch.int8")
    with pytest.raises(SignatureError, match=needle):
        keys.signature_of("scaled_mm", x, w, _Shape(xs, sdt), _Shape(ws, sdt), "torch.bfloat16")


def test_mixed_or_unquantized_operands_are_refused():
    f32 = _Shape((16,), "torch.float32")
    with pytest.raises(SignatureError, match="must match"):
        keys.signature_of("scaled_mm", _Shape((16, 64), "torch.int8"), _Shape((32, 64), "torch.float8_e4m3fn"),
                          f32, _Shape((32,), "torch.float32"), "torch.bfloat16")
    with pytest.raises(SignatureError, match="int8 or torch.float8_e4m3fn"):
        keys.signature_of("scaled_mm", _Shape((16, 64), "torch.bfloat16"), _Shape((32, 64), "torch.bfloat16"),
                          f32, f32, "torch.bfloat16")
    with pytest.raises(SignatureError, match="cannot tell the scale mode"):
        keys.infer_scale(_Shape((7, 7), "torch.float32"), 384, 256)


def test_config_ids_round_trip_and_bad_ids():
    for cfg in configs.full_grid():
        assert configs.parse(cfg.id) == cfg
    assert configs.parse("heuristic").is_sentinel and configs.parse("torch").lane == "torch"
    for bad in ("b100x64x64_w4_s3_g8", "sk2_b16x64x128_w4_s3_g8", "b64x64x64_w4_s3", "fused", "tma_sk2_b64x64x64_w4_s3", "b64x64x64_w4_s3_g8_ws"):
        with pytest.raises(ConfigError):
            configs.parse(bad)


def test_block_scales_need_bk_dividing_128():
    good, bad = configs.parse("b64x128x128_w4_s3_g8"), configs.make("triton_mma", 64, 128, 256, 4, 2)
    block = fp8_sig(scale="block")
    assert configs.invalid_reason(good, block, None, SM90) is None
    assert "BLOCK_K dividing 128" in configs.invalid_reason(bad, block, None, SM90)
    assert configs.invalid_reason(bad, fp8_sig(scale="row"), None, SM90) is None
    assert configs.invalid_reason(configs.parse("b64x128x64_w4_s3_g8"), block, None, SM90) is None


def test_torch_arm_rules():
    torch_arm = Config.sentinel("torch")
    sig = int8_sig()
    assert "M <= 16" in configs.invalid_reason(torch_arm, sig, 16, SM90)
    assert configs.invalid_reason(torch_arm, sig, 17, SM90) is None
    assert configs.invalid_reason(torch_arm, sig, None, SM90) is None  # some M can take it
    assert "multiples of 8" in configs.invalid_reason(torch_arm, int8_sig(k=4100), 64, SM90)
    assert "multiples of 16" in configs.invalid_reason(torch_arm, fp8_sig(n=4104), 1, SM90)
    assert configs.invalid_reason(torch_arm, fp8_sig(), 1, SM90) is None  # no M rule for fp8
    assert "block-scaled" in configs.invalid_reason(torch_arm, fp8_sig(scale="block"), 64, SM90)
    assert configs.sentinels(fp8_sig(scale="block")) == ("heuristic",)
    assert configs.sentinels(int8_sig()) == ("heuristic", "torch")


def test_tma_lane_rules():
    cfg = configs.parse("tma_b128x256x128_w8_s3_g8")
    assert cfg.lane == "triton_tma" and configs.parse(cfg.id) == cfg
    assert configs.invalid_reason(cfg, fp8_sig(n=4104, scale="block"), None, SM90) is None  # N needs no alignment
    assert "multiple of 16" in configs.invalid_reason(cfg, fp8_sig(k=4104), None, SM90)
    assert "sm90+" in configs.invalid_reason(cfg, int8_sig(), None, SM80)
    assert any(c.lane == "triton_tma" for c in configs.config_space("sm90"))


def test_arch_split_and_smem_rules():
    cfg = configs.parse("b64x128x128_w4_s3_g8")
    assert "sm89+" in configs.invalid_reason(cfg, fp8_sig(), None, SM80)
    assert configs.invalid_reason(cfg, int8_sig(), None, SM80) is None
    big = configs.make("triton_mma", 128, 256, 256, 8, 4)
    assert "shared memory" in configs.invalid_reason(big, int8_sig(), None, SM90)
    sk = configs.parse("sk8_b16x64x128_w4_s3")
    assert "split_k=8 > 2 K tiles" in configs.invalid_reason(sk, int8_sig(k=256), None, SM90)
    assert "without work" in configs.invalid_reason(configs.parse("sk4_b16x64x128_w4_s3"), int8_sig(k=5 * 128), None, SM90)
    assert configs.invalid_reason(sk, int8_sig(k=14336), None, SM90) is None
    assert all(configs.smem_bytes(c) <= SM90.smem_per_block for c in configs.config_space("sm90"))


def test_heuristic_is_a_stated_shape_rule():
    sig = int8_sig()
    # largest tile still launching half a wave (66 CTAs on 132 SMs)
    assert configs.heuristic_config(sig, 4096).id == "b128x256x128_w8_s3_g8"  # 32 x 16 tiles
    assert configs.heuristic_config(sig, 128).id == "b64x64x128_w4_s4_g8"  # 2 x 64 = 128 >= 66
    assert configs.heuristic_config(sig, 1).id == "b16x64x128_w4_s4_g8"  # nothing fills: the smallest
    assert configs.heuristic_config(sig, 1, sms=16).id == "b128x256x128_w8_s3_g8"  # 16 tiles >= 8
    assert configs.default_config(sig).id == "heuristic"
    for m in (1, 7, 100, 5000):  # every tile it names runs block scales too
        assert configs.invalid_reason(configs.heuristic_config(fp8_sig(scale="block"), m), fp8_sig(scale="block"), m, SM90) is None


def test_compile_set_holds_heuristic_tiles_referenced_and_sentinels():
    ids = {c.id for c in configs.compile_set("sm90", ["sk4_b16x64x128_w4_s3", "not-an-id", "heuristic"], mode="tuned")}
    assert {"heuristic", "torch", "sk4_b16x64x128_w4_s3", "b16x64x128_w4_s4_g8", "b128x256x128_w8_s3_g8"} <= ids
    assert len(configs.compile_set("sm90", [], mode="all")) > len(ids)


def test_work_counts_one_byte_operands():
    flops, moved = keys.work(int8_sig(n=256, k=512), 4)
    assert flops == 2 * 4 * 256 * 512
    assert moved == 4 * 512 + 256 * 512 + (4 + 256) * 4 + 4 * 256 * 2
    _, q = keys.work(int8_sig(n=256, k=512, op="scaled_mm_quant", out="int8"), 4)
    assert q == 4 * 512 + 256 * 512 + (4 + 256) * 4 + 4 * 256 + 4 * 4


def test_simplicity_orders_heuristic_first():
    ranks = [simplicity(c) for c in ("heuristic", "torch", "b64x64x128_w4_s4_g8", "sk2_b16x64x128_w4_s3")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 4
    assert simplicity("tma_b128x128x128_w8_s3_g8") == simplicity("b128x128x128_w8_s3_g8")
    assert simplicity("dk1_n32x256_w4_s6") == 2 and simplicity("dk1_n32x256_w4_s6_pdl") == simplicity("dk4_n32x128_w4_s4") == 3


def test_import_touches_no_torch():
    import subprocess
    import sys

    code = ("import sys; import tunedb.families.scaled_mm as s; from tunedb import families; "
            "families.get('scaled_mm_fp8'); print('torch' in sys.modules, 'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_families_implement_the_contract():
    from tunedb.families import contract

    for fam, sig, other in ((families.get("scaled_mm"), int8_sig(), fp8_sig()),
                            (families.get("scaled_mm_fp8"), fp8_sig(scale="block"), int8_sig())):
        assert contract.missing_members(fam) == ()
        assert fam.schema.check(sig) is sig and fam.schema.size == "M"
        with pytest.raises(SignatureError):
            fam.schema.check(other)
        rule = contract.hook(fam, "pick_rule")()
        assert rule.fallback == "heuristic"
        # the heuristic is the gate's fallback: a tile 4% faster keeps it, 6% faster replaces it
        assert rule.pick({"heuristic": 1.0, "b64x64x128_w4_s4_g8": 0.96}).winner == "heuristic"
        assert rule.pick({"heuristic": 1.0, "b64x64x128_w4_s4_g8": 0.94}).winner == "b64x64x128_w4_s4_g8"
        assert contract.hook(fam, "heuristic")(sig, 1, SM90) == configs.heuristic_config(sig, 1)
        assert contract.hook(fam, "weight_args")(sig) == (1, 3)
        assert contract.hook(fam, "weight_bytes")(sig) >= sig.get("N") * sig.get("K")
    assert contract.verify_rule(families.get("scaled_mm"), int8_sig()).kind == "exact"
    assert contract.verify_rule(families.get("scaled_mm_fp8"), fp8_sig()).kind == "tolerance"
    with pytest.raises(SignatureError, match="scale='col'; allowed"):
        families.get("scaled_mm_fp8").schema.check(Signature.parse(
            "scaled_mm_fp8|op=scaled_mm|dt=fp8|N=64|K=64|scale=col|out=bf16"))
