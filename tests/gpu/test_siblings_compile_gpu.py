"""Sibling groups in compiled code on the GPU (families/gemm/siblings_compile.py): a grouped
attention block compiled with mode="reduce-overhead" runs each group as one tunedb::siblings
launch and matches the plain block within the plain compiled block's distance from fp64, over
new inputs replayed from Inductor's CUDA graphs; compiled in default mode it compiles each member
alone, unless TUNEDB_COMPILED_GRAPHS=1 says the user captures it (then one launch, captured by
hand after a warm-up). TUNEDB_COMPILED_SIBLINGS=1 throughout (the default since session 48, set
so that a user's environment does not change what is tested)."""
import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import tunedb  # noqa: E402
from tunedb.families.gemm import patching  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from sibling_models import Attn  # noqa: E402
from test_gemm_siblings_gpu import _warm_up_on_a_side_stream  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setenv("TUNEDB_COMPILED_SIBLINGS", "1")  # the default, whatever the environment says
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _block(monkeypatch, served: bool):
    torch.manual_seed(0)
    d, kv = (1024, 256) if served else (1152, 384)
    model = nn.Sequential(Attn(d=d, kv=kv, bias=True)).cuda().to(torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    if served:  # every Linear swapped and served (the tiers' picks), not left as written
        monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))
    tunedb.optimize(model)
    assert "_siblings" in model[0].q_proj.__dict__
    return model, ref


def _close(got, ref, x):
    exact = copy.deepcopy(ref).double()
    want = exact(x.double())
    err = (got.double() - want).abs().max().item()
    err_plain = (ref(x).double() - want).abs().max().item()
    assert err <= 2 * err_plain + 1e-2 * want.abs().max().item(), (err, err_plain)


@pytest.mark.parametrize("served", [False, True])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_reduce_overhead_runs_each_group_as_one_launch(monkeypatch, served, rows):
    from torch._inductor.utils import run_and_get_code

    model, ref = _block(monkeypatch, served)
    x = torch.randn(rows, model[0].q_proj.in_features, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        _, code = run_and_get_code(compiled, x)
        source = "\n".join(code)
        assert source.count("torch.ops.tunedb.siblings.default(") == 1, source
        assert "torch.ops.tunedb.sibling.default(" not in source
        for _ in range(4):  # warm-up, recording, then replays with new values
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn_like(x)
            got = compiled(x).clone()
            _close(got, ref, x)


@pytest.mark.parametrize("forced", [False, True])
def test_default_mode_groups_only_when_the_user_captures(monkeypatch, forced):
    from torch._inductor.utils import run_and_get_code

    if forced:
        monkeypatch.setenv("TUNEDB_COMPILED_GRAPHS", "1")
    model, ref = _block(monkeypatch, served=False)
    static = torch.randn(1, model[0].q_proj.in_features, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(model, dynamic=False)
        _, code = run_and_get_code(compiled, static)
        source = "\n".join(code)
        assert source.count("torch.ops.tunedb.siblings.default(") == (1 if forced else 0), source
        assert "torch.ops.tunedb.sibling.default(" not in source
        _warm_up_on_a_side_stream(compiled, static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(static)
        for _ in range(3):
            static.copy_(torch.randn_like(static))
            graph.replay()
            _close(out, ref, static)


def test_reduce_overhead_splits_k_for_a_tensor_parallel_shard():
    """A group of few slabs at a deep K (Llama-3-8B's q/k/v over 8 GPUs, left as written), which
    optimize() marks for the K split: compiled with mode="reduce-overhead" at 4 rows, one launch of
    the split form (its workspace made per call: a kept one made in the tree's warm-up would sit in
    the graph's pool and fail the tree's check), replays matching the plain block."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = nn.Sequential(Attn(d=4096, kv=128, q=512)).cuda().to(torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    tunedb.optimize(model)
    assert model[0].q_proj.__dict__["_siblings"][0].split is True
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        _, code = run_and_get_code(compiled, x)
        assert "\n".join(code).count("torch.ops.tunedb.siblings.default(") == 1
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.randn_like(x)
            _close(compiled(x).clone(), ref, x)
