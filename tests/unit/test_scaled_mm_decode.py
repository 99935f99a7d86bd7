"""The quantized families' triton_decode lane (M <= 16, a weight stream with its split-K reduced
inside the kernel): ids and THE validity predicate's decode rules (pure Python), the pruning
model's ranking at decode and prefill sizes, and the kernel under TRITON_INTERPRET=1 at small odd
shapes: int8 bitwise equal to the CPU path (int32 partials summed in split order, the epilogue's
one rounding) for every split, also on a second call (the counters the kernel leaves zero), and
fp8 per-tensor / row / block scales against the fp32 product of the dequantized operands (the
interpreter runs the float8 dot by upcasting; it rounds fp32 -> bf16 by truncation, hence the
4x-rounding tolerance the gate uses)."""
import pytest

import interpret_child

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.scaled_mm import configs, keys
from tunedb.families.scaled_mm.pruning import PruningModel
from tunedb.records import ArchProfile

SM90 = shipped_profile("sm90")
SM80 = ArchProfile("sm80", "A100", 108, 167936, 166912, 41943040, 65536, 1500.0, 300.0, 300.0,
                   2.0, 5.0, "shipped")
INT8_IDS = ("dk1_n32x64_w4_s3", "dk2_n16x64_w2_s2", "dk3_n32x64_w4_s4_pdl", "dk4_n64x128_w4_s2")
SHAPES = ((80, 200), (48, 520))  # N, K: K not a multiple of the K block nor of the 128 scale block
MS = (1, 5, 16)


def fp8_sig(n=4096, k=4096, scale="row"):
    return keys.make_signature("scaled_mm_fp8", "scaled_mm", n, k, "bf16", scale)


def int8_sig(n=4096, k=4096):
    return keys.make_signature("scaled_mm", "scaled_mm", n, k, "bf16")


def test_decode_ids_round_trip_and_bad_values():
    cfg = configs.parse("dk8_n32x256_w4_s6_pdl")
    assert cfg.lane == "triton_decode" and cfg.param("block") == (16, 32, 256)
    assert cfg.param("split_k") == 8 and cfg.param("pdl") is True and cfg.param("group_m") == 1
    assert configs.parse("dk1_n128x128_w8_s4").param("pdl") is False
    assert configs.make("triton_decode", 16, 64, 128, 4, 4, 1, 2).id == "dk2_n64x128_w4_s4"
    for bad in ("dk3_n48x128_w4_s4", "dk64_n32x128_w4_s4", "dk2_n32x1024_w4_s4", "dk2_n32x128_w4_s9",
                "dk2_n32x128_w4_s4_at", "dk02_n32x128_w4_s4"):
        with pytest.raises(ConfigError):
            configs.parse(bad)
    with pytest.raises(ConfigError, match="BM must be 16"):
        configs.make("triton_decode", 32, 64, 128, 4, 4, 1, 2)
    decode = [c for c in configs.config_space("sm90") if c.id.startswith("dk")]  # gv: test_scaled_mm_gemv.py
    assert {c.param("split_k") for c in decode} == {1, 2, 4, 8, 16, 32}
    assert {c.param("block")[1] for c in decode} == {32, 64, 128} and {c.param("stages") for c in decode} == {4, 6}
    assert all(configs.parse(c.id) == c for c in decode)


def test_decode_predicate_rules():
    cfg = configs.parse("dk4_n32x128_w4_s4")
    assert configs.invalid_reason(cfg, fp8_sig(), 16, SM90) is None
    assert "M <= 16, not M=17" in configs.invalid_reason(cfg, fp8_sig(), 17, SM90)
    assert "not every M" in configs.invalid_reason(cfg, fp8_sig(), None, SM90)
    assert "split_k=4 > 3 K tiles" in configs.invalid_reason(cfg, int8_sig(k=300), 1, SM90)
    assert configs.invalid_reason(cfg, int8_sig(k=512), 1, SM90) is None  # 4 tiles, 4 splits
    wide = configs.parse("dk2_n32x256_w4_s4")
    assert "BLOCK_K dividing 128" in configs.invalid_reason(wide, fp8_sig(scale="block"), 1, SM90)
    assert configs.invalid_reason(wide, fp8_sig(scale="tensor"), 1, SM90) is None
    pdl = configs.parse("dk2_n32x128_w4_s4_pdl")
    assert "sm90+" in configs.invalid_reason(pdl, int8_sig(), 1, SM80)
    assert configs.invalid_reason(configs.parse("dk2_n32x128_w4_s4"), int8_sig(), 1, SM80) is None


