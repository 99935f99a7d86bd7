"""A CUDA call of the quantized ops hands every arm the weight and scales in layouts the vendor
arm takes (ops.dense): fp8 heuristic rule 2 serves torch._scaled_mm for every untuned per-tensor /
row-wise call, which refuses a weight passed as a transposed view and an expanded row scale (the
Triton lanes copied them). torch._scaled_mm's meta kernel carries the CUDA layout checks, so meta
tensors show here what a CUDA call would refuse."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tunedb.families.scaled_mm import arms, keys, ops  # noqa: E402

M, N, K = 32, 64, 128


def _meta(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@pytest.mark.parametrize("scale", ["row", "tensor"])
def test_the_vendor_arm_takes_a_transposed_weight_view_and_an_expanded_scale(scale):
    x = torch.zeros(M, K).to(torch.float8_e4m3fn)
    w_view = torch.zeros(K, N).to(torch.float8_e4m3fn).t()  # [N, K], column-major
    if scale == "row":
        sx, sw = torch.ones(1, 1).expand(M, 1), torch.ones(N)
    else:
        sx, sw = torch.ones(()), torch.ones(())
    sig, _ = keys.signature_of("scaled_mm", x, w_view, sx, sw, torch.bfloat16, None)
    assert sig.get("scale") == scale
    run = arms.torch_arm(sig)
    x, w_view, sx, sw = (_meta(t) for t in (x, w_view, sx, sw))
    if scale == "row":  # as the call came in: refused
        with pytest.raises(RuntimeError):
            run(x, w_view, sx, sw)
    y = run(x, *ops.dense(w_view, sx, sw))
    assert tuple(y.shape) == (M, N) and y.dtype == torch.bfloat16
