"""The runtime on a real GPU: graphs and eager run the same kernel, optimize() on Whisper / Llama /
Conformer in fp16 and bf16, autotune() on a real shape publishing to a temp user tier."""
import copy
import json

import pytest

torch = pytest.importorskip("torch")

from tunedb import database  # noqa: E402

from tunedb.runtime import selector
from tunedb.families.gemm import FAMILY  # noqa: E402
from tunedb.records import Entry, Region, Signature  # noqa: E402
from tunedb.families.gemm import ops  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402
from tunedb.runtime.autotuner import autotune  # noqa: E402
from tunedb.families.gemm.patching import TunedLinear  # noqa: E402
from tunedb.runtime.patching import optimize  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
TRITON_CFG = "b64x64x64_w4_s3_g8"


def rel_err(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def test_captured_graph_and_eager_run_the_same_kernel(tiers_dirs):
    m, n, k = 96, 512, 256
    sig = Signature.parse(f"gemm|op=gemm_act|dt=bf16|N={n}|K={k}|act=gelu|bias=1")
    cfg = FAMILY.parse_config(TRITON_CFG)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(128, cfg.id),))], [cfg])
    selector.reload()
    (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", 0)
    eager = ops.gemm_act(x, w, b, "gelu")
    bound = launch_table.launcher("gemm_act", x, w, b, "gelu", m)
    assert (bound.tier, bound.config.id) == ("user", TRITON_CFG)
    calls = bound.calls
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.gemm_act(x, w, b, "gelu")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.gemm_act(x, w, b, "gelu")
    graph.replay()
    torch.cuda.synchronize()
    assert launch_table.launcher("gemm_act", x, w, b, "gelu", m) is bound  # same resolution
    assert bound.calls == calls + 3
    assert torch.equal(captured, eager)
    direct = FAMILY.launch(cfg, sig, x, w, b)
    assert torch.equal(direct, eager)  # and it is the Triton config the tier named


def test_capture_with_autotune_active_takes_the_fallback_without_measuring(tiers_dirs):
    sig = Signature.parse("gemm|op=gemm|dt=fp16|N=256|K=128")
    (x, w, _), _ = FAMILY.make_inputs(sig, 40, "cuda", 1)
    fallback = selector.resolve("gemm", sig, 40).config
    want = FAMILY.launch(fallback, sig, x, w)  # compiles the fallback's kernel before the capture
    torch.cuda.synchronize()
    measured = []
    with autotune(cache=None, measurer=lambda *a: measured.append(a) or [], publish=False):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = ops.gemm(x, w)
        bound = launch_table.launcher("gemm", x, w, None, "none", 40)
        assert bound.config.id == fallback.id and bound.tier != "autotune"
    graph.replay()
    torch.cuda.synchronize()
    assert measured == []
    assert torch.equal(got, want)


def _whisper(dtype):
    transformers = pytest.importorskip("transformers")
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = transformers.WhisperConfig(d_model=384, encoder_attention_heads=6, encoder_ffn_dim=1536,
                                     encoder_layers=2, num_mel_bins=80, max_source_positions=1500)
    model = WhisperEncoder(cfg).eval().to("cuda", dtype)
    feats = torch.randn(2, 80, 3000, device="cuda", dtype=dtype)
    return model, (feats,), lambda out: out.last_hidden_state


def _llama(dtype):
    transformers = pytest.importorskip("transformers")

    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                   num_key_value_heads=4, num_hidden_layers=2, vocab_size=1000)
    model = transformers.LlamaForCausalLM(cfg).eval().to("cuda", dtype)
    ids = torch.randint(0, 1000, (2, 77), device="cuda")
    return model, (ids,), lambda out: out.logits


