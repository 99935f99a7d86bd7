"""The bmm family on the CPU: keys and layouts, the census of products on meta tensors (one
owner per call with GEMM), the validity predicate shared by the space, the candidates and the
selector, a simulated build through the database and the selector, and the run-time op."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tunedb import database, families, pipeline, settings
from tunedb.arch import shipped_profile
from tunedb.census.recorder import Recorder, record
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.bmm import configs, keys
from tunedb.records import Config, Point, ShapeSet, Signature
from tunedb.runtime import selector

BMM = families.get("bmm")
SM90 = shipped_profile("sm90")


def sig(b, n, k, dt="half", lay="nn"):
    return Signature.make("bmm", "bmm", dt, B=b, N=n, K=k, lay=lay)


# --- keys ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("lay", configs.LAYOUTS)
@pytest.mark.parametrize("dtype,dt", [(torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")])
def test_call_keys_name_dtype_and_layout(lay, dtype, dt):
    want = keys.make_signature(6, 40, 24, dt, lay)
    (a, b), _ = BMM.make_inputs(want, 9, "cpu", 0)
    assert a.dtype == dtype and tuple(a.shape) == (6, 9, 24) and tuple(b.shape) == (6, 24, 40)
    assert BMM.signature_of("bmm", a, b) == (want, 9)
    assert want.lookup_keys()[-1] == want.with_dt("half") or dt == "fp32"  # a census's half key serves both


def test_two_d_operands_are_one_batch_and_size_one_dims_are_row_major():
    a, b = torch.empty(7, 3, device="meta"), torch.empty(5, 3, device="meta").t()
    assert BMM.signature_of("bmm", a, b) == (sig(1, 5, 3, "fp32", "nt"), 7)
    # a column of one element has any stride: it is not called transposed
    q, k = torch.empty(4, 1, 64, device="meta"), torch.empty(4, 1, 64, device="meta").transpose(1, 2)
    assert BMM.signature_of("bmm", q, k)[0].get("lay") == "nn"


@pytest.mark.parametrize("lay", configs.LAYOUTS)
@pytest.mark.parametrize("bt,n,k", [(3, 40, 24), (2, 1, 24), (2, 40, 1)])
@pytest.mark.parametrize("m", [1, 17])
def test_a_keys_inputs_are_served_under_keyed_as(lay, bt, n, k, m):
    """The GPU run's failing case (B=3, N=40, K=24, M=1, a transposed): one row of a transposed
    a is stored row-major, so its call keys as the 'n' layout; keyed_as names that key."""
    want = keys.make_signature(bt, n, k, "fp16", lay)
    (a, b), _ = BMM.make_inputs(want, m, "cpu", seed=m + n)
    got, got_m = BMM.signature_of("bmm", a, b)
    assert (got, got_m) == (keys.keyed_as(want, m), m)
    a_major = "n" if m == 1 or k == 1 else lay[0]
    b_major = "n" if k == 1 or n == 1 else lay[1]
    assert got.get("lay") == a_major + b_major
    assert (got == want) == (a_major + b_major == lay)


@pytest.mark.parametrize("a_shape,b_shape,dtypes,words", [
    ((2, 4, 8), (3, 8, 5), (torch.half, torch.half), "do not match"),
    ((2, 4, 8), (2, 7, 5), (torch.half, torch.half), "do not match"),
    ((4, 8), (2, 8, 5), (torch.half, torch.half), "both 2-D"),
    ((2, 4, 8), (2, 8, 5), (torch.half, torch.float32), "share a dtype"),
    ((2, 4, 8), (2, 8, 5), (torch.int8, torch.int8), "torch.int8"),
    ((2, 0, 8), (2, 8, 5), (torch.half, torch.half), "non-empty"),
])
def test_bad_calls_say_what_is_wrong(a_shape, b_shape, dtypes, words):
    a = torch.empty(a_shape, dtype=dtypes[0], device="meta")
    b = torch.empty(b_shape, dtype=dtypes[1], device="meta")
    with pytest.raises(SignatureError, match=words):
        BMM.signature_of("bmm", a, b)


def test_a_none_operand_is_named():
    from tunedb.families.bmm.ops import bmm

    a = torch.randn(2, 3, 4)
    with pytest.raises(SignatureError, match="bmm's b must be a tensor, got None"):
        bmm(a, None)
    with pytest.raises(SignatureError, match="bmm's a must be a tensor, got None"):
        bmm(None, a)
    with pytest.raises(SignatureError, match="bmm's b must be a tensor, got None"):
        BMM.signature_of("bmm", a, None)


def test_schema_refuses_bad_fields():
    with pytest.raises(SignatureError, match="lay='xy'; allowed: nn, nt, tn, tt"):
        keys.make_signature(2, 3, 4, "half", "xy")
    with pytest.raises(SignatureError, match="dt='int8' is not served"):
        keys.make_signature(2, 3, 4, "int8")
    with pytest.raises(SignatureError, match="missing field 'lay'"):
        BMM.schema.check(Signature("bmm", "bmm", "half", (("B", 2), ("N", 3), ("K", 4))))


def test_work_counts_every_batch():
    flops, moved = BMM.work(sig(8, 64, 1500), 1500)
    assert flops == 2.0 * 8 * 1500 * 64 * 1500
    assert moved == 8 * (1500 * 1500 + 1500 * 64 + 1500 * 64) * 2


# --- census on meta tensors ---------------------------------------------------------------------

def test_eager_attention_products_are_bmm_keys_with_their_layouts():
    b, h, t, d = 2, 4, 10, 16
    q = torch.randn(b, h, t, d, device="meta", dtype=torch.bfloat16)
    k = torch.randn(b, h, t, d, device="meta", dtype=torch.bfloat16)

    def attend():
        scores = torch.matmul(q, k.transpose(-1, -2))
        return torch.matmul(scores.softmax(-1), k)
    assert record(attend) == {(sig(8, 10, 16, lay="nt"), 10): 1, (sig(8, 16, 10, lay="nn"), 10): 1}


def test_each_product_has_one_owner():
    """A Linear (also on 3-D input, through an expanded-weight bmm) is GEMM's; a product of
    activations and a stack of distinct weights are bmm's; never both."""
    with torch.device("meta"):
        lin = nn.Linear(32, 48).half()
        x = torch.randn(3, 5, 32, dtype=torch.half)
        experts = nn.Parameter(torch.empty(4, 32, 16, dtype=torch.half))
        xe = torch.randn(4, 6, 32, dtype=torch.half)
        shared = nn.Parameter(torch.empty(32, 16, dtype=torch.half))

    calls = record(lambda: (lin(x), torch.bmm(xe, experts), torch.matmul(x, shared), torch.bmm(xe, xe.transpose(1, 2))))
    owners = {(s.family, s.op) for s, _ in calls}
    # x @ W of a weight stored [in, out] is GEMM's, keyed seen-not-patched (census_rules.UNPATCHED)
    assert owners == {("gemm", "gemm"), ("gemm", "unpatched"), ("bmm", "bmm")}
    assert sum(calls.values()) == 4  # four products, four records
    assert calls[(Signature.make("gemm", "gemm", "half", N=48, K=32), 15)] == 1
    assert calls[(Signature.make("gemm", "unpatched", "half", N=16, K=32, src="conv1d"), 15)] == 1
    assert calls[(sig(4, 16, 32), 6)] == 1
    assert calls[(sig(4, 6, 32, lay="nt"), 6)] == 1


