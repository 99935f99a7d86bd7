"""The census of a full-precision model quantized online with torchao (tunedb census
--quantization): on meta tensors every quantized Linear becomes a scaled_mm / scaled_mm_fp8 point
keyed by its weight (scale mode from the scale's shape), counted once, with the Llama-3-8B widths;
a missing torchao is a clear CensusError naming it; weight-only or unserved calls get no key."""
from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch

from tunedb.errors import CensusError
from tunedb.families.scaled_mm import torchao_bridge as tb


def test_missing_torchao_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    with pytest.raises(CensusError, match=r"--quantization int8 quantizes the model with torchao.*pip install torchao=="):
        tb.require_torchao("int8")
    from tunedb.census.presets import workload
    from tunedb.census.probe import take_census

    with pytest.raises(CensusError, match="torchao"):
        take_census(workload("llama-3-8b"), "decode", 2, quantization="fp8-rowwise")


def test_unknown_scheme_lists_the_schemes():
    with pytest.raises(CensusError, match="unknown quantization scheme 'fp4'; schemes are fp8-rowwise, fp8-block, int8"):
        tb.require_torchao("fp4")


torchao = pytest.importorskip("torchao")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 384, bias=False)
        self.down = torch.nn.Linear(384, 256, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.mark.parametrize("scheme, family, scale", [("fp8-rowwise", "scaled_mm_fp8", "row"),
                                                   ("fp8-block", "scaled_mm_fp8", "block"),
                                                   ("int8", "scaled_mm", None)])
def test_quantized_linears_are_keyed_once_on_meta(scheme, family, scale):
    from tunedb.census.recorder import Recorder
    from tunedb.families.scaled_mm.keys import make_signature

    model = Tiny().to("meta", torch.bfloat16)
    assert tb.quantize_model(model, scheme, "meta") == 2
    x = torch.empty((3, 5, 256), dtype=torch.bfloat16, device="meta")
    with torch.no_grad(), Recorder() as aten_rec, tb.recorder() as rec:
        y = model(x)
        model(x)
    assert y.shape == (3, 5, 256) and y.device.type == "meta"
    sig = lambda n, k: make_signature(family, "scaled_mm", n, k, "bf16", scale or "row")  # noqa: E731
    assert rec.calls == Counter({(sig(384, 256), 15): 2, (sig(256, 384), 15): 2})
    assert not [k for k in aten_rec.calls if k[0].family.startswith("scaled_mm")]  # not counted twice


def test_weight_only_and_fp32_activations_get_no_key():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = Tiny().to(torch.bfloat16)
    quantize_(model, Int8WeightOnlyConfig())
    assert not tb.is_quantized(model.up.weight)
    assert tb.linear_key(torch.empty(2, 256, dtype=torch.bfloat16), model.up.weight) is None
    q = Tiny().to("meta", torch.bfloat16)
    tb.quantize_model(q, "int8", "meta")
    assert tb.linear_key(torch.empty(2, 256, device="meta"), q.up.weight) is None  # fp32 x: unserved


def test_llama_census_with_quantization():
    from tunedb.census.presets import workload
    from tunedb.census.probe import take_census

    census = take_census(workload("llama-3-8b"), "decode", 4, impl="mirror", quantization="fp8-rowwise")
    fp8 = [p for p in census.points if p.signature.family == "scaled_mm_fp8"]
    widths = {(p.signature.get("N"), p.signature.get("K")) for p in fp8}
    assert widths == {(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)}
    assert {p.signature.get("scale") for p in fp8} == {"row"}
    assert not [p for p in census.points if p.signature.family == "gemm" and p.signature.op == "gemm"]
    assert dict(census.meta)["quantization"] == "fp8-rowwise"


@pytest.mark.parametrize("scheme, family, scale", [("fp8-rowwise", "scaled_mm_fp8", "row"),
                                                   ("fp8-block", "scaled_mm_fp8", "block"),
                                                   ("int8", "scaled_mm", "row")])
def test_optimize_serves_torchao_linears_through_the_tuned_op(scheme, family, scale):
    """optimize() swaps each torchao W8A8 Linear for a QuantizedLinear (the GEMM family leaves
    them alone); on the CPU its output is the dequantized product of the same weight and the
    activation quantized as the scheme does: close to the full-precision Linear."""
    import tunedb
    from tunedb.families.scaled_mm.patching import quantized_linear_class

    torch.manual_seed(0)
    model = Tiny().to(torch.bfloat16)
    full = Tiny().to(torch.bfloat16)
    full.load_state_dict(model.state_dict())
    tb.quantize_model(model, scheme, "cpu")
    x = torch.randn(2, 7, 256, dtype=torch.bfloat16)
    out = tunedb.optimize(model, families="all")  # no measured scaled_mm table: ask for the family
    cls = quantized_linear_class()
    assert isinstance(out.up, cls) and isinstance(out.down, cls)
    assert out.up.family == family and out.up.scale == scale
    assert out.up.qweight.data_ptr() == out.up.torchao_weight.qdata.data_ptr()  # shared, not copied
    with torch.no_grad():
        y, ref = out(x).float(), full(x).float()
    assert y.shape == (2, 7, 256) and y.dtype == torch.float32
    assert ((y - ref).norm() / ref.norm()).item() < 0.08  # 8-bit rounding of both operands
    report = tunedb.tuning_report()
    assert f"{family}: 2 quantized layer(s) over 2 signature(s) (Tiny): 0 with a tuning entry, 0 on the shape heuristic, 2 not yet run on a GPU" in report
    assert "gemm: 0 linear" not in report


def test_quantized_input_matches_the_scheme():
    from tunedb.families.scaled_mm.patching import quantized_linear_class

    model = Tiny().to(torch.bfloat16)
    tb.quantize_model(model, "fp8-block", "cpu")
    layer = quantized_linear_class()(model.up)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    x[1, 130] = 1000.0  # one large value: only its 1x128 block's scale grows
    q, s = layer.quantize_input(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 2)
    assert s[1, 1] == pytest.approx(1000.0 / 448) and s[1, 0] < 1.0
    back = (q.float().view(3, 2, 128) * s.unsqueeze(2)).view(3, 256)
    assert ((back - x.float()).norm() / x.float().norm()).item() < 0.07


def test_asymmetric_activations_are_not_served():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, MappingType, quantize_

    model = Tiny().to(torch.bfloat16)
    try:
        quantize_(model, Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC))
    except TypeError:
        pytest.skip("this torchao has no asymmetric int8 activations")
    assert not tb.is_quantized(model.up.weight)
    import tunedb

    assert type(tunedb.optimize(model).up) is torch.nn.Linear  # left to torchao


