"""The lean launch path on the GPU: launch sites call Triton's compiled binary directly and compute
bit for bit what JITFunction.run computes, on every lane and specialisation; the ops' call memo
serves repeated eager calls, counts them, and lets go at a new epoch."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import database, settings  # noqa: E402

from tunedb.runtime import selector
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import FAMILY, launch  # noqa: E402
from tunedb.families.gemm.triton_launch import Site  # noqa: E402
from tunedb.records import Entry, Region, Signature  # noqa: E402
from tunedb.families.gemm import ops  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
LANES = {"triton_mma": "b64x64x64_w4_s3_g8", "triton_tma": "tma_b128x128x64_w8_s4_g8",
         "triton_splitk": "sk4_b16x64x256_w4_s3"}


def _sites(run):
    return [c.cell_contents for c in run.__closure__ or () if isinstance(c.cell_contents, Site)]


@pytest.mark.parametrize("lane", sorted(LANES))
def test_direct_launch_matches_jit_launch_bit_for_bit(lane):
    cfg = FAMILY.parse_config(LANES[lane])
    assert cfg.lane == lane
    sig = Signature.parse("gemm|op=gemm_act|dt=bf16|N=384|K=512|act=gelu|bias=1")
    direct = launch._build(cfg, sig)
    with settings.override(JIT_LAUNCH="1"):
        jit = launch._build(cfg, sig)
        (x, w, b), _ = FAMILY.make_inputs(sig, 16, "cuda", 0)
        jit(x, w, b, None)  # a site reads the setting at its first call
    direct(x, w, b, None)
    for m in (1, 16, 17, 200):
        if FAMILY.invalid_reason(cfg, sig, m, SM90) is not None:
            continue
        (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", m)
        odd = torch.empty(m * 512 + 1, dtype=x.dtype, device="cuda")[1:].view(m, 512)
        odd.copy_(x)  # a misaligned view: another binary than the aligned x
        ref = FAMILY.reference(sig, x, w, b)
        for inp in (x, odd, x):
            want = jit(inp, w, b, None)
            got = direct(inp, w, b, None)
            got2 = direct(inp, w, b, None)  # the second call of a specialisation is direct
            torch.cuda.synchronize()
            assert torch.equal(got, want) and torch.equal(got2, want), (lane, m)
            err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, (lane, m, err)
    assert sum(s.binaries() for s in _sites(direct)) >= 2  # direct launches happened
    assert sum(s.binaries() for s in _sites(jit)) == 0


def test_direct_launch_inside_a_cuda_graph_replays_the_same_kernel():
    cfg = FAMILY.parse_config(LANES["triton_tma"])
    sig = Signature.parse("gemm|op=gemm|dt=fp16|N=256|K=256")
    run = launch._build(cfg, sig)
    (x, w, _), _ = FAMILY.make_inputs(sig, 64, "cuda", 3)
    eager = run(x, w, None, None)
    out = torch.empty_like(eager)
    run(x, w, None, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(x, w, None, out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_repeated_eager_calls_take_the_call_memo_and_count(tiers_dirs):
    sig = Signature.parse("gemm|op=gemm|dt=bf16|N=256|K=128")
    (x, w, _), _ = FAMILY.make_inputs(sig, 24, "cuda", 5)
    ref = FAMILY.reference(sig, x, w)
    with torch.inference_mode():
        first = ops.gemm(x, w)
        key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
        bound = launch_table.known(key)
        assert bound is not None
        calls = bound.calls
        for _ in range(3):
            again = ops.gemm(x, w)
        assert bound.calls == calls + 3
        assert torch.equal(again, first)
        assert ((again.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
        cfg = FAMILY.parse_config(LANES["triton_mma"])
        database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(64, cfg.id),))], [cfg])
        assert launch_table.known(key) is bound  # nothing changes before reload()
        selector.reload()
        assert launch_table.known(key) is None
        tuned = ops.gemm(x, w)
        after = launch_table.known(key)
        assert (after.tier, after.config.id) == ("user", cfg.id)
        assert ((tuned.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
        with launch_table.recording() as sink:
            ops.gemm(x, w)
        assert [(str(s), m) for _, s, m in sink] == [(str(sig), 24)]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_layer_on_another_gpu_runs_there(tiers_dirs):
    # device_map="auto" places layers on several GPUs while the current device stays cuda:0
    cfg = FAMILY.parse_config(LANES["triton_mma"])
    sig = Signature.parse("gemm|op=gemm|dt=bf16|N=256|K=128")
    (x, w, _), _ = FAMILY.make_inputs(sig, 32, "cuda:1", 7)
    ref = FAMILY.reference(sig, x, w)
    with launch_table.overriding(lambda fam, s, m: (cfg, "pinned")), torch.inference_mode():
        assert torch.cuda.current_device() == 0
        for _ in range(3):  # the first call, then what would be the memo's
            y = ops.gemm(x, w)
            torch.cuda.synchronize(1)
            assert y.device == x.device
            assert ((y.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2
        assert torch.cuda.current_device() == 0