def test_whisper_mirror_census_keys_its_attention(tmp_path):
    from tunedb.census import presets

    built = presets.workload("whisper-base").build(torch.device("meta"), "mirror")
    with torch.no_grad(), Recorder(families=("bmm",)) as rec:
        built.model(*built.inputs(2, 3000))
    assert set(rec.calls) == {(sig(16, 1500, 64, lay="nt"), 1500), (sig(16, 64, 1500, lay="nn"), 1500)}
    assert set(rec.calls.values()) == {6}  # one of each per layer


# --- configs and THE validity predicate ---------------------------------------------------------

def test_config_ids_round_trip_and_bad_ids_are_named():
    for c in configs.full_grid():
        assert configs.parse(c.id) == c
    assert configs.parse("torch") == Config.sentinel("torch")
    with pytest.raises(ConfigError, match="bad bmm config id 'b64x64'"):
        configs.parse("b64x64")
    with pytest.raises(ConfigError, match="BM=24 not allowed"):
        configs.parse("b24x64x32_w4_s3_g8")
    with pytest.raises(ConfigError, match="no 'fused' arm"):
        configs.parse("fused")


def test_the_predicate_rejects_what_cannot_run_and_says_why():
    big = configs.make(128, 128, 64, 8, 4)
    half, single = sig(8, 64, 64), sig(8, 64, 64, "fp32")
    assert configs.invalid_reason(big, half, 64, SM90) is None  # 4 x 256 x 64 x 2 B = 128 KiB
    assert "shared memory" in configs.invalid_reason(big, single, 64, SM90)  # 256 KiB of fp32
    assert "registers" in configs.invalid_reason(configs.make(128, 128, 32, 2, 3), half, 64, SM90)
    assert "grid's second dimension" in configs.invalid_reason(configs.UNTUNED, sig(70000, 64, 64), 64, SM90)
    assert configs.invalid_reason(Config.sentinel("torch"), sig(70000, 64, 64), 64, SM90) is None
    assert "M=0" in configs.invalid_reason(configs.UNTUNED, half, 0, SM90)
    assert "not an arm" in configs.invalid_reason(Config.sentinel("heuristic"), half, 64, SM90)


