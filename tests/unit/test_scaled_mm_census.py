"""The quantized families' census rules: quantized calls on meta tensors become signatures
(torch._scaled_mm per scale mode, torch._int_mm, the families' own ops); other calls do not."""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunedb import families
from tunedb.families import contract
from tunedb.families.scaled_mm import ops

META = "meta"


class RuleRecorder(TorchDispatchMode):
    """The recorder's use of census rules in miniature: a rule table keyed by operator name."""

    def __init__(self):
        super().__init__()
        self.table = {r.op: r for name in ("scaled_mm", "scaled_mm_fp8")
                      for r in contract.hook(families.get(name), "census_rules")()}
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = self.table.get(func.overloadpacket._qualified_op_name)
        if rule is not None:
            key = rule.key(args, kwargs)
            if key is not None:
                self.calls[(key[0].format(), key[1])] += 1
        return func(*args, **kwargs)


def fp8(*shape):
    return torch.empty(shape, dtype=torch.float8_e4m3fn, device=META)


def f32(*shape):
    return torch.empty(shape, device=META)


def test_quantized_calls_become_signatures_on_meta():
    w = fp8(384, 256)  # a buffer, not a Parameter: quantized weights often are
    with torch.no_grad(), RuleRecorder() as rec:
        x = fp8(12, 256)
        torch._scaled_mm(x, w.t(), f32(12, 1), f32(1, 384), out_dtype=torch.bfloat16)
        torch._scaled_mm(x, w.t(), f32(), f32(), out_dtype=torch.bfloat16)
        torch._scaled_mm(x, w.t(), f32(), f32(), out_dtype=torch.float32)  # not served
        xi = torch.empty((40, 64), dtype=torch.int8, device=META)
        wi = torch.empty((32, 64), dtype=torch.int8, device=META)
        torch._int_mm(xi, wi.t())
        torch.mm(torch.empty((4, 8), device=META), torch.empty((8, 2), device=META))  # not quantized
        ops.scaled_mm_fp8(fp8(2, 3, 256), w, f32(6, 2), f32(3, 2))
        ops.scaled_mm_int8_quant(xi, wi, f32(40), f32(32))
    assert rec.calls == Counter({
        ("scaled_mm_fp8|op=scaled_mm|dt=fp8|N=384|K=256|scale=row|out=bf16", 12): 1,
        ("scaled_mm_fp8|op=scaled_mm|dt=fp8|N=384|K=256|scale=tensor|out=bf16", 12): 1,
        ("scaled_mm|op=scaled_mm|dt=int8|N=32|K=64|out=bf16", 40): 1,
        ("scaled_mm_fp8|op=scaled_mm|dt=fp8|N=384|K=256|scale=block|out=bf16", 6): 1,
        ("scaled_mm|op=scaled_mm_quant|dt=int8|N=32|K=64|out=int8", 40): 1,
    })


def test_each_family_owns_its_rules():
    int8 = {r.op for r in families.get("scaled_mm").census_rules()}
    fp8_ops = {r.op for r in families.get("scaled_mm_fp8").census_rules()}
    assert "aten::_int_mm" in int8 and "aten::_scaled_mm" in fp8_ops and not int8 & fp8_ops