def _conformer(dtype):
    torchaudio = pytest.importorskip("torchaudio")

    model = torchaudio.models.Conformer(input_dim=144, num_heads=4, ffn_dim=576, num_layers=2,
                                        depthwise_conv_kernel_size=31).eval().to("cuda", dtype)
    x = torch.randn(3, 200, 144, device="cuda", dtype=dtype)
    lengths = torch.tensor([200, 180, 150], device="cuda")
    return model, (x, lengths), lambda out: out[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("build, fused_act", [(_whisper, "gelu"), (_llama, "silu"), (_conformer, "silu")],
                         ids=["whisper", "llama", "conformer"])
def test_optimize_real_models_within_tolerance(tiers_dirs, build, fused_act, dtype):
    torch.manual_seed(0)
    model, inputs, pick = build(dtype)
    reference = copy.deepcopy(model)
    # every Linear through the tuned ops: the default leaves a key no table measured as written
    optimize(model, families="all")
    layers = [m for m in model.modules() if isinstance(m, TunedLinear)]
    assert layers and any(m.act == fused_act for m in layers)
    with torch.no_grad():
        want = pick(reference(*inputs))
        got = pick(model(*inputs))
    torch.cuda.synchronize()
    assert torch.isfinite(got).all()
    assert rel_err(got, want) < (3e-2 if dtype == torch.bfloat16 else 1e-2)
    assert launch_table.entries(), "no tuned op ran through the launch table"


def test_autotune_on_a_real_shape_publishes_to_the_user_tier(tiers_dirs, tmp_path):
    sig = Signature.parse("gemm|op=gemm_act|dt=bf16|N=256|K=512|act=relu|bias=1")
    (x, w, b), _ = FAMILY.make_inputs(sig, 100, "cuda", 2)
    cache = tmp_path / "tune.json"
    with autotune(cache=cache):
        y = ops.gemm_act(x, w, b, "relu")
        bound = launch_table.launcher("gemm_act", x, w, b, "relu", 100)
        assert bound.tier == "autotune"
    torch.cuda.synchronize()
    ref = torch.relu(torch.nn.functional.linear(x.float(), w.float(), b.float()))
    assert rel_err(y, ref) < 1e-2
    data = json.loads(cache.read_text())
    assert data["version"] == 3 and data["env"]["arch_family"] == "sm90"
    (winner,) = data["results"][sig.format()]["104"].values()
    db = database.load(tiers_dirs / "sm90" / "gemm.json")
    assert [(r.m_hi, r.config_id) for r in db.entries[sig].regions] == [(100, winner["config"])]
    selector.reload()
    res = selector.resolve("gemm", sig, 100)
    assert res.tier == "user"
    assert selector.resolve("gemm", sig, 101).tier != "user"  # no catch-all above the measured M


def test_prewarm_measures_a_models_shapes_into_the_user_tier_then_strict_passes(tiers_dirs):
    from tunedb.runtime.prewarm import prewarm

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256))
    model = optimize(model.to("cuda", torch.bfloat16).eval())
    x = torch.randn(4, 24, 256, device="cuda", dtype=torch.bfloat16)
    result = prewarm(model, (x,), budget_s=300, strict=True)
    assert len(result.points) == 2 and result.uncovered == ()
    with torch.no_grad():
        model(x)
    tiers_seen = {bound.tier for _key, bound in launch_table.entries()}
    # a Linear whose measured winner is torch stays the model's own (optimize() left it; prewarm's
    # re-run swaps only what a tier now serves with a config): its calls bypass the launch table
    assert tiers_seen <= {"user"}
    assert tiers_seen or not any(isinstance(m, TunedLinear) for m in model.modules())


