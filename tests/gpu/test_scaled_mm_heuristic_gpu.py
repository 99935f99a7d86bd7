"""The untuned fp8 choice on the GPU: a shape no table names runs torch._scaled_mm itself for
per-tensor and row-wise scales (bit for bit), and the Triton tile for block scales (within 4x
bf16 rounding of the fp32 reference). About 10 s on the H200."""
import pytest
import torch

from tunedb import families
from tunedb.families.scaled_mm import ops

pytestmark = pytest.mark.gpu
FP8 = families.get("scaled_mm_fp8")
WHISPER = ((1280, 1280), (5120, 1280), (1280, 5120))


@pytest.mark.parametrize("scale", ["tensor", "row"])
@pytest.mark.parametrize("n, k", WHISPER)
@pytest.mark.parametrize("m", [1, 16, 2048])
def test_unseen_shape_runs_the_vendor_op(scale, n, k, m):
    sig = FP8.make_signature("scaled_mm", n, k, "bf16", scale)
    x, w, sx, sw = FP8.make_inputs(sig, m, "cuda", seed=m)[0]
    assert ops.served("scaled_mm_fp8", sig, m).id == "torch"
    y = ops.scaled_mm_fp8(x, w, sx, sw)
    want = FP8.launch(FP8.parse_config("torch"), sig, x, w, sx, sw)
    assert torch.equal(y, want)


@pytest.mark.parametrize("m", [1, 2048])
def test_unseen_block_shape_runs_the_tile(m):
    sig = FP8.make_signature("scaled_mm", 1280, 5120, "bf16", "block")
    x, w, sx, sw = FP8.make_inputs(sig, m, "cuda", seed=m)[0]
    assert ops.served("scaled_mm_fp8", sig, m).lane == "triton_mma"
    y = ops.scaled_mm_fp8(x, w, sx, sw).float()
    ref = FP8.reference(sig, x, w, sx, sw)
    rounding = ((ref.to(torch.bfloat16).float() - ref).abs().max() / ref.abs().max()).item()
    assert ((y - ref).abs().max() / ref.abs().max()).item() <= 4 * rounding + 1e-4
