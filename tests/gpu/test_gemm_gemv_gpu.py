"""The GEMM decode lane's bf16/fp16 GEMV kernel (`gv` configs, kernels_gemv.py) on the GPU: against
the fp64 product over odd shapes (N not a multiple of BN, K not of BK) and Llama-3-8B widths at
M = 1, 3, 8, 16 (the FMA path where its rules admit M, the tensor-core path everywhere), with a
bias, in fp16; then inside captured CUDA graphs, with and without PDL: back-to-back calls on
different weights (split configs sharing the launcher's counters) and a chain where each call
reads the previous call's output (a `_pdl` call must wait for it), each output bitwise equal to
its eager run over three replays. About 25-45 s on the H200: ~35 binaries (three specializations of N and K, MP 1/4/16, bf16 and
fp16) compiled first in 16 processes, then the checks."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.gemm import FAMILY, configs_gemv  # noqa: E402
from tunedb.families.gemm.launch_gemv import launcher  # noqa: E402

pytestmark = pytest.mark.gpu

FMA = ("gv1_n16x512_w4_s5", "gv2_n8x256_w2_s3", "gv3_n4x512_w2_s3_pdl", "gv1_n8x512_w4_s5_lr", "gv2_n16x256_w4_s3_lr_pdl")
MMA = ("gv1_n16x512_w4_s5_mma", "gv4_n32x256_w4_s3_mma", "gv2_n16x256_w4_s5_mma_pdl")
SHAPES = [(80, 200), (136, 1000), (4096, 4096), (6144, 4096), (4096, 14336)]  # N, K
MS = (1, 3, 8, 16)
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Every binary the module launches compiled first in 16 processes (prebuild_gemv)."""
    from tunedb.families.gemm import prebuild_gemv

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    todo = prebuild_gemv.jobs(FMA + MMA, SHAPES, MS)
    todo += prebuild_gemv.jobs(FMA + MMA, [(136, 1000)], (1, 16), "fp16")
    res = prebuild_gemv.compile_all(todo, "sm%d%d" % torch.cuda.get_device_capability(), 16)
    assert not res["failed"], [(f["job"]["config_id"], f["error"][-400:]) for f in res["failed"][:5]]


def valid(n, k, m, dt="bf16"):
    return [c for c in FMA + MMA if configs_gemv.gemv_reason(configs_gemv.parse_gemv(c), n, k, m, dt) is None]


def inputs(n, k, m, dt, seed, bias=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.rand(m, k, device="cuda", generator=g) * 2 - 1).to(DT[dt])
    w = (torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(DT[dt])
    b = torch.randn(n, device="cuda", generator=g).to(DT[dt]) if bias else None
    return x, w, b


def check(cid, sig, x, w, b):
    ref = x.double() @ w.double().t() + (b.double() if b is not None else 0)
    peak = ref.abs().max().item()
    rounding = (ref.to(x.dtype).double() - ref).abs().max().item()
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device="cuda")
    y = launcher(cid, sig)(x, w, b, out)
    torch.cuda.synchronize()
    assert y.data_ptr() == out.data_ptr() and y.dtype == x.dtype and not torch.isnan(y).any(), f"{cid}: left NaN"
    err = (y.double() - ref).abs().max().item()
    # fp32 accumulation, one rounding to the output: a few of the output's roundings at most
    assert err <= 4 * rounding + 1e-4 * peak, f"{cid} {sig.format()} M={x.shape[0]}: error {err:.3e}, rounding {rounding:.3e}"


@pytest.mark.parametrize("n, k", SHAPES)
def test_gv_against_fp64_reference(n, k):
    sig = FAMILY.make_signature("gemm", "bf16", n, k)
    for m in MS:
        ran = valid(n, k, m)
        assert any(c.endswith(("_mma", "_mma_pdl")) for c in ran)
        if k >= 4096:
            assert any("_mma" not in c for c in ran) == (m <= 4), ran
        x, w, _ = inputs(n, k, m, "bf16", seed=m + n)
        for cid in ran:
            check(cid, sig, x, w, None)


