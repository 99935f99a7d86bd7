"""On the GPU: a user-tier split-K pick for a microsecond GEMM serves its captured calls, and the
torch arm serves its eager ones (runtime/host_bound.py); both outputs match the fp32 reference."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import database, settings  # noqa: E402
from tunedb.families.gemm import FAMILY, ops  # noqa: E402
from tunedb.records import Entry, Region, Signature  # noqa: E402
from tunedb.runtime import host_bound, launch_table, selector  # noqa: E402

pytestmark = pytest.mark.gpu

SPLITK = "sk8_b16x64x128_w4_s4"


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_split_k_serves_captured_calls_and_torch_eager_ones(tiers_dirs, monkeypatch, enabled):
    n, k, m = 1024, 4096, 1
    sig = Signature.parse(f"gemm|op=gemm|dt=bf16|N={n}|K={k}")
    cfg = FAMILY.parse_config(SPLITK)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(16, cfg.id),))], [cfg])
    seen = []
    real = host_bound._capturing
    monkeypatch.setattr(host_bound, "_capturing", lambda: seen.append(real()) or seen[-1])
    with settings.override(EAGER_FALLBACK=enabled):
        selector.reload()
        (x, w, _bias), _ = FAMILY.make_inputs(sig, m, "cuda", 0)
        ref = x.float() @ w.float().T
        eager = ops.gemm(x, w)
        bound = launch_table.launcher("gemm", x, w, None, "none", m)
        assert (bound.tier, bound.config.id) == ("user", SPLITK)
        assert bound.eager == ("torch" if enabled == "1" else None)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ops.gemm(x, w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = ops.gemm(x, w)
        graph.replay()
        torch.cuda.synchronize()
    assert _rel(eager, ref) < 1e-2 and _rel(captured, ref) < 1e-2
    direct_torch = FAMILY.launch(_torch(), sig, x, w)
    direct_splitk = FAMILY.launch(cfg, sig, x, w)
    if enabled == "1":
        assert torch.equal(eager, direct_torch)  # eager: the torch arm
        assert True in seen and False in seen  # the capture was told apart from eager calls
    else:
        assert torch.equal(eager, direct_splitk) and not seen
    assert torch.equal(captured, direct_splitk)  # captured: the tuned split-K config


def _torch():
    from tunedb.records import Config

    return Config.sentinel("torch")