@pytest.mark.parametrize("cid", ["torch", TRITON_CFG])
def test_compiled_graph_calls_the_tuned_op_with_model_weights(tiers_dirs, cid):
    """torch.compile (Inductor) keeps the tuned op opaque and calls it through the dispatcher with
    the model's nn.Parameter weights: same result as eager, served by the pinned config."""
    lin = torch.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)

    def fn(x):
        return torch.relu(ops.gemm_act(x, lin.weight, lin.bias, "gelu")) * 2 + 1

    pinned = FAMILY.parse_config(cid)
    with torch.no_grad(), launch_table.overriding(lambda fam, sig, m: (pinned, "pinned")):
        want = torch.relu(torch.nn.functional.gelu(lin(x))) * 2 + 1
        got = torch.compile(fn, fullgraph=True, dynamic=False)(x)
        torch.cuda.synchronize()
        served = {b.config.id for _k, b in launch_table.entries()}
    assert rel_err(got, want) < 2e-2
    assert served == {cid}


@pytest.mark.parametrize("eager_rule", ["1", "0"])
@pytest.mark.parametrize("cid", ["torch", TRITON_CFG])
def test_inductor_inlines_torch_served_shapes_and_calls_triton_ones(tiers_dirs, cid, eager_rule):
    """Static shapes under torch.compile (default mode: no CUDA graphs): a shape the tiers serve
    with the torch arm compiles to aten (no tuned-op call in Inductor's code, none counted); a
    Triton-served one calls the op, unless the eager rule gives its calls to torch (a kernel this
    short: the host issues a compiled forward without graphs call by call, as eagerly)."""
    from torch._inductor.utils import run_and_get_code

    from tunedb import settings

    n, k, m = 512, 256, 64
    sig = Signature.parse(f"gemm|op=gemm_act|dt=bf16|N={n}|K={k}|act=gelu|bias=1")
    cfg = FAMILY.parse_config(cid)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(128, cfg.id),))],
                           [] if cfg.is_sentinel else [cfg])
    selector.reload()
    lin = torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def fn(x):
        return ops.gemm_act(x, lin.weight, lin.bias, "gelu") * 2 + 1

    torch._dynamo.reset()
    with torch.no_grad(), settings.override(EAGER_FALLBACK=eager_rule):
        want = torch.nn.functional.gelu(lin(x)) * 2 + 1
        got, code = run_and_get_code(torch.compile(fn, fullgraph=True, dynamic=False), x)
        torch.cuda.synchronize()
        ((_key, bound),) = launch_table.entries()
    assert (bound.config.id, bound.tier) == (cid, "user")
    assert rel_err(got, want) < 2e-2
    calls_op = "ops.tunedb.gemm_act" in "".join(code)
    assert calls_op == (cid != "torch" and eager_rule == "0")
    assert (bound.calls > 0) == calls_op


def test_confirm_demotes_a_pick_slower_in_the_model_and_keeps_the_output(tiers_dirs):
    from torch import nn

    from tunedb.runtime.confirm import confirm

    # a deliberately poor tile for this size: far slower than cuBLAS, inside the model too
    slow = FAMILY.parse_config("b16x32x128_w4_s3_g8")
    sig = Signature.parse("gemm|op=gemm_act|dt=bf16|N=2048|K=512|act=silu|bias=1")
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(None, slow.id),))], [slow])
    selector.reload()
    model = optimize(nn.Sequential(nn.LayerNorm(512), nn.Linear(512, 2048), nn.SiLU(), nn.Linear(2048, 512)))
    model = model.to("cuda", torch.bfloat16).eval()
    x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        before = model(x).clone()
    result = confirm(model, (x,))
    (verdict,) = [v for v in result.verdicts if v.signature == sig]
    print("\n" + "\n".join(v.line() for v in result.verdicts))
    assert verdict.config_id == slow.id and verdict.tier == "user" and verdict.ms == (4096,)
    assert verdict.demoted and verdict.ratio > 1.1 and verdict.served_ms > verdict.torch_ms > 0
    assert selector.resolve("gemm", sig, 4096).config.id == "torch"
    assert selector.resolve("gemm", sig, 4095).config.id == slow.id  # other Ms keep their pick
    with torch.no_grad():
        after = model(x)
    assert rel_err(after, before) < 1e-2
    assert all(b.tier != "confirm" for _k, b in launch_table.entries())  # the pin is gone
