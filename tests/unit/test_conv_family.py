"""The conv family on the CPU: keys, exact points and their regions, the census on meta tensors,
the validity predicate, config ids, optimize() and the family's registration."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tunedb import families
from tunedb.census.models import ConformerEncoder, ConformerMirror, ConvSubsampling
from tunedb.census.recorder import record
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.conv import FAMILY, configs, keys
from tunedb.families.conv.points import ExactPoint, PointConflict, PointEntry, load
from tunedb.records import ArchProfile, Region, Signature

H200 = ArchProfile("sm90", "NVIDIA H200", 132, 233472, 232448, 60 * 2**20, 65536, 4000.0, 800.0, 800.0, 2.0, 5.0)
DW = keys.make_signature("conv1d", "half", 512, 512, 31, 1, 15, 1, 512, True)
PW = keys.make_signature("conv1d", "half", 512, 1024, 1, lay="ntc")
SUB = keys.make_signature("conv2d", "half", 1, 512, 3, 2, 0, 1, 1, True, "relu", width=80)


def test_registered_and_schema_checks_keys():
    fam = families.get("conv")
    assert fam is FAMILY and "conv" in families.names()
    for sig in (DW, PW, SUB):
        assert fam.schema.check(sig) is sig
        assert Signature.parse(sig.format()) == sig
    assert DW.format() == "conv|op=conv1d|dt=half|Cin=512|Cout=512|k=31|s=1|p=15|d=1|g=512|bias=1|act=none|lay=nct"
    assert SUB.get("k") == 3 and SUB.get("kw") == 3 and SUB.get("W") == 80


def test_signature_of_meta_tensors_and_layout():
    x = torch.empty(2, 100, 144, device="meta", dtype=torch.float16).transpose(1, 2)  # [B, C, T] over [B, T, C]
    w = torch.empty(144, 1, 31, device="meta", dtype=torch.float16)
    sig, m = FAMILY.signature_of("conv1d", x, w, None, 1, 15, 1, 144)
    assert sig.get("lay") == "ntc" and sig.get("bias") == 0 and m == 200
    x2 = torch.empty(3, 1, 101, 80, device="meta", dtype=torch.bfloat16)
    w2 = torch.empty(8, 1, 3, 3, device="meta", dtype=torch.bfloat16)
    sig2, m2 = FAMILY.signature_of("conv2d", x2, w2, None, 2, 0, 1, 1, "relu")
    assert sig2.dt == "bf16" and sig2.get("W") == 80 and m2 == 3 * 50 * 39


@pytest.mark.parametrize("bad, message", [
    (dict(groups=3), "groups g=3 must divide"),
    (dict(act="gelu"), "act='gelu'"),
    (dict(lay="nhwc"), "lay='nhwc' for conv1d"),
])
def test_bad_keys_name_the_field(bad, message):
    args = dict(groups=1, act="none", lay="nct")
    args.update(bad)
    with pytest.raises(SignatureError, match=message):
        keys.make_signature("conv1d", "half", 8, 8, 3, **args)


def test_bad_tensors_name_the_problem():
    x = torch.empty(1, 8, 10, device="meta", dtype=torch.float32)
    w = torch.empty(8, 8, 3, device="meta", dtype=torch.float32)
    with pytest.raises(SignatureError, match="float16 and torch.bfloat16"):
        FAMILY.signature_of("conv1d", x, w)
    with pytest.raises(SignatureError, match="expects 16 input channels"):
        FAMILY.signature_of("conv1d", x.half(), w.half(), None, 1, 0, 1, 2)


def test_shape_for_reaches_m():
    for sig in (DW, PW, SUB, keys.make_signature("conv1d", "half", 8, 8, 5, 2, 1, 2, 1)):
        for m in (1, 7, 100, 1000):
            b, length = keys.shape_for(sig, m)
            assert keys.size_of(sig, b, length) >= m
            if sig.op == "conv1d" and m > 1:
                assert keys.size_of(sig, b, length - 1) < m  # the shortest such input


def test_exact_points_parse_size_and_serve_only_themselves():
    p = ExactPoint.parse("1x3000")
    assert (p.batch, p.length, p.format()) == (1, 3000, "1x3000")
    assert p.size(DW) == 3000 and p.size(SUB) == 1499 * 39
    with pytest.raises(SignatureError, match="BxL"):
        ExactPoint.parse("3000")
    entry = PointEntry.from_json(DW.format(), {"points": {"1x3000": "dw_t64_c64_w4", "4x500": "torch"}})
    assert entry.lookup(1, 3000) == "dw_t64_c64_w4"
    assert entry.lookup(1, 2999) is None and entry.lookup(2, 1500) is None


def test_exact_points_convert_to_regions():
    body = {"points": {"1x200": "torch", "1x1000": "dw_t64_c64_w4", "2x1000": "dw_t64_c64_w4", "1x8000": "torch"}}
    entry = PointEntry.from_json(DW.format(), body)
    assert entry.to_regions() == (Region(200, "torch"), Region(2000, "dw_t64_c64_w4"), Region(8000, "torch"))
    full = entry.to_entry(catch_all="torch")
    assert full.regions[-1] == Region(None, "torch")
    assert full.lookup(2000) == "dw_t64_c64_w4" and full.lookup(2001) == "torch" and full.lookup(1) == "torch"
    assert entry.to_entry().lookup(9000) is None  # no catch-all: falls through to the next tier
    assert full.evidence["M=2000"] == {"point": "2x1000", "config": "dw_t64_c64_w4"}
    # stride 2: M counts output steps, not input frames
    strided = keys.make_signature("conv1d", "half", 8, 8, 3, 2, 1, 1, 8)
    assert PointEntry.from_json(strided.format(), {"points": {"1x3000": "torch"}}).to_regions() == (Region(1500, "torch"),)


def test_exact_point_conflict_and_bad_files():
    entry = PointEntry.from_json(DW.format(), {"points": {"1x2000": "torch", "2x1000": "dw_t64_c64_w4"}})
    with pytest.raises(PointConflict, match="both M=2000"):
        entry.to_regions()
    with pytest.raises(SignatureError, match="non-empty 'points'"):
        PointEntry.from_json(DW.format(), {"points": {}})
    with pytest.raises(SignatureError, match="'entries'"):
        load({"points": {}})
    assert load({"entries": {DW.format(): {"points": {"1x3000": "torch"}}}})[0].to_json() == {"points": {"1x3000": "torch"}}


def _conformer(d: int = 64, layers: int = 2) -> nn.Module:
    return ConformerEncoder(ConvSubsampling(16, d), ConformerMirror(d, 4, 2 * d, layers, 31))


def test_census_of_a_conformer_on_meta_tensors():
    with torch.device("meta"):
        model = _conformer().half()
    x = torch.empty(2, 203, 16, device="meta", dtype=torch.float16)
    calls = record(lambda: model(x))
    got = {(s.op, s.get("Cin"), s.get("Cout"), s.get("k"), s.get("g"), s.get("lay")): (m, n) for (s, m), n in calls.items()
           if s.family == "conv"}
    t1, f1 = (203 - 3) // 2 + 1, (16 - 3) // 2 + 1
    t2, f2 = (t1 - 3) // 2 + 1, (f1 - 3) // 2 + 1
    assert got[("conv2d", 1, 64, 3, 1, "nchw")] == (2 * t1 * f1, 1)
    assert got[("conv2d", 64, 64, 3, 1, "nchw")] == (2 * t2 * f2, 1)
    assert got[("conv1d", 64, 128, 1, 1, "ntc")] == (2 * t2, 2)  # the first pointwise: a transposed view
    assert got[("conv1d", 64, 64, 31, 64, "nct")] == (2 * t2, 2)  # depthwise, kernel 31
    assert got[("conv1d", 64, 64, 1, 1, "nct")] == (2 * t2, 2)


def test_validity_predicate():
    dw, ig = configs.parse("dw_t64_c64_w4"), configs.parse("ig_b64x64x32_w4_s3")
    assert configs.invalid_reason(dw, DW, 3000, H200) is None
    assert "depthwise conv1d only" in configs.invalid_reason(dw, PW, None, H200)
    assert "depthwise conv1d only" in configs.invalid_reason(dw, SUB, None, H200)
    assert configs.invalid_reason(ig, PW, 3000, H200) is None
    assert configs.invalid_reason(configs.parse("ig_b64x64x16_w4_s3"), SUB, 3000, H200) is None
    assert "dense convolutions only" in configs.invalid_reason(ig, DW, None, H200)
    assert "padding" in configs.invalid_reason(configs.parse("ig_b64x64x64_w4_s3"), SUB, None, H200)  # K = 9
    assert "int32" in configs.invalid_reason(dw, DW, 5_000_000, H200)
    small = ArchProfile(**{**H200.__dict__, "smem_per_block": 32768})
    assert "shared memory" in configs.invalid_reason(configs.parse("ig_b128x128x64_w8_s4"), PW, None, small)
    for cid in ("torch", "default", "cudnn_bench", "cudnn_cl", "cudnn_cl_bench"):
        assert configs.invalid_reason(configs.parse(cid), DW, 10**9, H200) is None
    assert FAMILY.sentinels(DW) == ("default", "torch")


def test_config_ids_round_trip_and_errors():
    space = FAMILY.config_space("sm90")
    assert {c.lane for c in space} == {"cudnn", "triton_dw", "triton_igemm"}
    for c in space:
        assert FAMILY.parse_config(c.id) == c
    for bad, message in (("dw_t63_c64_w4", "BT=63"), ("ig_b64x64x32_w4", "expected dw_t64"), ("fused", "no 'fused'")):
        with pytest.raises(ConfigError, match=message):
            FAMILY.parse_config(bad)
    assert FAMILY.config_space("sm90", ["triton_dw"]) and all(c.lane == "triton_dw" for c in FAMILY.config_space("sm90", ["triton_dw"]))
    ids = {c.id for c in FAMILY.compile_set("sm90", ["ig_b32x32x16_w4_s2", "nonsense"])}
    assert {"ig_b32x32x16_w4_s2", "dw_t64_c64_w4", "torch"} <= ids


def test_pick_rule_and_serving_keys():
    rule = FAMILY.pick_rule()
    assert rule.fallback == "torch" and rule.peers == ("cudnn_bench",)
    assert rule.pick({"torch": 1.0, "cudnn_bench": 0.99, "dw_t64_c64_w4": 0.5}).winner == "dw_t64_c64_w4"
    assert rule.pick({"torch": 1.0, "dw_t64_c64_w4": 0.97}).winner == "torch"  # inside the tie band
    keys_ = FAMILY.serving_keys(SUB.with_dt("bf16"))
    assert [k.dt for k in keys_] == ["bf16", "half", "bf16", "half"]
    assert [k.get("act") for k in keys_] == ["relu", "relu", "none", "none"]


@pytest.mark.parametrize("times,winner", [
    # session 10's k=31 depthwise conv at B=1: the autotuner 1.6% faster, inside the tie band
    ({"torch": 6.3, "cudnn_bench": 6.2, "cudnn_cl": 21.7, "dw_t64_c32_w4": 11.5}, "cudnn_bench"),
    ({"torch": 6.2, "cudnn_bench": 6.3, "dw_t64_c32_w4": 11.5}, "torch"),  # the default faster: it stays
    ({"torch": 1.0, "cudnn_bench": 0.96}, "cudnn_bench"),  # beyond the band, below the gate: no gate between peers
    ({"torch": 1.0, "cudnn_bench": 1.0}, "torch"),  # equal: the fallback
    # a Triton arm 1.07x over torch but 1.02x over the autotuner: the autotuner serves
    ({"torch": 1.0, "cudnn_bench": 0.95, "dw_t64_c32_w4": 1.0 / 1.07}, "cudnn_bench"),
    ({"torch": 1.0, "cudnn_bench": 0.95, "dw_t64_c32_w4": 0.95 / 1.06}, "dw_t64_c32_w4"),  # beats both by 1.05x
    ({"torch": 1.0, "cudnn_cl": 0.97, "cudnn_bench": 0.99}, "cudnn_bench"),  # channels-last is no peer: gated
    ({"cudnn_bench": 1.0, "dw_t64_c32_w4": 0.9}, "dw_t64_c32_w4"),  # torch unmeasured: the peer is the reference
])
def test_pick_is_never_slower_than_either_cudnn_mode(times, winner):
    rule = FAMILY.pick_rule()
    got = rule.pick(times).winner
    assert got == winner
    for mode in ("torch", "cudnn_bench"):
        if mode in times:
            assert times[got] <= times[mode]


def test_serving_keys():
    keys_ = FAMILY.serving_keys(SUB.with_dt("bf16"))
    assert [k.dt for k in keys_] == ["bf16", "half", "bf16", "half"]
    assert [k.get("act") for k in keys_] == ["relu", "relu", "none", "none"]


def test_optimize_swaps_and_fuses_and_stays_correct_on_cpu():
    torch.manual_seed(0)
    model = _conformer(32, 1).eval()
    x = torch.randn(2, 60, 16)
    with torch.no_grad():
        before = model(x)
    out = families.get("conv").optimize(model)
    from tunedb.families.conv.patching import TunedConv1d, TunedConv2d

    seq = out.frontend.conv
    assert isinstance(seq[0], TunedConv2d) and seq[0].tunedb_act == "relu" and isinstance(seq[1], nn.Identity)
    assert isinstance(seq[2], TunedConv2d) and isinstance(seq[3], nn.Identity)
    convs = [m for m in out.modules() if isinstance(m, TunedConv1d)]
    assert len(convs) == 3 and convs[1].groups == 32 and convs[1].tunedb_act == "silu"  # + its norm and SiLU
    with torch.no_grad():
        after = out(x)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert "conv.frontend" not in str(out.state_dict().keys())  # parameters stay where they were
    assert set(out.state_dict()) == set(model.state_dict())


def test_work_and_weight_bytes():
    flops, moved = FAMILY.work(DW, 1000)
    assert flops == 2.0 * 1000 * 512 * 31
    assert moved == (1000 * 512 + 512 * 31 + 1000 * 512) * 2
    assert FAMILY.weight_bytes(SUB) == 512 * 9 * 2


def test_fused_census_records_the_keys_optimize_runs():
    from tunedb.runtime import launch_table
    from tunedb.runtime.patching import optimize

    with torch.device("meta"):
        model = optimize(_conformer().half(), families="all")
    x = torch.empty(2, 203, 16, device="meta", dtype=torch.float16)
    with launch_table.recording() as tuned:
        calls = record(lambda: model(x))
    assert not any(s.family == "conv" for s, _ in calls)  # the tuned ops' own convolutions are not counted again
    conv = [(s, m) for fam, s, m in tuned if fam == "conv"]
    assert len(conv) == 2 + 2 * 3
    acts = sorted(s.get("act") for s, _ in conv if s.op == "conv2d")
    assert acts == ["relu", "relu"]
    assert {s.get("k") for s, _ in conv if s.op == "conv1d"} == {1, 31}


def test_census_keys_are_half():
    x = torch.empty(1, 8, 50, device="meta", dtype=torch.bfloat16)
    w = torch.empty(8, 1, 31, device="meta", dtype=torch.bfloat16)
    from tunedb.families.conv.census import convolution_key

    sig, m = convolution_key((x, w, None, [1], [15], [1], False, [0], 8), {})
    assert sig.dt == "half" and sig.get("g") == 8 and m == 50
    assert convolution_key((x, w, None, [1], [15], [1], True, [0], 8), {}) is None  # transposed: not served


def test_folded_norm_matches_in_eval_and_steps_aside_in_training():
    from tunedb.families.conv.patching import AbsorbedBatchNorm1d, AbsorbedSiLU, optimize

    torch.manual_seed(1)
    seq = nn.Sequential(nn.Conv1d(6, 6, 31, padding=15, groups=6), nn.BatchNorm1d(6), nn.SiLU(), nn.Conv1d(6, 4, 1))
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        seq[1].running_mean.uniform_(-1, 1)
        seq[1].running_var.uniform_(0.5, 2)
        seq[1].weight.uniform_(0.5, 1.5)
        seq[1].bias.uniform_(-1, 1)
    plain = __import__("copy").deepcopy(seq)
    optimize(seq)
    assert isinstance(seq[1], AbsorbedBatchNorm1d) and isinstance(seq[2], AbsorbedSiLU)
    assert set(seq.state_dict()) == set(plain.state_dict())
    x = torch.randn(2, 6, 50)
    seq.eval(), plain.eval()
    with torch.no_grad():
        torch.testing.assert_close(seq(x), plain(x), rtol=1e-5, atol=1e-5)
        seq[1].running_mean.add_(0.5)  # a new version of the statistics: folded again
        plain[1].running_mean.add_(0.5)
        torch.testing.assert_close(seq(x), plain(x), rtol=1e-5, atol=1e-5)
    seq.train(), plain.train()
    torch.testing.assert_close(seq(x), plain(x), rtol=1e-5, atol=1e-5)  # batch statistics: unfused


def test_dispatch_resolves_the_default_and_an_override(tmp_path):
    """The run-time path (runtime.dispatch) with no table serves `torch`; an override's config is
    what launches (here a cuDNN-lane id, which on the CPU runs torch's convolution)."""
    from tunedb import settings
    from tunedb.runtime import dispatch, launch_table

    x = torch.randn(2, 8, 40, dtype=torch.bfloat16)
    w = torch.randn(8, 1, 31, dtype=torch.bfloat16)
    b = torch.randn(8, dtype=torch.bfloat16)
    args = (x, w, b, (1,), (15,), (1,), 8, "silu")
    want = torch.nn.functional.silu(torch.nn.functional.conv1d(x, w, b, 1, 15, 1, 8))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB="off"):
        dispatch.clear()
        bound = dispatch.bound("conv", "conv1d", *args)
        assert bound.config.id == "torch" and bound.signature.get("act") == "silu" and bound.m == 2 * 40
        torch.testing.assert_close(dispatch.call("conv", "conv1d", *args), want)
        with launch_table.overriding(lambda fam, sig, m: (FAMILY.parse_config("cudnn_bench"), "test")):
            assert dispatch.bound("conv", "conv1d", *args).config.id == "cudnn_bench"
            torch.testing.assert_close(dispatch.call("conv", "conv1d", *args), want)
        dispatch.clear()
