"""Sibling projections in one launch on the GPU (families/gemm/siblings.py, kernels_siblings.py):
the kernel against the fp64 product at decode widths and odd sizes, fp16 and bf16, with and
without bias; an optimized attention block at one row, eager and replayed from a CUDA graph with
new input values, against each projection run alone; more rows and a second call run alone; a
transformers Llama decode step through tunedb.optimize() against the plain model."""
import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import tunedb  # noqa: E402
from tunedb.families.gemm import kernels_siblings, patching, quiet_members, siblings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from sibling_models import Attn  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _bound(ref, dt):
    return 4 * (ref.to(dt).double() - ref).abs().max().item() + 1e-3 * ref.abs().max().item()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k,ns,bias", [(4096, (4096, 1024, 1024), False), (4096, (14336, 14336), False),
                                       (3584, (3584, 512, 512), True), (768, (768, 768, 768), True),
                                       (1000, (333, 17, 65), True), (40, (8, 24), False)])
def test_the_kernel_matches_fp64(dt, k, ns, bias):
    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(k, device="cuda", dtype=dt, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=dt, generator=g) * k ** -0.5 for n in ns]
    bs = [torch.randn(n, device="cuda", dtype=dt, generator=g) for n in ns] if bias else [None] * len(ns)
    outs = [torch.full((n,), float("nan"), device="cuda", dtype=dt) for n in ns]
    kernels_siblings.launch(x, ws, bs, outs)
    for w, b, o in zip(ws, bs, outs):
        ref = w.double() @ x.double() + (b.double() if b is not None else 0)
        assert (o.double() - ref).abs().max().item() <= _bound(ref, dt)


def _optimized(monkeypatch, model):
    monkeypatch.setattr(patching, "_TorchEverywhere", lambda: (lambda linear, act: None))  # every Linear swapped
    return tunedb.optimize(model)


def test_an_attention_block_at_one_row_eager_and_in_a_graph(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(Attn(d=1024, kv=256, bias=True)).cuda().half().eval()
    ref = copy.deepcopy(model)
    monkeypatch.setattr(siblings, "EAGER_MIN_BYTES", 0)  # its 3 MB group launches eagerly at one row too
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")
    _optimized(monkeypatch, model)
    attn = model[0]
    group = attn.q_proj.__dict__["_siblings"][0]
    launches = []
    real = kernels_siblings.site_for

    def counted(*a, **kw):  # every launch goes through the site this returns
        site, grid = real(*a, **kw)
        return (lambda g, *args: (launches.append(1), site(g, *args))[1]), grid
    monkeypatch.setattr(kernels_siblings, "site_for", counted)
    x = torch.randn(1, 1, 1024, device="cuda", dtype=torch.half)
    with torch.no_grad():
        got, want = model(x), ref(x)
        assert len(launches) == 1 and group._state is None  # every sibling took its output
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        for name in ("q_proj", "k_proj", "v_proj"):  # each output as the projection alone computes it
            alone = torch.nn.functional.linear(x, getattr(ref[0], name).weight, getattr(ref[0], name).bias)
            mine = getattr(attn, name)(x)  # a second call: runs alone or launches anew, never a kept output
            torch.testing.assert_close(mine, alone, rtol=1e-2, atol=1e-2)
        two = torch.randn(2, 1024, device="cuda", dtype=torch.half)
        n = len(launches)
        torch.testing.assert_close(model(two), ref(two), rtol=2e-2, atol=2e-2)
        # two rows outside a capture: each projection alone (the eager rule), after one launch that
        # primes a capture's (the kernel loaded, the workspace made); a second call launches nothing
        assert len(launches) == n + 1
        torch.testing.assert_close(model(two), ref(two), rtol=2e-2, atol=2e-2)
        assert len(launches) == n + 1
        many = torch.randn(17, 1024, device="cuda", dtype=torch.half)
        torch.testing.assert_close(model(many), ref(many), rtol=2e-2, atol=2e-2)
        assert len(launches) == n + 1  # past TUNEDB_SIBLING_ROWS: each projection alone
        static = torch.randn(1, 1024, device="cuda", dtype=torch.half)
        model(static)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        for _ in range(3):
            static.copy_(torch.randn(1, 1024, device="cuda", dtype=torch.half))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=2e-2, atol=2e-2)