def test_one_predicate_behind_space_candidates_and_selector():
    single = sig(8, 64, 64, "fp32")
    cands = BMM.candidates(single, 64, SM90)
    assert cands == tuple(c for c in configs.config_space("sm90") if configs.invalid_reason(c, single, 64, SM90) is None)
    assert len(cands) < len(configs.config_space("sm90"))  # fp32 loses the deepest tiles
    assert all(configs.smem_bytes(c, "half") <= SM90.smem_per_block for c in configs.config_space("sm90"))
    # the build's candidates are the same function's answer
    from tunedb.build.plan import candidates

    assert {c.id for c in candidates(BMM, single, 64, SM90)} == {c.id for c in cands}


def test_untuned_and_unmeasured_run_torch():
    s = sig(8, 64, 64)
    assert BMM.default_config(s).id == "torch"
    assert BMM.sentinels(s) == ("default", "torch")
    rule = BMM.pick_rule()
    assert rule.fallback == "torch" and rule.pick({"torch": 1.0, "b64x64x32_w4_s3_g8": 0.97}).winner == "torch"
    assert rule.pick({"torch": 1.0, "b64x64x32_w4_s3_g8": 0.8}).winner == "b64x64x32_w4_s3_g8"
    ids = {c.id for c in BMM.compile_set("sm90", ["b128x128x64_w8_s4_g8", "nonsense"])}
    assert {"b128x128x64_w8_s4_g8", configs.UNTUNED.id, "torch", "default"} <= ids and "nonsense" not in ids


# --- census -> simulated build -> database -> selector ------------------------------------------

