"""Module surgery after optimize() on the GPU (session 40's fused_pair rules), with a Triton config
pinned for every GEMM so that a fused Linear+GELU runs the fused kernel while the pair holds: after
a new Linear, a LoRA-style wrapper, a new or dropped activation or a hook, the optimized model gives
what the plain model gives (fp16, both against an fp32 reference of the same model), eagerly and
replayed from a CUDA graph; a fused conv2d+ReLU unfuses the same way. Expected: under 40 s."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tunedb  # noqa: E402
from tunedb.families.gemm import FAMILY  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the CPU tests' models
from fusion_models_s40 import EveryFamily, FusedMLP, LoraLike  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("swap_unmeasured")]
nn = torch.nn
TRITON_CFG = "b64x64x64_w4_s3_g8"
D = 256
SURGERIES = ["none", "new linear", "lora wrapper", "new activation", "activation removed", "hook on the linear",
             "gelu setting changed"]


def rel_err(got, want):
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def _pinned():
    pinned = FAMILY.parse_config(TRITON_CFG)
    return launch_table.overriding(lambda fam, sig, m: (pinned, "pinned"))


def _operate(model: nn.Module, surgery: str, seen: dict, name: str) -> None:
    torch.manual_seed(1)
    old = model._modules["fc1"]
    if surgery == "new linear":
        model._modules["fc1"] = nn.Linear(D, 2 * D).to(old.weight)
    elif surgery == "lora wrapper":
        model._modules["fc1"] = LoraLike(old, D, 2 * D).to(old.weight)
    elif surgery == "new activation":
        model._modules["act"] = nn.ReLU()
    elif surgery == "activation removed":
        model._modules["act"] = nn.Identity()
    elif surgery == "hook on the linear":
        old.register_forward_hook(lambda m, i, o: seen.__setitem__(name, o.float().clone()))
    elif surgery == "gelu setting changed":  # on the module itself, found by a walk (session 53)
        for m in model.modules():
            if isinstance(m, nn.GELU):
                m.approximate = "tanh"


@pytest.mark.parametrize("surgery", SURGERIES)
def test_surgery_after_optimize_gives_the_plain_result_eagerly_and_in_a_graph(surgery):
    torch.manual_seed(0)
    plain = FusedMLP(D).cuda().half().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    assert tuned._modules["fc1"].__dict__["act"] == "gelu"  # fused: what the surgery undoes
    seen: dict = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        _operate(model, surgery, seen, name)
    ref_model = copy.deepcopy(plain).float()
    x = torch.randn(4, 7, D, device="cuda", dtype=torch.float16)
    with torch.no_grad(), _pinned():
        ref = ref_model(x.float())
        want = plain(x)
        got = tuned(x)
        served_acts = {key[4] for key, bound in launch_table.entries() if bound.config.id == TRITON_CFG}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            tuned(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = tuned(x)
        graph.replay()
        torch.cuda.synchronize()
    assert served_acts == ({"gelu", "none"} if surgery == "none" else {"none"})  # the pair ran fused only while it held
    assert rel_err(want, ref) < 2e-3
    assert rel_err(got, ref) < 2e-3
    assert torch.equal(captured, got)
    if seen:  # the hook saw the Linear's own output (the pre-activation), as on the plain model
        assert rel_err(seen["tuned"], seen["plain"]) < 2e-3 and (seen["plain"] < 0).any()


@pytest.mark.parametrize("surgery", ["none", "new activation", "activation dropped", "hook on the conv"])
def test_a_fused_conv2d_unfuses_after_surgery_on_the_gpu(surgery):
    torch.manual_seed(0)
    plain = EveryFamily().cuda().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned.c2[0]).__name__ == "TunedConv2d" and type(tuned.c2[1]).__name__ == "FusedActivation"
    seen: dict = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        if surgery == "new activation":
            model.c2[1] = nn.Tanh()
        elif surgery == "activation dropped":
            model.c2[1] = nn.Identity()
        elif surgery == "hook on the conv":
            model.c2[0].register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.double()))
    ref_model = copy.deepcopy(plain).double()
    x = torch.randn(2, 1, 33, 33, device="cuda")
    with torch.no_grad():
        ref = ref_model(x.double())
        want, got = plain(x), tuned(x)
    assert rel_err(want, ref) < 1e-4
    assert rel_err(got, ref) < 1e-4
    if surgery == "hook on the conv":  # the conv's own output, negative values and all
        assert rel_err(seen["tuned"], seen["plain"]) < 1e-4 and (seen["plain"] < 0).any()


def test_a_compiled_model_unfuses_when_the_gelu_setting_changes_on_the_module():
    """Session 53: the compiled slot reads its activation's settings (guards); changed on the
    module itself, the forward retraces and the pair unfuses (the fused kernel applied exact GELU)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = FusedMLP(D).cuda().half().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="gemm")
    pair = tuned._modules["act"].__dict__["_tunedb_fused"]
    compiled = torch.compile(tuned)
    x = torch.randn(4, 7, D, device="cuda", dtype=torch.float16)
    with torch.no_grad(), _pinned():
        compiled(x)
        assert not pair.shared
        for model in (plain, tuned):
            _operate(model, "gelu setting changed", {}, "")
        got = compiled(x)
        ref = copy.deepcopy(plain).float()(x.float())
    assert pair.shared
    assert rel_err(got, ref) < 2e-3
