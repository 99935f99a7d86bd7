"""The eager host path on the GPU: a TunedLinear's memoised fast path (torch-served keys through
F.linear with no launcher frame, Triton keys through their launcher), counted, bit for bit what
the launcher computes, captured into a CUDA graph; and the bmm product mode backing off past 8
forwards on a Llama-style fp32 rotary product that no table tiles. About 10 s on the H200."""
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from tunedb.families.bmm import serving  # noqa: E402
from tunedb.families.gemm import FAMILY  # noqa: E402
from tunedb.families.gemm.ops import ACTS  # noqa: E402
from tunedb.families.gemm.patching import TunedLinear  # noqa: E402
from tunedb.records import Config  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402

pytestmark = pytest.mark.gpu

TILE = "b64x64x64_w4_s3_g8"


def _pin(config_id):
    cfg = Config.sentinel(config_id) if config_id == "torch" else FAMILY.parse_config(config_id)
    return launch_table.overriding(lambda family, sig, m: (cfg, "pin"))


def _key(op, act, x, w, b):
    return (op, act, x.shape, x.dtype, w.shape, w.dtype,
            None if b is None else (b.shape, b.dtype, b.is_contiguous()))


@pytest.mark.parametrize("served", ["torch", TILE])
@pytest.mark.parametrize("bias,act", [(False, "none"), (True, "none"), (True, "silu")])
def test_repeated_calls_take_the_memo_count_and_match_the_launcher(served, bias, act):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 192, bias=bias, device="cuda", dtype=torch.bfloat16)
    layer = TunedLinear(lin, act)
    x = torch.randn(2, 8, 256, device="cuda", dtype=torch.bfloat16)
    op = "gemm" if not bias and act == "none" else "gemm_act"
    with _pin(served), torch.inference_mode():
        first = layer(x)
        bound = launch_table.known(_key(op, act, x, lin.weight, lin.bias))
        assert bound is not None and bound.config.id == served
        assert (bound.direct is F.linear) == (served == "torch" and act == "none")
        calls = bound.calls
        again = [layer(x) for _ in range(3)]
        assert bound.calls == calls + 3
        want = bound.call(x, lin.weight, lin.bias, None)
        for y in (first, *again):
            assert torch.equal(y, want)
        ref = ACTS[act](F.linear(x.float(), lin.weight.float(), None if lin.bias is None else lin.bias.float()))
        assert ((want.float() - ref).norm() / ref.norm()).item() < 2e-2
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = layer(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want)


def test_an_fp32_rotary_product_no_table_tiles_backs_off_past_8_forwards(monkeypatch):
    """Llama's rotary embedding (inv_freq @ positions in fp32, K = 1) is a product the mode folds
    and torch serves; no shipped table tiles fp32, so it must not hold the back-off at 8."""
    entered = []
    real = serving.product_mode
    monkeypatch.setattr(serving, "product_mode", lambda: entered.append(len(calls)) or real())
    inv = torch.rand(64, device="cuda")
    pos = torch.arange(1, device="cuda")[None]

    class Rotary(torch.nn.Module):
        def forward(self, x):
            calls.append(1)
            freqs = (inv[None, :, None].float().expand(1, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
            return x * freqs.cos().sum()

    calls: list = []
    model = serving.install(Rotary())
    assert serving.fold(inv[None, :, None].expand(1, -1, 1), pos[:, None, :].float()) is not None
    from tunedb.families.bmm import keys

    a3, b3, _ = serving.fold(inv[None, :, None].expand(1, -1, 1), pos[:, None, :].float())
    assert not serving.may_become_tile(keys.signature_of("bmm", a3, b3)[0])
    x = torch.ones(4, device="cuda")
    with torch.inference_mode():
        for _ in range(80):
            model(x)
    gaps = [b - a - 1 for a, b in zip(entered, entered[1:])]
    assert gaps[:4] == [1, 2, 4, 8] and max(gaps) > 8, gaps