def test_a_simulated_build_writes_a_table_the_selector_serves(tmp_path):
    from tunedb.build.steps import simulated_timer

    scores, context = sig(16, 1500, 64, lay="nt"), sig(16, 64, 1500)
    shapes = ShapeSet((Point(scores, 1500, weight=0.5, calls=6), Point(context, 1500, weight=0.5, calls=6)), "attn")
    out = tmp_path / "db"
    timer = simulated_timer(BMM, SM90, seed=0, noise=0.01)
    result = pipeline.build([("attn", shapes)], pipeline.BuildOptions(out=str(out), family="bmm", isolate=False,
                                                                      fill=False), timer=timer)
    assert {e.signature for e in result.entries} == {scores, context}
    path = out / "sm90" / "bmm.json"
    db = database.load(path, "bmm", "sm90")
    assert db.validators["impl_hash"] == BMM.impl_hash()
    for entry in db.entries.values():
        for region in entry.regions:
            assert configs.invalid_reason(configs.parse(region.config_id), entry.signature, 1500, SM90) is None
    try:
        with settings.override(USER_DB=str(out)):
            selector.configure("sm90")
            res = selector.peek("bmm", scores, 1500)
            assert res.tier == "user" and res.config.id == db.entries[scores].lookup(1500).replace("default", "torch")
            # a run-time bf16 call finds the census's half key
            assert selector.peek("bmm", scores.with_dt("bf16"), 1500).tier == "user"
            assert selector.peek("bmm", sig(3, 7, 5), 4).config.id == "torch"  # unmeasured: torch
    finally:
        selector.configure()


# --- the run-time op and optimize() ---------------------------------------------------------------

def test_the_op_on_cpu_and_under_fake_tensors():
    from tunedb.families.bmm import ops

    a, b = torch.randn(3, 5, 7), torch.randn(3, 9, 7).transpose(1, 2)
    torch.testing.assert_close(ops.bmm(a, b), torch.bmm(a, b))
    torch.testing.assert_close(ops.bmm(a[0], b[0]), a[0] @ b[0])
    with pytest.raises(SignatureError, match="do not match"):
        ops.bmm(a, a)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fa, fb = torch.empty(4, 6, 8, dtype=torch.half), torch.empty(4, 8, 2, dtype=torch.half)
        out = torch.ops.tunedb.bmm(fa, fb)
    assert tuple(out.shape) == (4, 6, 2) and out.dtype == torch.half


def test_optimize_installs_the_product_mode_only_where_a_table_has_entries(tmp_path):
    from tunedb.families.bmm import serving

    model = nn.Linear(4, 4)
    try:
        with settings.override(USER_DB=str(tmp_path / "empty")):
            selector.configure("sm90")
            database.reload()
            if not serving.has_table():  # no user table; the shipped tier may hold none either
                assert BMM.optimize(model) is model and not getattr(model, "_tunedb_bmm_serving", False)
        serving.install(model)
        serving.install(model)
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
        x = torch.randn(2, 4)
        torch.testing.assert_close(model(x), x @ model.weight.t() + model.bias)  # CPU: nothing served
    finally:
        selector.configure()


def test_the_product_mode_folds_only_what_the_op_serves():
    from tunedb.families.bmm.serving import fold

    a = torch.randn(2, 3, 4, 5)
    assert fold(a, torch.randn(2, 3, 5, 6)) is None  # CPU tensors are torch's
    meta = lambda *s, **kw: torch.empty(*s, device="meta", **kw)  # noqa: E731
    assert fold(meta(2, 3, 4, 5), meta(2, 3, 5, 6)) is None  # not CUDA either


def test_the_product_mode_survives_deepcopy_and_torch_compile():
    import copy

    from tunedb.families.bmm import serving

    class Attend(nn.Module):
        def forward(self, q, k, v):
            return torch.matmul(torch.matmul(q, k.transpose(-1, -2)).softmax(-1), v)

    model = serving.install(Attend())
    q = torch.randn(2, 3, 5, 4)
    want = Attend()(q, q, q)
    torch.testing.assert_close(model(q, q, q), want)
    twin = copy.deepcopy(model)
    assert len(twin._forward_pre_hooks) == 1 and len(twin._forward_hooks) == 1
    torch.testing.assert_close(torch.compile(twin, backend="eager")(q, q, q), want)
    assert not getattr(serving._state, "modes", [])  # every forward left its mode


