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


def test_a_tuned_linear_answers_a_primed_eager_torch_size_with_f_linear_and_a_capture_still_gets_the_pick(tiers_dirs):
    """A served TunedLinear whose size the eager rule gives to torch (eager_sizes.py): the first
    eager call goes through the bound launcher (priming the pick), later eager calls on the default
    stream are F.linear's bits straight from the layer's memo and still counted on the Bound; a
    capture (a side stream) runs the pick; a reload (a new launch-table generation) empties the
    memo's say until an eager call fills it again."""
    from torch import nn

    import tunedb
    from tunedb.families.gemm.patching import TunedLinear

    n, k, gv = 1024, 4096, "gv1_n8x512_w4_s5_lr"
    sig = Signature.parse(f"gemm|op=gemm|dt=bf16|N={n}|K={k}")
    cfg = FAMILY.parse_config(gv)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(1, cfg.id),))], [cfg])
    selector.reload()
    lin = tunedb.optimize(nn.Sequential(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)))[0]
    assert isinstance(lin, TunedLinear)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x, lin.weight)
    with torch.no_grad():
        outs = [lin(x) for _ in range(3)]
        bound = launch_table.launcher("gemm", x, lin.weight, None, "none", 1)
        assert (bound.config.id, bound.eager) == (gv, "torch")
        memo = lin.__dict__["_eager_sizes"]
        assert memo.bounds == {(x.shape, x.dtype, True): bound} and memo.weight == id(lin.weight)
        calls = bound.calls
        assert torch.equal(lin(x), want) and bound.calls == calls + 1  # answered by the memo, counted
        assert all(torch.equal(o, want) for o in outs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = lin(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, FAMILY.launch(cfg, sig, x, lin.weight))  # the pick, not F.linear
        assert _rel(captured, x.float() @ lin.weight.float().T) < 1e-2
        selector.reload()
        assert memo.generation != launch_table.generation[0]
        assert torch.equal(lin(x), want)
