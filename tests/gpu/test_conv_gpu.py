"""The conv family on the GPU: every arm (torch, cuDNN's autotuner, channels-last, a sample of
each Triton lane) on the Conformer's convolutions against the fp32 convolution, each run inside
a captured CUDA graph after an eager warm-up (cuDNN's benchmark arm picks its algorithm there,
as in a model); then an optimize()d Conformer in a CUDA graph with every conv served by a Triton
arm, against the fp32 model; a cuDNN bench arm captured without and with a warm-up. Expected run
time on the H200: about 30-45 s (Triton compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.conv import FAMILY, keys  # noqa: E402
from tunedb.families.conv.arms import make_inputs  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
CUDNN = ("torch", "cudnn_bench", "cudnn_cl", "cudnn_cl_bench")
DW_IDS = ("dw_t64_c64_w4", "dw_t128_c32_w4", "dw_t32_c128_w4", "dw_t256_c16_w4")
IG_IDS = ("ig_b64x64x32_w4_s3", "ig_b128x128x32_w8_s3", "ig_b128x64x64_w4_s4", "ig_b64x64x16_w4_s2", "ig_b32x32x16_w4_s2")


def _sig(op, dt, cin, cout, k, s=1, p=0, g=1, act="none", lay=None, width=None):
    return keys.make_signature(op, dt, cin, cout, k, s, p, 1, g, True, act, lay, width)


# (signature, (B, input length)): the Conformer's depthwise (144..512 channels, both layouts),
# its pointwise convs on the transposed view, the subsampling front end, an odd dense conv1d
CASES = [
    (_sig("conv1d", "fp16", 144, 144, 31, p=15, g=144), (2, 333)),
    (_sig("conv1d", "fp16", 256, 256, 31, p=15, g=256, lay="ntc"), (4, 250)),
    (_sig("conv1d", "bf16", 512, 512, 31, p=15, g=512), (1, 3000)),
    (_sig("conv1d", "fp16", 512, 512, 31, p=15, g=512, act="silu"), (8, 374)),  # + folded norm and SiLU
    (_sig("conv1d", "fp16", 512, 1024, 1, lay="ntc"), (2, 749)),
    (_sig("conv1d", "bf16", 512, 512, 1), (3, 101)),
    (_sig("conv1d", "fp16", 80, 200, 3, s=2, p=1), (2, 301)),
    (_sig("conv2d", "fp16", 1, 512, 3, s=2, act="relu", width=80), (2, 301)),
    (_sig("conv2d", "bf16", 512, 512, 3, s=2, act="relu", width=39), (2, 150)),
    (_sig("conv2d", "fp16", 64, 64, 3, s=2, act="relu", lay="nhwc", width=39), (1, 99)),
]


def _graphed(fn):
    """fn's output from a CUDA graph replay, after two eager warm-up calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return out


def _err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("sig, shape", CASES, ids=[f"{s.op}-{s.get('Cin')}-{s.get('Cout')}-{s.get('k')}-{s.get('lay')}-{s.dt}"
                                                   for s, _ in CASES])
def test_every_arm_in_a_graph_against_fp32(sig, shape):
    args, _ = make_inputs(sig, 1, "cuda", seed=7, batch=shape[0], length=shape[1])
    assert keys.signature_of(sig.op, *args)[0] == sig
    ref = FAMILY.reference(sig, *args)
    ids = [c for c in CUDNN + DW_IDS + IG_IDS
           if FAMILY.invalid_reason(FAMILY.parse_config(c), sig, keys.size_of(sig, *shape), SM90) is None]
    assert any(c.startswith(("dw_", "ig_")) for c in ids), "no Triton arm for a Conformer shape"
    errs = {}
    for cid in ids:
        launch = FAMILY.launcher(FAMILY.parse_config(cid), sig)
        y = _graphed(lambda: launch(*args))
        assert y.shape == ref.shape, cid
        assert not y.isnan().any(), f"{cid}: elements left unwritten"
        errs[cid] = _err(y, ref)
    bound = 4 * max(errs["torch"], 1e-4)
    bad = {c: e for c, e in errs.items() if e > bound}
    assert not bad, f"arms beyond 4x torch's error {errs['torch']:.2e}: {bad}"


def test_benchmark_arm_restores_the_flag():
    sig, shape = CASES[0]
    args, _ = make_inputs(sig, 1, "cuda", seed=1, batch=shape[0], length=shape[1])
    torch.backends.cudnn.benchmark = False
    FAMILY.launcher(FAMILY.parse_config("cudnn_bench"), sig)(*args)
    assert torch.backends.cudnn.benchmark is False


@pytest.mark.parametrize("cid", ["cudnn_bench", "cudnn_cl_bench"])
def test_benchmark_arm_captured_after_warm_up(cid):
    """Warmed up outside a capture (as torch's CUDA-graph rules require of any cuDNN conv), a
    bench arm's capture replays the autotuner's pick and leaves the process's flag as it was.
    In a fresh thread: cuDNN's plan cache is per thread. (A first call of a new NCHW shape inside
    a capture fails in cuDNN itself on the H200, with the autotuner off too: session 11 call B.)"""
    import threading

    sig = _sig("conv2d", "fp16", 64, 96, 3, s=1, p=1, act="relu", width=41)
    args, _ = make_inputs(sig, 1, "cuda", seed=3, batch=2, length=57)
    ref = FAMILY.reference(sig, *args)
    launch = FAMILY.launcher(FAMILY.parse_config(cid), sig)
    results = {}

    def capture():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                launch(*args)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = launch(*args)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            results["err"] = _err(out, ref)
        except Exception as exc:  # noqa: BLE001 -- reported by the assertion below
            results["err"] = exc

    worker = threading.Thread(target=capture)
    worker.start()
    worker.join()
    assert isinstance(results["err"], float) and results["err"] < 1e-2, results
    assert torch.backends.cudnn.benchmark is False


def test_optimized_conformer_in_a_graph():
    from tunedb.census.models import ConformerEncoder, ConformerMirror, ConvSubsampling
    from tunedb.families.conv.patching import optimize
    from tunedb.runtime import launch_table

    torch.manual_seed(0)
    model = ConformerEncoder(ConvSubsampling(80, 144), ConformerMirror(144, 4, 576, 2, 31)).cuda().eval()
    x = torch.randn(2, 400, 80, device="cuda")
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            ref = model(x).float()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    model.half()
    xh = x.half()
    with torch.no_grad():
        plain = _graphed(lambda: model(xh))
    seen = []

    def triton_everywhere(family, sig, m):
        if family.name != "conv":
            return None
        seen.append(sig)
        cid = "dw_t64_c64_w4" if sig.get("g") > 1 else (
            "ig_b64x64x16_w4_s2" if sig.get("Cin") * sig.get("k") * sig.get("kw", 1) <= 16 else "ig_b64x64x32_w4_s3")
        return FAMILY.parse_config(cid), "test"

    tuned_model = optimize(model)
    with torch.no_grad(), launch_table.overriding(triton_everywhere):
        tuned = _graphed(lambda: tuned_model(xh))
    assert {s.op for s in seen} == {"conv1d", "conv2d"} and any(s.get("act") == "relu" for s in seen)
    e_plain, e_tuned = _err(plain, ref), _err(tuned, ref)
    assert e_tuned <= 4 * max(e_plain, 1e-3), (e_tuned, e_plain)
