"""torchao-quantized models on the GPU (needs torchao: pip install --no-deps
.stage/wheels/torchao-0.18.0-*.whl): optimize() serves each W8A8 Linear through tunedb's op, within
8-bit rounding of torchao's own path and of the bf16 model, also inside a captured CUDA graph; the
census of the real CUDA model (torchao's kernels running) keys the same points as on meta, once.
torchao's own block-scaled kernel autotunes 48 Triton configs per width on first use (minutes), so
fp8-block is compared with the bf16 model only and left out of the CUDA census test."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

import tunedb  # noqa: E402
from tunedb.families.scaled_mm import torchao_bridge as tb  # noqa: E402

pytestmark = pytest.mark.gpu
SCHEMES = ["fp8-rowwise", "fp8-block", "int8"]


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(1024, 2048, bias=False)
        self.down = torch.nn.Linear(2048, 1024, bias=True)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def models(scheme, device="cuda"):
    torch.manual_seed(0)
    full = Two().to(device, torch.bfloat16)
    base, ours = Two().to(device, torch.bfloat16), Two().to(device, torch.bfloat16)
    base.load_state_dict(full.state_dict())
    ours.load_state_dict(full.state_dict())
    tb.quantize_model(base, scheme, device)
    tb.quantize_model(ours, scheme, device)
    return full, base, tunedb.optimize(ours)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 16, 300])
def test_optimized_matches_torchao_and_bf16(scheme, m):
    full, base, ours = models(scheme)
    assert type(ours.up).__name__ == "QuantizedLinear"
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref, y = full(x), ours(x)
        theirs = base(x) if scheme != "fp8-block" else None
    assert y.dtype == torch.bfloat16 and y.shape == (m, 1024)
    assert rel(y, ref) < 0.08
    if theirs is not None:
        assert rel(y, theirs) < 0.08
        assert rel(y, ref) < 2.0 * rel(theirs, ref) + 0.01  # no worse than torchao's own rounding


@pytest.mark.parametrize("scheme", SCHEMES)
def test_optimized_model_in_a_cuda_graph(scheme):
    _, _, ours = models(scheme)
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = ours(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ours(x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = ours(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert "quantized layer(s) over 2 signature(s) (Two)" in tunedb.tuning_report()


@pytest.mark.parametrize("scheme", ["fp8-rowwise", "int8"])
def test_cuda_census_keys_like_meta(scheme):
    from tunedb.census.recorder import Recorder

    keys = {}
    for device in ("meta", "cuda"):
        model = Two().to(device, torch.bfloat16)
        tb.quantize_model(model, scheme, device)
        x = torch.randn(4, 8, 1024, device=device, dtype=torch.bfloat16) if device == "cuda" else \
            torch.empty(4, 8, 1024, device=device, dtype=torch.bfloat16)
        with torch.no_grad(), Recorder() as aten_rec, tb.recorder() as rec:
            model(x)
        assert not [k for k in aten_rec.calls if k[0].family.startswith("scaled_mm")]  # counted once
        keys[device] = rec.calls
    assert keys["cuda"] == keys["meta"] and sum(keys["cuda"].values()) == 2
