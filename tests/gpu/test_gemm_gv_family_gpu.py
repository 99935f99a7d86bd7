"""The `gv` configs through the GEMM family's own path on the GPU: FAMILY.launcher (launch._decode
-> launch_gemv) at the Llama-3-8B decode widths and M = 1, 3, 16 for every config of the space the
predicate admits, against the fp64 product, eager and replayed from a captured CUDA graph (the
split-K workspace made by splitk_scratch); then a table built with a fake timer (gv fastest at
M <= 16) as the system tier, and the public op `gemm_act` served by it (the selector answers a gv
config) eager and inside a graph. About 20-40 s on the H200: ~20 binaries compiled first in
parallel (prebuild_gemv), then ~200 launches and 100 graph captures."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.gemm import FAMILY, configs_gemv  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)]  # N, K
MS = (1, 3, 16)


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The space's binaries (bf16, MP 1/2/4/16, aligned N and K) compiled first in parallel
    (prebuild_gemv: the GEMM prebuild's workers, without its summary file)."""
    from tunedb.families.gemm import prebuild_gemv

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    jobs = prebuild_gemv.jobs(configs_gemv.SPACE_IDS, SHAPES, MS + (2,))
    res = prebuild_gemv.compile_all(jobs, "sm%d%d" % torch.cuda.get_device_capability(), 16)
    assert not res["failed"], [(f["job"]["config_id"], f["error"][-400:]) for f in res["failed"][:5]]


def _bound(ref: torch.Tensor) -> float:
    return 4 * (ref.to(torch.bfloat16).double() - ref).abs().max().item() + 2e-3 * ref.abs().max().item()


@pytest.mark.parametrize("n,k", SHAPES)
def test_every_space_config_through_the_family_launcher_eager_and_in_a_graph(n, k):
    from tunedb.arch import shipped_profile

    arch = shipped_profile("sm90")
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    for op, act, bias in (("gemm", "none", None), ("gemm_act", "silu", b)):
        s = FAMILY.make_signature(op, "half", n, k, act, bias is not None)
        for m in MS:
            x = (torch.rand(m, k, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
            ref = x.double() @ w.double().t() + (0 if bias is None else bias.double())
            ref = torch.nn.functional.silu(ref) if act == "silu" else ref
            ids = [c.id for c in FAMILY.candidates(s, m, arch) if configs_gemv.is_gemv(c)]
            assert len(ids) == (7 if m <= 4 else 4)
            for cid in ids:
                fn = FAMILY.launcher(FAMILY.parse_config(cid), s)
                y = fn(x, w, bias, None)
                err = (y.double() - ref).abs().max().item()
                assert err <= _bound(ref), f"{cid} {s.format()} M={m}: error {err:.3g}"
                out = torch.empty_like(y)
                fn(x, w, bias, out)  # warm the graph's own call path
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn(x, w, bias, out)
                for _ in range(2):  # the split counters are left zero: replays repeat the bits
                    out.fill_(float("nan"))
                    graph.replay()
                    torch.cuda.synchronize()
                    assert torch.equal(out, y), f"{cid} {s.format()} M={m}: graph replay differs from eager"


def test_the_public_op_serves_a_gv_config_from_the_system_tier(tmp_path):
    from tunedb import pipeline, settings
    from tunedb.database import tiers
    from tunedb.families.gemm import ops
    from tunedb.measure.timers import FakeTimer
    from tunedb.records import Point, ShapeSet
    from tunedb.runtime import selector

    n, k = 1024, 4096
    s = FAMILY.make_signature("gemm_act", "half", n, k, "silu", True)

    def truth(sig, m, cid):  # gv fastest at M <= 16 (where it is valid), torch above
        return 0.006 if cid.startswith("gv") else 0.010 if cid == "torch" else 0.011

    shapes = ShapeSet(tuple(Point(s, m, weight=1.0, calls=10) for m in (1, 3, 64)))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        pipeline.build([("c", shapes)], pipeline.BuildOptions(out=str(tmp_path / "out"), top_k=4, fresh=False,
                                                              fill=False), timer=FakeTimer(truth, seed=1))
        with tiers.system_root_override(tmp_path / "out"):
            selector.configure("sm90")
            try:
                g = torch.Generator(device="cuda").manual_seed(5)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
                b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
                for m in (1, 3):
                    r = selector.resolve("gemm", s, m)
                    assert r.tier == "system" and configs_gemv.is_gemv(r.config), r
                    x = (torch.rand(m, k, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
                    ref = torch.nn.functional.silu(x.double() @ w.double().t() + b.double())
                    y = ops.gemm_act(x, w, b, "silu")
                    assert (y.double() - ref).abs().max().item() <= _bound(ref)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        yg = ops.gemm_act(x, w, b, "silu")
                    graph.replay()
                    torch.cuda.synchronize()
                    assert torch.equal(yg, y)
            finally:
                selector.configure()


def test_captured_decode_calls_after_ours_launch_the_pdl_twin(monkeypatch):
    """With TUNEDB_CHAIN_PDL=1, inside a capture a served gv config launches as its PDL twin where
    the call directly follows one of ours and its weight is an nn.Parameter (the driver's capture
    query answering on this GPU), as measured everywhere else (first in the graph, after torch's kernels: a weight-normed
    Linear's weight); every output against fp64, replayed."""
    from tunedb.families.gemm import ops
    from tunedb.runtime import capture_chain, launch_table

    follows: list[bool] = []
    real = capture_chain.follows_ours
    monkeypatch.setattr(capture_chain, "follows_ours", lambda s: follows.append(real(s)) or follows[-1])
    n, k = 4096, 4096
    cfg = FAMILY.parse_config("gv1_n16x256_w4_s5_lr")
    torch.manual_seed(0)
    q, kk = (torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    normed = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16))
    x = (torch.rand(1, k, device="cuda") * 2 - 1).to(torch.bfloat16)

    def step():
        a = ops.gemm(x, q.weight)
        b = ops.gemm(x, kk.weight)
        c = ops.gemm(x, normed.weight)
        d = ops.gemm(a, kk.weight)
        return a, b, c, d

    from tunedb import settings

    with torch.no_grad(), settings.override(CHAIN_PDL="1"), launch_table.overriding(
            lambda family, sig, m: (cfg, "autotune") if family.name == "gemm" and m == 1 else None):
        eager = step()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = step()
            info = capture_chain.capture_info(int(torch.cuda.current_stream().cuda_stream))
        graph.replay()
        torch.cuda.synchronize()
        refs = [x.double() @ w.double().t() for w in (q.weight, kk.weight, normed.weight)]
        refs.append(eager[0].double() @ kk.weight.double().t())
        for i, (out, ref) in enumerate(zip(got, refs)):
            assert (out.double() - ref).abs().max().item() <= _bound(ref), i
            assert torch.equal(out, eager[i]), i  # the PDL twin computes the plain config's bits
    assert info is not None and len(info[1]) == 1, info
    assert follows == [False, True, False, True], follows