@pytest.mark.parametrize("scheme", ["fp8-rowwise", "fp8-block", "int8"])
def test_layer_signature_is_the_key_its_calls_resolve(scheme):
    """The report finds a layer's calls in the selector's counters by layer.signature(): it must
    be the key the op computes from the call's tensors."""
    from tunedb.families.scaled_mm import ops
    from tunedb.families.scaled_mm.patching import quantized_linear_class

    model = Tiny().to(torch.bfloat16)
    tb.quantize_model(model, scheme, "cpu")
    layer = quantized_linear_class()(model.up)
    q, s = layer.quantize_input(torch.randn(5, 256, dtype=torch.bfloat16))
    fam = "scaled_mm" if scheme == "int8" else "scaled_mm_fp8"
    sig, m = ops._key(fam, "scaled_mm", q, layer.qweight, s, layer.w_scale,
                      "" if scheme == "int8" else layer.scale, torch.bfloat16)
    assert (sig, m) == (layer.signature(), 5)


def test_fused_census_of_a_quantized_model_keys_the_same_points():
    """--fused takes the census of optimize(model): its QuantizedLinears record themselves, so the
    quantized points equal the aten-level census's."""
    from tunedb.census.presets import workload
    from tunedb.census.probe import take_census

    def quantized(fused):
        c = take_census(workload("llama-3-8b"), "decode", 2, impl="mirror", fused=fused, quantization="int8")
        return {(p.signature, p.m, p.calls) for p in c.points if p.signature.family == "scaled_mm"}

    plain, fused = quantized(False), quantized(True)
    assert plain and fused == plain