@pytest.mark.parametrize("dt, bias", [("bf16", True), ("fp16", False), ("fp16", True)])
def test_gv_bias_and_fp16(dt, bias):
    n, k = 136, 1000
    sig = FAMILY.make_signature("gemm_act" if bias else "gemm", dt, n, k, bias=bias)
    for m in (1, 16):
        x, w, b = inputs(n, k, m, dt, seed=7 + m, bias=bias)
        for cid in valid(n, k, m, dt):
            check(cid, sig, x, w, b)


def test_gv_refuses_what_it_cannot_serve():
    sig = FAMILY.make_signature("gemm", "bf16", 80, 200)
    x, w, _ = inputs(80, 200, 5, "bf16", seed=0)
    with pytest.raises(ValueError, match="M <= 4"):
        launcher(FMA[0], sig)(x, w, None, None)
    x, w, _ = inputs(80, 200, 17, "bf16", seed=0)
    with pytest.raises(ValueError, match="M <= 16"):
        launcher(MMA[0], sig)(x, w, None, None)


def _graph_outputs(body, outs, replays=3):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    got = []
    for _ in range(replays):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got.append([o.clone() for o in outs])
    return got


@pytest.mark.parametrize("cid", ["gv2_n8x256_w2_s3", "gv3_n4x512_w2_s3_pdl", "gv2_n16x256_w4_s3_lr_pdl",
                                 "gv4_n32x256_w4_s3_mma", "gv2_n16x256_w4_s5_mma_pdl"])
def test_gv_back_to_back_in_a_graph(cid):
    """Four calls on four weights in one graph (PDL lets each start under the previous; split
    configs share one workspace and counters): each bitwise equal to its eager run, three replays."""
    m = 16 if "_mma" in cid else 3
    sig = FAMILY.make_signature("gemm", "bf16", 4096, 4096)
    run = launcher(cid, sig)
    args = [inputs(4096, 4096, m, "bf16", seed=20 + i) for i in range(4)]
    want = [run(x, w, None, None).clone() for x, w, _ in args]  # eager: compiles, allocates
    outs = [torch.empty_like(y) for y in want]
    torch.cuda.synchronize()

    def body():
        for (x, w, _), o in zip(args, outs):
            run(x, w, None, o)

    for r, got in enumerate(_graph_outputs(body, outs)):
        for i, (y, ref) in enumerate(zip(got, want)):
            assert torch.equal(y, ref), f"{cid} replay {r} call {i}: differs from eager"


@pytest.mark.parametrize("pdl", [False, True])
def test_gv_chain_reads_its_predecessor_in_a_graph(pdl):
    """x -> (elementwise producer) -> gv -> gv -> gv -> gv, each reading the previous output: a
    `_pdl` call loads its first weight tile early but x only after gdc_wait, so the chain's
    outputs in a graph equal the eager ones bitwise."""
    n = k = 4096
    fma, mma = ("gv2_n8x256_w2_s3_pdl", "gv2_n16x256_w4_s5_mma_pdl") if pdl else ("gv2_n8x256_w2_s3", "gv2_n16x256_w4_s5_mma")
    sig = FAMILY.make_signature("gemm", "bf16", n, k)
    for m, cid in ((1, fma), (16, mma)):
        run = launcher(cid, sig)
        x0, _, _ = inputs(n, k, m, "bf16", seed=3)
        ws = [inputs(n, k, 1, "bf16", seed=40 + i)[1] for i in range(4)]
        src = torch.empty_like(x0)
        outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in ws]

        def body():
            torch.mul(x0, 0.5, out=src)  # the producer the first call waits for
            a = src
            for w, o in zip(ws, outs):
                run(a, w, None, o)
                a = o

        body()
        torch.cuda.synchronize()
        want = [o.clone() for o in outs]
        assert all(torch.isfinite(o).all() for o in want)
        for r, got in enumerate(_graph_outputs(lambda: body(), outs)):
            for i, (y, ref) in enumerate(zip(got, want)):
                assert torch.equal(y, ref), f"{cid} replay {r} step {i}: differs from eager"
