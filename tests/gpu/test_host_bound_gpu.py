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


def test_a_one_row_gv_pick_is_primed_eagerly_served_by_torch_eagerly_and_tuned_in_a_graph(tiers_dirs):
    """The equal-launches rule (session 43): a user-tier one-launch GEMV pick for a microsecond
    GEMM (a tensor-parallel q_proj at one row) serves eager calls with torch's bits; the first
    eager call also runs the pick once, so its split-K workspace exists before the capture, which
    runs the pick and replays the fp32 reference's result on new inputs."""
    from tunedb.families.gemm import launch

    n, k, m, gv = 1024, 4096, 1, "gv1_n8x512_w4_s5_lr"
    sig = Signature.parse(f"gemm|op=gemm|dt=bf16|N={n}|K={k}")
    cfg = FAMILY.parse_config(gv)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(1, cfg.id),))], [cfg])
    selector.reload()
    (x, w, _bias), _ = FAMILY.make_inputs(sig, m, "cuda", 0)
    eager = ops.gemm(x, w)
    bound = launch_table.launcher("gemm", x, w, None, "none", m)
    assert (bound.config.id, bound.eager) == (gv, "torch")
    assert torch.equal(eager, FAMILY.launch(_torch(), sig, x, w))
    made = {key: dict(v) for key, v in launch._DECODE_SCRATCH.items() if key[0] == launch.plain_decode_id(gv)}
    assert made and all(made.values())  # the prime made the pick's workspace outside any capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.gemm(x, w)
    for seed in range(3):
        x.copy_(FAMILY.make_inputs(sig, m, "cuda", seed + 1)[0][0])
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(captured, x.float() @ w.float().T) < 1e-2
        assert torch.equal(captured, FAMILY.launch(cfg, sig, x, w))  # captured: the pick's own bits