def test_a_quantized_linear_keeps_the_linears_state_dict_keys_and_weight():
    """Checkpoints of the model before optimize() load after it, and `.weight` is still the
    torchao tensor (an earlier layer renamed it torchao_weight)."""
    import io

    import tunedb

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384)).to(torch.bfloat16)
    tb.quantize_model(model, "int8", "cpu")
    keys = sorted(model.state_dict())
    before = {k: v for k, v in model.state_dict().items()}
    tunedb.optimize(model, families="all")
    assert sorted(model.state_dict()) == keys == ["0.bias", "0.weight"]
    assert model[0].weight is model[0].torchao_weight and tb.is_quantized(model[0].weight)
    model.load_state_dict(before)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))


def test_int8_per_tensor_weights_and_empty_batches():
    """An int8 weight quantized per tensor (one scale) is served with that scale on every channel;
    an fp8 per-tensor layer given no rows returns no rows."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, PerTensor, quantize_

    import tunedb
    from tunedb.families.scaled_mm.patching import quantized_linear_class

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 384, bias=False)).to(torch.bfloat16)
    full = torch.nn.Sequential(torch.nn.Linear(256, 384, bias=False)).to(torch.bfloat16)
    full.load_state_dict(model.state_dict())
    try:
        quantize_(model, Int8DynamicActivationInt8WeightConfig(granularity=PerTensor()))
    except (TypeError, ValueError) as exc:  # a torchao without per-tensor int8
        pytest.skip(f"this torchao has no per-tensor int8 config: {exc}")
    tunedb.optimize(model, families="all")
    assert isinstance(model[0], quantized_linear_class()) and model[0].w_scale.shape == (384, 1)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        y, ref = model(x).float(), full(x).float()
        assert ((y - ref).norm() / ref.norm()).item() < 0.08
        assert model(x[:0]).shape == (0, 384)

    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

    fp8 = Tiny().to(torch.bfloat16)
    try:
        quantize_(fp8, Float8DynamicActivationFloat8WeightConfig(granularity=PerTensor()))
    except Exception as exc:  # noqa: BLE001 - fp8 per tensor needs a capable torchao / device check
        pytest.skip(f"fp8 per-tensor quantization unavailable here: {exc}")
    tunedb.optimize(fp8, families="all")
    if isinstance(fp8.up, quantized_linear_class()) and fp8.up.scale == "tensor":
        with torch.no_grad():
            assert fp8.up(torch.randn(0, 256, dtype=torch.bfloat16)).shape == (0, 384)


def test_an_int8_layer_is_keyed_by_the_activation_dtype_it_runs():
    import tunedb

    model = Tiny().to(torch.bfloat16)
    tb.quantize_model(model, "int8", "cpu")
    tunedb.optimize(model, families="all")
    assert model.up.signature().format().count("bf16") == 1
    with torch.no_grad():
        model(torch.randn(2, 256, dtype=torch.float16))
    assert "fp16" in model.up.signature().format() and "bf16" not in model.up.signature().format()


@pytest.mark.parametrize("scheme", ["int8", "fp8-rowwise"])
def test_dtype_casts_after_optimize_keep_the_operands(scheme):
    """`.to(torch.bfloat16)` cast the fp32 weight-scale buffer (the next call refused it) and would
    cast fp8 data; the operands are taken from the torchao weight again after any cast."""
    import tunedb

    torch.manual_seed(0)
    model = Tiny().to(torch.bfloat16)
    tb.quantize_model(model, scheme, "cpu")
    tunedb.optimize(model, families="all")
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        before = model(x)
        model.to(torch.bfloat16)
        assert model.up.w_scale.dtype == torch.float32 and model.up.qweight.dtype == model.up.weight.qdata.dtype
        torch.testing.assert_close(model(x), before)