def test_a_compiled_call_running_the_hooks_as_python_takes_them_off():
    """A graph break in the forward leaves the hooks outside the compiled graphs: Dynamo runs them
    as Python around the compiled pieces, where the compiler takes every product. The first such
    call takes them off (they served nothing, and cost the compiled forward host time: Llama-3-8B
    0.94x of compile alone, session 48); results stay the plain model's, and an eager model's
    hooks stay on."""
    from tunedb.families.bmm import serving

    class Branchy(nn.Module):
        def forward(self, q):
            s = torch.matmul(q, q.transpose(-1, -2))
            if s.sum() > 0:  # data-dependent: a graph break
                s = s * 2
            return torch.matmul(s.softmax(-1), q)

    q = torch.randn(2, 3, 5, 4)
    want = Branchy()(q)
    eager = serving.install(Branchy())
    torch.testing.assert_close(eager(q), want)
    assert len(eager._forward_pre_hooks) == 1 and len(eager._forward_hooks) == 1
    model = serving.install(Branchy())
    compiled = torch.compile(model, backend="eager")
    try:
        for _ in range(3):
            torch.testing.assert_close(compiled(q), want)
        assert not model._forward_pre_hooks and not model._forward_hooks
        assert model._tunedb_bmm_serving is False
        assert not getattr(serving._state, "modes", [])  # no forward left a mode behind
        torch.testing.assert_close(eager(q), want)
        assert len(eager._forward_pre_hooks) == 1  # the eager model's hooks are its own
        inplace = serving.install(Branchy())  # module.compile(): Dynamo traces the hooks, no break
        inplace.compile(backend="eager")
        torch.testing.assert_close(inplace(q), want)
    finally:
        torch._dynamo.reset()


def test_another_threads_compiled_call_leaves_an_eager_models_hooks_on(monkeypatch):
    """torch's "in an optimized module" flag is process-wide: set while another thread runs a
    torch.compile'd module (and left set by two such calls overlapping). An eager call on this
    thread must keep its model's hooks: only this thread's Dynamo frame callback counts."""
    import torch._dynamo.eval_frame as frames

    from tunedb.families.bmm import serving

    class Attend(nn.Module):
        def forward(self, q):
            return torch.matmul(q, q.transpose(-1, -2))

    model = serving.install(Attend())
    monkeypatch.setattr(frames, "_in_optimized_module", True)
    q = torch.randn(2, 3, 5, 4)
    torch.testing.assert_close(model(q), Attend()(q))
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
    assert not getattr(serving._state, "modes", [])


def _counting_model(monkeypatch, body=lambda: None):
    """A model under the product mode's hooks that counts its forwards (calls) and the forward at
    which each entered the mode (entered); body() runs inside each forward."""
    from tunedb.families.bmm import serving

    calls: list = []
    entered: list = []
    real = serving.product_mode
    monkeypatch.setattr(serving, "product_mode", lambda: entered.append(len(calls)) or real())

    class Model(nn.Module):
        def forward(self, x):
            calls.append(x)
            body()
            return x * 2

    return serving.install(Model()), calls, entered


def test_the_product_mode_backs_off_in_eager_where_the_forward_served_no_product(monkeypatch):
    """A forward that served no product with a tile (SDPA attention: no matmul at all) makes the
    next 1, 2, 4, ... eager forwards skip the mode (its hop on every torch call cost Llama's eager
    decode 26-37%); a forward that served one resets the gap; capture always runs the mode."""
    from tunedb.families.bmm import serving

    serves = {"now": False}

    def body():
        if serves["now"]:  # what serve() does when a tile answers a product
            serving._state.served = getattr(serving._state, "served", 0) + 1

    model, calls, entered = _counting_model(monkeypatch, body)
    x = torch.ones(2)
    for _ in range(12):
        torch.testing.assert_close(model(x), x * 2)
    assert entered == [0, 2, 5, 10]  # probes after gaps of 1, 2, 4 forwards
    serves["now"] = True
    entered.clear()
    for _ in range(40):  # the next probe (after a gap of 8) serves: every forward enters again
        model(x)
    assert entered[0] == 19 and entered[1:4] == [20, 21, 22]
    serves["now"] = False
    monkeypatch.setattr(serving, "_capturing", lambda: True)
    entered.clear()
    for _ in range(3):
        model(x)
    assert entered == [52, 53, 54]  # under capture the mode runs whatever the last forward did
    assert not getattr(serving._state, "modes", [])
    monkeypatch.setattr(serving, "_capturing", lambda: False)
    serving._checks.clear()
    entered.clear()
    for _ in range(3):
        model(x)
    # and the capture left the eager back-off where it was: the forward after it probes (the
    # last eager forward served), then a gap of 1 (session 31: a capture used to restart the
    # back-off from nothing, so eager forwards after it ran the mode often)
    assert entered == [55, 57]


