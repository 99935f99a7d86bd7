"""The quantized families' census rules through the census recorder: quantized calls on meta
tensors (weights as buffers, as quantized models keep them) become signatures per scale mode;
unserved outputs and full-precision products are not theirs."""
from collections import Counter

import torch

from tunedb import families
from tunedb.census.recorder import Recorder

META = "meta"


def fp8(*shape):
    return torch.empty(shape, dtype=torch.float8_e4m3fn, device=META)


def f32(*shape):
    return torch.empty(shape, device=META)


class QuantLinear(torch.nn.Module):
    """A W8A8 linear as quantized checkpoints hold it: the weight and its scales are buffers."""

    def __init__(self, n, k, scale):
        super().__init__()
        self.scale = scale
        self.register_buffer("weight", fp8(n, k))
        self.register_buffer("w_scale", f32(1, n) if scale == "row" else f32())

    def forward(self, x):
        m = x.shape[0]
        sx = f32(m, 1) if self.scale == "row" else f32()
        return torch._scaled_mm(x, self.weight.t(), sx, self.w_scale, out_dtype=torch.bfloat16)


def test_quantized_calls_become_signatures_on_meta():
    row, tensor = QuantLinear(384, 256, "row"), QuantLinear(384, 256, "tensor")
    wi = torch.empty((32, 64), dtype=torch.int8, device=META)
    with torch.no_grad(), Recorder(families=("scaled_mm", "scaled_mm_fp8")) as rec:
        x = fp8(12, 256)
        row(x)
        row(x)
        tensor(x)
        torch._scaled_mm(x, row.weight.t(), f32(), f32(), out_dtype=torch.float32)  # not served
        # block scales as torch takes them: 1x128 for x [M, K/128], 128x128 for b = W.t() [K/128, N/128]
        torch._scaled_mm(fp8(6, 256), row.weight.t(), f32(6, 2), f32(3, 2).t(), out_dtype=torch.bfloat16)
        torch._int_mm(torch.empty((40, 64), dtype=torch.int8, device=META), wi.t())
        torch.mm(f32(4, 8), f32(8, 2))  # not quantized
    assert rec.calls == Counter({
        (families.get("scaled_mm_fp8").make_signature("scaled_mm", 384, 256, "bf16", "row"), 12): 2,
        (families.get("scaled_mm_fp8").make_signature("scaled_mm", 384, 256, "bf16", "tensor"), 12): 1,
        (families.get("scaled_mm_fp8").make_signature("scaled_mm", 384, 256, "bf16", "block"), 6): 1,
        (families.get("scaled_mm").make_signature("scaled_mm", 32, 64, "bf16"), 40): 1,
    })


def test_the_default_recorder_sees_quantized_and_gemm_calls_side_by_side():
    lin = torch.nn.Linear(64, 32, device=META, dtype=torch.bfloat16)
    with torch.no_grad(), Recorder() as rec:
        lin(torch.empty((5, 64), device=META, dtype=torch.bfloat16))
        torch._int_mm(torch.empty((40, 64), dtype=torch.int8, device=META),
                      torch.empty((32, 64), dtype=torch.int8, device=META).t())
    assert sorted(sig.family for sig, _ in rec.calls) == ["gemm", "scaled_mm"]


def test_each_family_owns_its_rules():
    int8 = {op for r in families.get("scaled_mm").census_rules() for op in r.aten}
    fp8_ops = {op for r in families.get("scaled_mm_fp8").census_rules() for op in r.aten}
    assert int8 == {"_int_mm"} and fp8_ops == {"_scaled_mm"}