def test_pruning_model_ranks_the_decode_lane_for_small_m_only():
    model = PruningModel(SM90)
    for sig in (fp8_sig(), fp8_sig(14336, 4096), fp8_sig(4096, 14336, "block"), int8_sig(1024, 4096)):
        cands = [c for c in configs.config_space("sm90") if configs.invalid_reason(c, sig, 1, SM90) is None]
        ranked = model.rank(sig, 1, cands, 6)  # the build command of docs/scaled_mm.md: --top-k 6
        # the in-kernel reduction and PDL beat a second launch; both decode kernels are measured
        assert configs.parse(ranked[0]).lane == "triton_decode"
        # both kernels under block scales too (the gv tensor-core slabs of K block 128), the gv
        # ones only where BLOCK_K divides 128
        gv = [c for c in ranked if c.startswith("gv")]
        assert gv and (sig.get("scale") != "block" or all(configs.parse(c).param("block")[2] <= 128 for c in gv))
        dk = [c for c in ranked if c.startswith("dk")]
        assert any(c.endswith("_pdl") for c in dk) and any(not c.endswith("_pdl") for c in dk)
        assert any(c.startswith("sk") for c in ranked) and any(c.startswith("b") for c in ranked)
        decode = [c for c in ranked if c.startswith(("dk", "gv"))]
        assert len({configs.parse(c).param("block") for c in decode}) >= 2  # more than one slab measured
        gv = [c for c in ranked if c.startswith("gv")]
        assert not gv or any(c.endswith("_pdl") for c in gv) and any(not c.endswith("_pdl") for c in gv)
        big = [c for c in configs.config_space("sm90") if configs.invalid_reason(c, sig, 2048, SM90) is None]
        assert not any(c.startswith(("dk", "gv")) for c in model.rank(sig, 2048, big, 4))
    # block scales at M=2048: two 64x128 CTAs per SM beat one 128x256 (session 10 C measured 2x),
    # and the build's top 8 holds the 64x128 tile that won that sweep
    blk = fp8_sig(4096, 4096, "block")
    assert model.predict(blk, 2048, "b64x128x128_w4_s4_g8") < model.predict(blk, 2048, "b128x256x128_w8_s3_g8")
    cands = [c for c in configs.config_space("sm90") if configs.invalid_reason(c, blk, 2048, SM90) is None]
    assert "b64x128x128_w4_s4_g8" in model.rank(blk, 2048, cands, 8)
    # more bytes in flight per SM streams faster: 6 stages over 2, a split that fills the SMs
    sig = fp8_sig(4096, 4096)
    assert model.predict(sig, 1, "dk1_n32x256_w4_s6") < model.predict(sig, 1, "dk1_n32x256_w4_s2")
    assert model.predict(sig, 1, "dk1_n32x256_w4_s6_pdl") < model.predict(sig, 1, "dk1_n32x256_w4_s6")
    assert model.predict(fp8_sig(1024, 4096), 1, "dk8_n64x128_w4_s6") < model.predict(fp8_sig(1024, 4096), 1,
                                                                                          "dk1_n64x128_w4_s6")


def _child() -> None:
    import torch

    from tunedb import families
    from tunedb.families.scaled_mm import ops  # noqa: F401 -- the CPU path to compare with

    failures = []
    int8, fp8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")
    for n, k in SHAPES:
        for m in MS:
            for out in ("fp16", "bf16"):
                sig = int8.make_signature("scaled_mm", n, k, out)
                args, _ = int8.make_inputs(sig, m, "cpu", seed=m + n)
                want = ops._cpu(sig, *args)
                if out == "bf16":  # the interpreter truncates fp32 -> bf16
                    y32 = ops.cpu_product(sig, *args)
                    want = (y32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
                for cid in INT8_IDS:
                    cfg = configs.parse(cid)
                    if configs.invalid_reason(cfg, sig, m, SM90):
                        continue
                    for call in range(2):  # the second call finds the counters reset
                        got = int8.launch(cfg, sig, *args)
                        if not torch.equal(got, want):
                            failures.append(f"int8 {cid} N={n} K={k} M={m} {out} call {call}: not bitwise")
            for scale in ("tensor", "row", "block"):
                sig = fp8.make_signature("scaled_mm", n, k, "bf16", scale)
                args, _ = fp8.make_inputs(sig, m, "cpu", seed=m + k)
                ref = fp8.reference(sig, *args)
                bound = 4 * 2 ** -7 * ref.abs().max()
                for cid in ("dk1_n32x64_w4_s3", "dk3_n16x64_w2_s2_pdl", "dk2_n64x128_w4_s2"):
                    got = fp8.launch(configs.parse(cid), sig, *args).float()
                    if (got - ref).abs().max() > bound:
                        failures.append(f"fp8 {scale} {cid} N={n} K={k} M={m}: error "
                                        f"{(got - ref).abs().max().item():.3g} > {bound.item():.3g}")
    qsig = int8.make_signature("scaled_mm_quant", 80, 200, "int8")
    args, _ = int8.make_inputs(qsig, 3, "cpu", seed=3)
    wq, ws = ops._cpu(qsig, *args)
    q, s = int8.launch(configs.parse("dk2_n32x64_w4_s3"), qsig, *args)
    if not (torch.equal(q, wq) and torch.equal(s, ws)):
        failures.append("int8 _quant through the decode lane differs from the CPU path")
    try:
        int8.launch(configs.parse("dk8_n32x64_w4_s3"), int8.make_signature("scaled_mm", 80, 200, "bf16"),
                    *int8.make_inputs(int8.make_signature("scaled_mm", 80, 200, "bf16"), 1, "cpu", seed=0)[0])
        failures.append("a split without a K tile launched")
    except ValueError as exc:
        if "K tiles" not in str(exc):
            failures.append(f"a split without a K tile: unclear error {exc}")
    interpret_child.report(failures)


@pytest.mark.slow
def test_decode_lane_under_interpreter():
    assert interpret_child.failures(__file__) == []


if __name__ == "__main__":
    _child()
