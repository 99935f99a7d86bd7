"""Session 16's model robustness fixes on the GPU: optimize() of an fp32 model under CUDA autocast
computes what the plain model does (dtype and values), and an optimized model with the bmm
product mode compiles with fullgraph=True and matches eager. Expected run time: under 30 s."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tunedb  # noqa: E402
from tunedb.families.bmm import serving as bmm_serving  # noqa: E402
from tunedb.runtime import patching  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the CPU tests' model
from eager_attention import Attention  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("swap_unmeasured")]
nn = torch.nn


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.SiLU(),
                         nn.Linear(512, 64, bias=False)).cuda().eval()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_fp32_model_under_cuda_autocast_matches_the_plain_model(dtype):
    plain = _mlp()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    x = torch.randn(4, 37, 512, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
        want, got = plain(x), tuned(x)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # F.linear under autocast, both


def test_an_fp16_model_under_bf16_autocast_returns_bf16():
    plain = _mlp().half()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    x = torch.randn(8, 512, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        tuned(x)  # an eager call outside autocast first: its key is memoised
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want, got = plain(x), tuned(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fullgraph_compile_with_the_bmm_product_mode(monkeypatch):
    monkeypatch.setattr(patching, "_measured", lambda name: name == "bmm")
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    torch.manual_seed(0)
    plain = Attention(256).cuda().half().eval()
    model = tunedb.optimize(copy.deepcopy(plain))
    assert getattr(model, "_tunedb_bmm_serving", False)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), plain(x), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(model(x), plain(x), rtol=2e-2, atol=2e-2)


def test_group_gemm_bad_expert_id_on_cuda_is_named_under_check_inputs():
    # session 17: TUNEDB_CHECK_INPUTS=1 reads CUDA ids back (a sync) and names the bad one;
    # without it the call is not checked (no sync per call)
    from tunedb import settings
    from tunedb.errors import SignatureError
    from tunedb.runtime import dispatch

    x = torch.randn(64, 256, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(8, 128, 256, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, 8, (64, 2), device="cuda")
    ids[5, 1] = 8
    with settings.override(CHECK_INPUTS="1"):
        tunedb.reload()
        try:
            with pytest.raises(SignatureError, match=r"expert id 8 at \[5, 1\]; ids must be in 0\.\.7"):
                dispatch.call("group_gemm", "group_gemm", x, w, ids)
            ids[5, 1] = 7
            got = dispatch.call("group_gemm", "group_gemm", x, w, ids)
        finally:
            tunedb.reload()
    ref = torch.einsum("tk,tjnk->tjn", x.float(), w[ids].float())  # slot j of token t: expert ids[t, j]
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-1)


def test_depthwise_conv1d_with_a_batch_above_the_grid_limit_runs():
    # session 17: the direct depthwise kernel's grid has one z program per batch row (limit 65535);
    # a larger batch served that kernel failed to launch, and now runs F.conv1d
    from tunedb import families
    from tunedb.families.conv.ops import conv1d
    from tunedb.runtime import launch_table

    fam = families.get("conv")
    picked = []

    def dw_everywhere(family, sig, m):
        if family.name != "conv":
            return None
        picked.append(sig)
        return fam.parse_config("dw_t64_c64_w4"), "test"

    torch.manual_seed(0)
    w = torch.randn(64, 1, 3, dtype=torch.float16, device="cuda")
    for batch in (1000, 70000):
        x = torch.randn(batch, 64, 8, dtype=torch.float16, device="cuda")
        with torch.no_grad(), launch_table.overriding(dw_everywhere):
            got = conv1d(x, w, None, 1, 1, 1, 64)
        ref = torch.nn.functional.conv1d(x.float(), w.float(), None, 1, 1, 1, 64)
        torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2)
    assert len(picked) >= 2  # the dw config was the pick at both sizes; the large batch ran torch
