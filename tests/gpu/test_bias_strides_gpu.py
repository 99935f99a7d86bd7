"""A strided bias (bias[::2], a table's column, an expanded scalar) through every Triton arm that
adds a bias, on the GPU: the gemm family's tiled, split-K and decode lanes, gemm_log_softmax's
fused `rf_`/`rc_` designs (the shipped sm90 table serves `rf_` for biased heads) and conv's
direct depthwise and implicit-GEMM kernels, each against an fp32 reference and inside a captured
CUDA graph (the copy the family makes is captured with it); and a swapped Linear answering operands
the tuned op refuses (a K or dtype that does not fit, a bias of shape [1]) as nn.Linear. Expected
run time: about 60 s."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu


def _biases(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    return {
        "every other": torch.randn(2 * n, device="cuda", generator=g).half()[::2],
        "a column": torch.randn(n, 3, device="cuda", generator=g).half()[:, 1],
        "expanded": torch.full((1,), 0.75, device="cuda").half().expand(n),
    }


def _graphed(fn):
    fn()  # compiles and warms outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("cid", ["b64x64x64_w4_s3_g8", "sk2_b16x64x128_w4_s4", "dk1_n32x256_w4_s4"])
@pytest.mark.parametrize("m", [1, 37])
def test_gemm_arms_read_a_strided_bias_by_its_values(cid, m):
    from tunedb.families.gemm import FAMILY

    n, k = 320, 256
    cfg = FAMILY.parse_config(cid)
    sig = FAMILY.make_signature("gemm_act", "fp16", n, k, "none", True)
    from tunedb import arch

    why = FAMILY.invalid_reason(cfg, sig, m, arch.shipped_profile("sm90"))
    if why:
        pytest.skip(f"{cid} does not run M={m}: {why}")
    x = torch.randn(m, k, device="cuda").half()
    w = (torch.randn(n, k, device="cuda") / 16).half()
    for name, b in _biases(n).items():
        ref = F.linear(x.float(), w.float(), b.float())
        y = _graphed(lambda b=b: FAMILY.launch(cfg, sig, x, w, b))
        assert (y.float() - ref).abs().max().item() < 0.03, (cid, m, name)


@pytest.mark.parametrize("cid", ["rf_b64x64x64_w4_s3_pdl", "rc_b16x128x64_w4_s2"])
def test_gemm_log_softmax_fused_arms_read_a_strided_bias_by_its_values(cid):
    from tunedb.families.gemm_log_softmax import FAMILY, configs

    x = torch.randn(48, 512, device="cuda").half()
    w = (torch.randn(5000, 512, device="cuda") / 24).half()
    for name, b in _biases(5000).items():
        ref = torch.log_softmax(F.linear(x.float(), w.float(), b.float()), -1)
        y = _graphed(lambda b=b: FAMILY.launch(configs.parse(cid), None, x, w, b))
        assert (y.float() - ref).abs().max().item() < 0.05, (cid, name)


@pytest.mark.parametrize("cid, depthwise", [("dw_t32_c32_w4", True), ("ig_b32x32x16_w4_s2", False)])
def test_conv_triton_arms_read_a_strided_bias_by_its_values(cid, depthwise):
    from tunedb.families.conv import FAMILY, configs, keys

    cin, cout, groups = (64, 64, 64) if depthwise else (64, 96, 1)
    x = torch.randn(4, cin, 200, device="cuda").half()
    wt = (torch.randn(cout, cin // groups, 5, device="cuda") / 8).half()
    for name, b in _biases(cout).items():
        sig, _ = keys.signature_of("conv1d", x, wt, b, 1, 2, 1, groups)
        ref = F.conv1d(x.float(), wt.float(), b.float(), 1, 2, 1, groups)
        y = _graphed(lambda b=b, sig=sig: FAMILY.launch(configs.parse(cid), sig, x, wt, b, [1], [2], [1], groups, "none"))
        assert (y.float() - ref).abs().max().item() < 0.03, (cid, name)


def test_a_swapped_linear_answers_refused_operands_as_nn_linear_on_cuda():
    import copy

    import tunedb

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256))
    plain = plain.cuda().half().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned[2]) is not torch.nn.Linear
    for bad in (torch.randn(3, 255, device="cuda").half(), torch.randn(3, 512, device="cuda")):
        errors = []
        for model in (plain, tuned):
            with pytest.raises(RuntimeError) as info:
                model[2](bad)
            errors.append(str(info.value))
        assert errors[0] == errors[1]
    for model in (plain, tuned):
        model[2].bias = torch.nn.Parameter(torch.full((1,), 0.5, device="cuda").half())  # F.linear broadcasts it
    x = torch.randn(5, 256, device="cuda").half()
    with torch.no_grad():
        assert torch.allclose(tuned(x).float(), plain(x).float(), atol=2e-2, rtol=2e-2)