def test_the_back_off_ends_when_the_database_epoch_moves_on(monkeypatch):
    """A model backed off (its forwards served no product) probes again at its next forward once
    the database moves to a new epoch (a tune, autotune()'s or prewarm's publish): the new tables
    may serve what the old ones left to torch, and the back-off grows to 1024 forwards."""
    from tunedb.families.bmm import serving
    from tunedb.runtime import selector

    model, calls, entered = _counting_model(monkeypatch)
    x = torch.ones(2)
    for _ in range(12):
        model(x)
    assert entered == [0, 2, 5, 10]  # skipping forwards 11-18
    selector.reload()
    model(x)
    assert entered[-1] == 12  # the first forward of the new epoch probes
    model(x)
    assert entered[-1] == 12  # and serving nothing, it backs off again (a gap of 1)


def test_a_model_whose_products_torch_served_backs_off_at_most_8_forwards(monkeypatch):
    """Products the op could take, all served by torch at these shapes (a long decode), cap the
    back-off at 8 forwards, so the next request's prefill (a tile's shapes) is probed soon."""
    from tunedb.families.bmm import serving

    def body():
        serving._state.candidates = getattr(serving._state, "candidates", 0) + 1  # serve() met one

    model, calls, entered = _counting_model(monkeypatch, body)
    for _ in range(60):
        model(torch.ones(2))
    gaps = [b - a - 1 for a, b in zip(entered, entered[1:])]
    assert gaps[:3] == [1, 2, 4] and set(gaps[3:]) == {8}


def test_only_a_signature_some_table_tiles_counts_as_a_candidate_for_the_short_back_off(tiers_dirs):
    """may_become_tile: a torch-served product holds the back-off at 8 forwards only if a loaded
    table names a tile for its signature at some M (a "half" key serves fp16 and bf16), or
    autotune() overrides; a model nobody measured (no entry for its shapes) backs off fully, and
    so does Llama's fp32 rotary product under the shipped fp16 table."""
    from tunedb.families.bmm import serving
    from tunedb.records import Entry, Region
    from tunedb.runtime import launch_table

    tile = configs.parse("b64x128x64_w4_s3_g8")
    cross = sig(8, 1500, 64, lay="nt")
    assert not any(serving.may_become_tile(cross.with_dt(dt)) for dt in ("fp16", "bf16", "fp32"))
    database.write_entries("user", "bmm", "sm90", [Entry(sig(8, 64, 1500), (Region(None, "torch"),))], [])
    selector.reload()  # a table, but torch everywhere: still no candidate
    assert not serving.may_become_tile(sig(8, 64, 1500, dt="fp16"))
    database.write_entries("user", "bmm", "sm90", [Entry(cross, (Region(1500, tile.id), Region(None, "torch")))], [tile])
    selector.reload()  # the new epoch forgets the answers of the last
    assert serving.may_become_tile(cross.with_dt("fp16")) and serving.may_become_tile(cross.with_dt("bf16"))
    assert not serving.may_become_tile(cross.with_dt("fp32"))
    assert not serving.may_become_tile(sig(8, 1500, 64, dt="bf16"))  # the same sizes, another layout
    assert not serving.may_become_tile(sig(6, 77, 64, dt="bf16", lay="nt"))  # shapes no table names
    with launch_table.overriding(lambda family, s, m: None):  # autotune() may measure any key
        assert serving.may_become_tile(cross.with_dt("fp32"))