def test_a_transformers_llama_decode_step(monkeypatch):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    plain = transformers.LlamaModel(cfg).cuda().half().eval()
    model = _optimized(monkeypatch, copy.deepcopy(plain))
    grouped = [m for m in model.modules() if "_siblings" in m.__dict__]
    assert len(grouped) == 2 * (3 + 2)  # q/k/v and gate (its SiLU fused) / up in each layer
    ids = torch.randint(0, 1000, (1, 1), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, plain(ids).last_hidden_state, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("k,ns,bias", [(4096, (4096, 1024, 1024), False), (4096, (14336, 14336), False),
                                       (1000, (333, 17, 65), True), (3000, (2500, 700, 9), True)])
def test_the_tensor_core_path_matches_fp64(dt, m, k, ns, bias):
    """2-16 rows (TUNEDB_SIBLING_ROWS > 1): every row of every member against fp64, rows past M
    never written (the outputs are exactly [M, N_g])."""
    g = torch.Generator(device="cuda").manual_seed(k + m)
    x = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=dt, generator=g) * k ** -0.5 for n in ns]
    bs = [torch.randn(n, device="cuda", dtype=dt, generator=g) for n in ns] if bias else [None] * len(ns)
    outs = [torch.full((m + 1, n), float("nan"), device="cuda", dtype=dt) for n in ns]  # a guard row after M
    kernels_siblings.launch(x, ws, bs, [o[:m] for o in outs])
    for w, b, o in zip(ws, bs, outs):
        ref = x.double() @ w.double().t() + (b.double() if b is not None else 0)
        assert (o[:m].double() - ref).abs().max().item() <= _bound(ref, dt)
        assert torch.isnan(o[m]).all()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tiles", [(64, 128, 4, 5, 2), (64, 128, 4, 5, 4), (32, 128, 1, 5, 3), (128, 128, 4, 4, 2),
                                   (32, 256, 2, 4, 2), (32, 256, 2, 4, 4)])  # the last two: split_for's picks
@pytest.mark.parametrize("k,ns,bias", [(4096, (4096, 1024, 1024), False), (3584, (3584, 512, 512), True),
                                       (1000, (333, 17, 65), True)])
