"""bench/read_roofline.py's read kernel on the GPU: every config (one CTA per block, persistent
grids, with and without PDL) reads every element of a bf16 weight exactly once, eagerly and
replayed from a CUDA graph on poisoned partials, at an even and an uneven size. The roofline of
bench/decode_limit.py is only a ceiling if the read it times is complete. About 15 s on an H200
(8 small Triton binaries)."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import read_roofline as rr  # noqa: E402


@pytest.mark.parametrize("numel", [16384 * 40, 16384 * 40 + 13])
@pytest.mark.parametrize("cfg", rr.configs(quick=False), ids=lambda c: c.id)
def test_read_sums_every_element_once_in_a_graph(cfg, numel):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fn = rr.launcher(cfg, numel, sms)
    torch.manual_seed(0)
    w = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    ones = torch.ones(numel, device="cuda", dtype=torch.bfloat16)
    out = torch.full((fn.grid,), float("nan"), device="cuda")
    assert fn(ones, out).double().sum().item() == numel
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(w, out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(w, out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = w.double().sum().item()
    assert abs(out.double().sum().item() - ref) <= 1e-4 * numel ** 0.5