def test_an_installed_ranker_makes_every_signature_a_candidate_for_the_short_back_off(tiers_dirs):
    """selector.set_ranker("bmm", ...) lets the model tier pick a tile for keys no table holds: a
    torch-served product's next shapes may be a tile's whatever its signature (set_ranker starts
    an epoch, which drops the per-signature answers)."""
    from tunedb.families.bmm import serving

    fp32, fp16 = sig(4, 96, 32, dt="fp32"), sig(4, 96, 32, dt="fp16")
    assert not serving.may_become_tile(fp32)
    selector.set_ranker("bmm", lambda s, m, candidates: candidates[0])
    try:
        assert serving.may_become_tile(fp32) and serving.may_become_tile(fp16)
    finally:
        selector.set_ranker("bmm", None)
    assert not serving.may_become_tile(fp32)

def test_a_model_that_never_serves_a_product_retires_the_mode_until_a_new_epoch_or_autotune(monkeypatch):
    """After a probe that follows a gap of 64 forwards serves nothing again (and meets no
    candidate), the mode's hooks come off the model: kept on, the hooks alone cost a small
    unseen model's eager forward 3-8% (session 31). A new epoch or autotune() re-arms it."""
    from tunedb.families.bmm import serving
    from tunedb.runtime import launch_table, selector

    model, calls, entered = _counting_model(monkeypatch)
    x = torch.ones(2)
    for _ in range(200):
        torch.testing.assert_close(model(x), x * 2)
    assert entered == [0, 2, 5, 10, 19, 36, 69, 134]  # the probe after the gap of 64 retired it
    assert not model._forward_pre_hooks and not model._forward_hooks and not model._forward_hooks_always_called
    assert not model._tunedb_bmm_serving
    selector.reload()  # a new epoch (a tune, a publish) re-arms it
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1 and model._tunedb_bmm_serving
    entered.clear()
    calls.clear()
    for _ in range(3):
        model(x)
    assert entered == [0, 2]  # probing from the start again
    for _ in range(200):
        model(x)
    assert not model._forward_pre_hooks
    with launch_table.overriding(lambda family, s, m: None):  # autotune() entering re-arms it too
        assert len(model._forward_pre_hooks) == 1
        for _ in range(300):  # and under autotune it never retires
            model(x)
        assert len(model._forward_pre_hooks) == 1
    assert not getattr(serving._state, "modes", [])


def test_retirement_never_replaces_a_forwards_exception_nor_strands_an_outer_forwards_mode(monkeypatch):
    """The probe that would retire the mode raising (an OOM, say): torch runs the always-called
    hook inside its own loop over the hooks dict, so the hooks must stay on and the user's error
    must come out as it was. A module calling itself: the inner forward's probe must not take the
    hooks off while the outer forward is in flight (its _exit would never run, and the mode would
    stay on the thread for good)."""
    from tunedb.families.bmm import serving

    fail = {"now": False}

    def body():
        if fail["now"]:
            raise MemoryError("out of memory (simulated)")

    model, calls, entered = _counting_model(monkeypatch, body)
    model.register_forward_hook(lambda mod, args, out: None, always_call=True)  # a user's hook after ours
    x = torch.ones(2)
    for _ in range(134):
        model(x)
    assert entered[-1] == 69  # the next forward (134) is the probe that would retire
    fail["now"] = True
    with pytest.raises(MemoryError, match="simulated"):
        model(x)
    assert model._tunedb_bmm_serving and len(model._forward_pre_hooks) == 1
    assert not getattr(serving._state, "modes", []) and not torch._C._len_torch_function_stack()

    class Recursive(nn.Module):
        def forward(self, x, depth=0):
            return self(x, depth + 1) if depth == 0 else x * 2

    rec = serving.install(Recursive())
    for _ in range(300):
        rec(x)
        assert not getattr(serving._state, "modes", []) and not torch._C._len_torch_function_stack()
    assert not rec._forward_pre_hooks  # retired, between two forwards