def test_the_split_k_form_in_a_graph_matches_fp64_and_repeats_its_bits(dt, tiles, k, ns, bias):
    """K split into runs reduced inside the kernel (bench/siblings_gemv.py times it): against fp64
    at M = 5, captured once and replayed on new inputs (the counters left zero by every launch),
    and the same input replayed twice gives the same bits (the sum's order is fixed)."""
    m = 5
    g = torch.Generator(device="cuda").manual_seed(k + tiles[-1])
    x = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=dt, generator=g) * k ** -0.5 for n in ns]
    bs = [torch.randn(n, device="cuda", dtype=dt, generator=g) for n in ns] if bias else [None] * len(ns)
    outs = [torch.empty(m, n, device="cuda", dtype=dt) for n in ns]
    sizes = kernels_siblings.workspace_sizes(ns, k, m, tiles)
    work = (torch.zeros(sizes[0], device="cuda"), torch.zeros(sizes[1], device="cuda", dtype=torch.int32))
    kernels_siblings.launch(x, ws, bs, outs, tiles=tiles, workspace=work)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels_siblings.launch(x, ws, bs, outs, tiles=tiles, workspace=work)
    seen = []
    for trial in range(3):
        if trial == 2:
            x.copy_(torch.randn(m, k, device="cuda", dtype=dt, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        assert not work[1].any()
        for w, b, o in zip(ws, bs, outs):
            ref = x.double() @ w.double().t() + (b.double() if b is not None else 0)
            assert (o.double() - ref).abs().max().item() <= _bound(ref, dt)
        seen.append([o.clone() for o in outs])
    assert all(torch.equal(a, b) for a, b in zip(seen[0], seen[1]))


def _warm_up_on_a_side_stream(fn, x, calls=2):
    """torch's recommended warm-up before a capture: a few calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)


def _unnamed_attention():
    """An optimized bf16 attention block whose q/k/v no table names (a group left as written),
    its plain copy, and the group."""
    torch.manual_seed(0)
    model = nn.Sequential(Attn(d=1152, kv=384, bias=True)).cuda().to(torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    tunedb.optimize(model)
    group = model[0].q_proj.__dict__["_siblings"][0]
    assert group.as_written()
    return model, ref, group


@pytest.mark.parametrize("rows", [1, 4])
def test_a_model_no_table_names_warmed_up_eagerly_then_captured(rows):
    """The default path on keys no table measured: q/k/v left as written join their group, which
    eagerly launches only to prime (the eager rule), so the capture after an eager warm-up (CUDA's
    global capture mode, torch's default) loads no module and allocates nothing; the graph's
    outputs are the plain model's on new inputs."""
    model, ref, group = _unnamed_attention()
    static = torch.randn(rows, 1152, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        _warm_up_on_a_side_stream(model, static)
        assert group.launches == 0 and len(group._sites) == 1  # primed, no output served eagerly
        assert len(group._work) == 1  # its workspace made outside the capture
        made, work = dict(group._sites), dict(group._work)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        assert group.launches == 1 and group._sites == made and group._work == work
        for _ in range(3):
            static.copy_(torch.randn(rows, 1152, device="cuda", dtype=torch.bfloat16))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("rows", [1, 4])
def test_members_quiet_eagerly_on_the_default_stream_still_launch_as_a_group_in_a_capture(rows):
    """quiet_members.py on the GPU: after eager calls on the default stream each member left as
    written runs F.linear with no question asked (its quiet forward); torch.cuda.graph's capture
    runs on a side stream, where that forward hands the call to TunedLinear.forward, so the group's
    one launch is captured; the replays and the eager calls after it give the plain model's outputs."""
    from tunedb.families.gemm import quiet_members

    model, ref, group = _unnamed_attention()
    members = [model[0].q_proj, model[0].k_proj, model[0].v_proj]
    static = torch.randn(rows, 1152, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(static), ref(static), rtol=3e-2, atol=3e-2)
        quiet = [m.__dict__.get("forward") for m in members]
        assert all(quiet_members.is_quiet(f) for f in quiet) and group.launches == 0
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        assert group.launches == 1 and [m.__dict__.get("forward") for m in members] == quiet
        for _ in range(3):
            static.copy_(torch.randn(rows, 1152, device="cuda", dtype=torch.bfloat16))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=3e-2, atol=3e-2)
            torch.testing.assert_close(model(static), ref(static), rtol=3e-2, atol=3e-2)
        assert group.launches == 1  # eager calls after the capture: each member alone again


def test_sixteen_rows_through_optimize_in_a_graph(monkeypatch):
    monkeypatch.setenv("TUNEDB_SIBLING_ROWS", "16")
    torch.manual_seed(0)
    model = nn.Sequential(Attn(d=1024, kv=256, bias=False)).cuda().to(torch.bfloat16).eval()
    ref = copy.deepcopy(model)
    _optimized(monkeypatch, model)
    group = model[0].q_proj.__dict__["_siblings"][0]
    static = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        model(static)
        before = group.launches
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        assert group.launches == before + 1
        for _ in range(3):
            static.copy_(torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_a_tensor_parallel_shard_through_optimize_in_a_graph(dt):
    """The default K split (TUNEDB_SIBLING_SPLIT=auto) on a group of few slabs: Llama-3-8B's q/k/v
    over 8 GPUs (512 + 128 + 128 rows at K = 4096), left as written (no table names the keys),
    captured at 4 rows after an eager warm-up; the replays give the plain model's outputs on new
    inputs and leave the workspace's counters zero."""
    torch.manual_seed(0)
    model = nn.Sequential(Attn(d=4096, kv=128, q=512)).cuda().to(dt).eval()
    ref = copy.deepcopy(model)
    tunedb.optimize(model)
    group = model[0].q_proj.__dict__["_siblings"][0]
    assert group.split is True
    static = torch.randn(4, 4096, device="cuda", dtype=dt)
    with torch.no_grad():
        model(static)  # eager: each member alone, the group primed
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        assert group.launches == 1
        # the capture's begin primed the forms the quiet members never ran (1, 2, 16 rows) too
        (sizes,) = [got[2] for key, got in group._sites.items() if key[3] == 4]
        assert sizes != (1, 1)  # a split workspace: the split form is what ran
        for _ in range(3):
            static.copy_(torch.randn(4, 4096, device="cuda", dtype=dt))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=3e-2, atol=3e-2)
        torch.cuda.synchronize()
        assert group._work and not any(work[1].any() for work in group._work.values())


def test_eager_calls_on_the_default_stream_skip_the_group_once_primed_and_a_capture_still_groups():
    """A member left as written, called eagerly on the default stream at a size its group declines:
    the first member's call primes, the second's records the size as quiet, and later calls skip may_take
    (nn.Linear's cost); the outputs stay F.linear's. A capture on a side stream afterwards still
    launches the group, and its replays give the plain model's outputs."""
    model, ref, group = _unnamed_attention()
    static = torch.randn(4, 1152, device="cuda", dtype=torch.bfloat16)
    asked = []
    take = group.may_take
    group.may_take = lambda x: asked.append(x.shape[0]) or take(x)
    with torch.no_grad():
        for _ in range(2):
            model(static)
        # q_proj's call primes, k_proj's makes the size quiet; v_proj and every later call skip it
        assert (static.numel(), torch.bfloat16) in group.quiet and len(asked) == 2
        for _ in range(3):
            torch.testing.assert_close(model(static), ref(static), rtol=0, atol=0)
        assert len(asked) == 2 and group.launches == 0  # quiet: no may_take, no launch
        del group.may_take
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static)
        assert group.launches == 1
        for _ in range(3):
            static.copy_(torch.randn(4, 1152, device="cuda", dtype=torch.bfloat16))
            graph.replay()
            torch.testing.assert_close(out, ref(static), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("served", [False, True])
@pytest.mark.parametrize("rows", [1, 4])
def test_torch_compile_traces_a_grouped_model_without_a_graph_break(monkeypatch, served, rows):
    """Under torch.compile a member takes nn.Linear's form (left as written) or the tuned op
    (served), never the group's host-side launch, whose state and stream queries Dynamo would
    break its graph on; also after eager calls made the members quiet. The compiled model gives
    the plain model's outputs within the plain compiled model's distance from an fp64 reference
    (the block's sums over k and v amplify bf16 rounding: Inductor's fusions round elsewhere)."""
    if served:
        torch.manual_seed(0)
        model = nn.Sequential(Attn(d=1024, kv=256, bias=True)).cuda().to(torch.bfloat16).eval()
        ref = copy.deepcopy(model)
        _optimized(monkeypatch, model)
        group = model[0].q_proj.__dict__["_siblings"][0]
    else:
        model, ref, group = _unnamed_attention()
    x = torch.randn(rows, model[0].q_proj.in_features, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        for _ in range(3):
            model(x)  # eager first: primes the group, members may go quiet
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
        compiled, plain = torch.compile(model, dynamic=False), torch.compile(ref, dynamic=False)
        exact = copy.deepcopy(ref).double()
        for _ in range(2):
            x = torch.randn_like(x)
            want = exact(x.double())
            err, err_plain = ((f(x).double() - want).abs().max().item() for f in (compiled, plain))
            assert err <= 2 * err_plain + 1e-2 * want.abs().max().item(), (err, err_plain)
    torch._dynamo.reset()


def test_a_model_compiled_while_its_members_are_quiet_is_captured_without_a_recompile():
    """bench/e2e.py's order: eager calls on the default stream make the members quiet, the model
    is compiled (default mode), warmed up on a side stream and captured by hand. The capture
    must not recompile (a recompile inside it invalidates the capture: session 46), and the
    replays give the plain model's outputs."""
    from torch._dynamo.utils import counters

    model, ref, _group = _unnamed_attention()
    static = torch.randn(1, 1152, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad():
        for _ in range(3):
            model(static)
        assert quiet_members.is_quiet(model[0].q_proj.__dict__.get("forward"))
        compiled = torch.compile(model, dynamic=False)
        compiled(static)
        _warm_up_on_a_side_stream(compiled, static)
        frames = counters["stats"]["unique_graphs"]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(static)
        assert counters["stats"]["unique_graphs"] == frames  # nothing compiled inside the capture
        exact = copy.deepcopy(ref).double()
        for _ in range(3):
            static.copy_(torch.randn_like(static))
            graph.replay()
            want = exact(static.double())
            err, err_plain = ((y.double() - want).abs().max().item() for y in (out, ref(static)))
            assert err <= 2 * err_plain + 1e-2 * want.abs().max().item(), (err, err_plain)
    torch._dynamo.reset()
