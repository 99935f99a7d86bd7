"""The group_gemm family on the CPU: keys, the validity predicate, the routing metadata, the
torch arms against the fp32 reference, the census of transformers MoE models on meta tensors and
optimize()'s experts swap. The Triton kernel's interpreter checks are test_group_gemm_interpret.py."""
from __future__ import annotations

import pytest
import torch

from tunedb import families
from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError, SignatureError
from tunedb.families.contract import missing_members
from tunedb.families.group_gemm import arms, configs, routing
from tunedb.families.group_gemm.keys import make_signature, signature_of

FAM = families.get("group_gemm")


def test_family_is_registered_and_complete():
    assert "group_gemm" in families.names()
    assert missing_members(FAM) == ()
    sig = make_signature(8, 28672, 4096, 2, "bf16", "token")
    assert sig.format() == "group_gemm|op=group_gemm|dt=bf16|E=8|N=28672|K=4096|top_k=2|x=token"
    assert FAM.schema.check(sig) is sig


def test_signature_of_meta_tensors_both_forms():
    w = torch.empty(8, 64, 32, dtype=torch.bfloat16, device="meta")
    ids = torch.empty(5, 2, dtype=torch.int64, device="meta")
    sig, m = signature_of("group_gemm", torch.empty(5, 32, dtype=torch.bfloat16, device="meta"), w, ids)
    assert (sig.get("E"), sig.get("N"), sig.get("K"), sig.get("top_k"), sig.get("x"), m) == (8, 64, 32, 2, "token", 5)
    sig, m = signature_of("group_gemm", torch.empty(5, 2, 32, dtype=torch.bfloat16, device="meta"), w, ids,
                          torch.empty(5, 2, device="meta"))
    assert sig.get("x") == "slot" and m == 5


@pytest.mark.parametrize("x_shape,w_shape,ids_shape,dtype,needle", [
    ((5, 31), (8, 64, 32), (5, 2), torch.bfloat16, "x must be [M, K] = [5, 32]"),
    ((5, 32), (64, 32), (5, 2), torch.bfloat16, "weight must be [E, N, K]"),
    ((5, 32), (8, 64, 32), (5,), torch.bfloat16, "topk_ids must be [M, top_k]"),
    ((5, 32), (8, 64, 32), (5, 2), torch.float32, "bfloat16 or torch.float16"),
    ((5, 32), (2, 64, 32), (5, 3), torch.bfloat16, "top_k=3 exceeds E=2"),
])
def test_bad_calls_name_the_bad_value(x_shape, w_shape, ids_shape, dtype, needle):
    with pytest.raises(SignatureError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        signature_of("group_gemm", torch.empty(x_shape, dtype=dtype, device="meta"),
                     torch.empty(w_shape, dtype=dtype, device="meta"), torch.empty(ids_shape, dtype=torch.int64, device="meta"))


def test_config_ids_round_trip_and_the_predicate():
    arch = shipped_profile("sm90")
    sig = make_signature(8, 28672, 4096, 2)
    space = FAM.config_space("sm90")
    assert len(space) >= 30 and configs.default_config().id in {c.id for c in space}
    for c in space + configs.full_grid():
        assert FAM.parse_config(c.id) == c
    grouped = [c for c in space if c.lane == "triton_grouped"]
    slots = [c for c in space if c.lane == configs.SLOTS_LANE]
    assert len(grouped) >= 30 and len(slots) >= 6
    assert all(FAM.invalid_reason(c, sig, None, arch) is None for c in grouped)
    # the routing-free lane: valid while M * top_k <= SLOTS_MAX, never "at any M"
    bound = configs.SLOTS_MAX // sig.get("top_k")
    assert all(FAM.invalid_reason(c, sig, m, arch) is None for c in slots for m in (1, 16, bound))
    assert "not every M" in FAM.invalid_reason(slots[0], sig, None, arch)
    assert f"not {bound + 1} x 2" in FAM.invalid_reason(slots[0], sig, bound + 1, arch)
    assert FAM.parse_config("sl_b1x32x256_w4_s2") == configs.make_slots(32, 256, 4, 2)
    big = configs.make(128, 256, 128, 8, 5, 8)
    assert "shared memory" in FAM.invalid_reason(big, sig, 64, arch)
    spill = configs.make(128, 256, 64, 4, 2, 8)
    assert "spills" in FAM.invalid_reason(spill, sig, 64, arch)
    assert "BK=128 is more than twice K=32" in FAM.invalid_reason(configs.make(16, 64, 128, 4, 3, 8),
                                                                    make_signature(4, 64, 32, 2), 8, arch)
    for bad in ("b64x64x64_w4_s3", "b64x64x48_w4_s3_g8", "fused", "sl_b16x32x256_w4_s2", "sl_b1x32x256_w4_s2_g8"):
        with pytest.raises(ConfigError):
            FAM.parse_config(bad)
    assert FAM.sentinels(sig) == ("default", "torch")


@pytest.mark.parametrize("case", ["random", "one_expert_takes_all", "some_empty", "single_token"])
@pytest.mark.parametrize("bm", [16, 64])
def test_routing_metadata_matches_a_python_reference(case, bm):
    gen = torch.Generator().manual_seed(3)
    e, m, k = 6, 37, 2
    if case == "random":
        ids = arms.random_routing(m, e, k, gen, "cpu")
    elif case == "one_expert_takes_all":
        ids = torch.full((m, 1), 4, dtype=torch.int32)
    elif case == "some_empty":
        ids = torch.randint(0, 2, (m, k), generator=gen, dtype=torch.int32) * 3  # experts 0 and 3 only
    else:
        ids = torch.tensor([[5, 1]], dtype=torch.int32)
    r = routing.route(ids, e, bm)
    rows, experts = routing.reference_route(ids, e, bm)
    assert r.sorted_ids.tolist() == rows
    assert r.block_expert.tolist() == experts
    assert r.counts.tolist() == [int((ids == i).sum()) for i in range(e)]
    assert r.sorted_ids.numel() == routing.padded_len(ids.numel(), e, bm)


@pytest.mark.parametrize("form", ["token", "slot"])
@pytest.mark.parametrize("arm", ["loop", "grouped_mm"])
def test_torch_arms_match_the_fp32_reference(form, arm):
    sig = make_signature(6, 40, 24, 3, "bf16", form)
    if arm == "grouped_mm" and arms.grouped_mm_reason("bf16", "cpu", 40, 24) is not None:
        pytest.skip(arms.grouped_mm_reason("bf16", "cpu", 40, 24))
    args, _ = FAM.make_inputs(sig, 9, "cpu", seed=1)
    ids = args[2].clone()
    ids[:, 0] = 2  # one expert in every token, others random; expert coverage varies
    args = (args[0], args[1], ids, *args[3:])
    ref = FAM.reference(sig, *args)
    y = getattr(arms, arm)(sig, *args)
    assert y.shape == (9, 3, 40) and y.dtype == torch.bfloat16
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
    out = torch.full_like(y, float("nan"))
    assert getattr(arms, arm)(sig, *args, out=out) is out and torch.equal(out, y)


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("form", ["token", "slot"])
def test_every_sentinel_and_tile_returns_the_out_it_is_given(dt, form):
    """launch(..., out=out) returns `out` itself for every arm (the GPU test and callers that
    reuse a buffer rely on it); on the CPU without the interpreter every arm is the torch arm
    (grouped_mm for bf16 where this torch runs it on the CPU, else the loop)."""
    sig = make_signature(5, 200, 136, 2, dt, form)
    args, _ = FAM.make_inputs(sig, 7, "cpu", seed=2)
    ref = FAM.reference(sig, *args)
    for cid in ("torch", "default", "b16x64x128_w4_s4_g8"):
        out = torch.full((7, 2, 200), float("nan"), dtype=args[0].dtype)
        y = FAM.launch(FAM.parse_config(cid), sig, *args, out=out)
        assert y is out, f"{cid} ({arms.torch_arm(sig, 'cpu').__name__}) returned a new tensor, not `out`"
        assert not torch.isnan(out).any() and float((out.float() - ref).norm() / ref.norm()) < 1e-2, cid


def test_grouped_mm_is_absent_where_unsupported():
    assert "bf16" in arms.grouped_mm_reason("fp16", "cpu")
    assert "multiples of 8" in arms.grouped_mm_reason("bf16", "cpu", 36, 24)


def test_work_counts_the_routed_flops():
    flops, moved = FAM.work(make_signature(8, 28672, 4096, 2), 16)
    assert flops == 2 * 16 * 2 * 28672 * 4096
    assert moved > 8 * 28672 * 4096 * 2  # 32 slots hit every expert's weight


transformers = pytest.importorskip("transformers")


def _meta(cls_name, **kw):
    cfg = getattr(transformers, cls_name)(num_hidden_layers=2, vocab_size=128, **kw)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def _stacked_layout():
    return getattr(transformers.models.mixtral.modeling_mixtral, "MixtralExperts", None) is not None


MODELS = {
    "mixtral": ("MixtralConfig", dict(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                      num_attention_heads=4, num_key_value_heads=2), (4, 64, 96, 2, 2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(hidden_size=64, moe_intermediate_size=48, num_experts=6, num_experts_per_tok=4,
                                         shared_expert_intermediate_size=80, intermediate_size=80,
                                         num_attention_heads=4, num_key_value_heads=4), (6, 64, 48, 4, 2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=8,
                                         num_attention_heads=4, num_key_value_heads=2), (8, 64, 32, 8, 2)),
    "deepseek_v3": ("DeepseekV3Config", dict(hidden_size=64, moe_intermediate_size=32, intermediate_size=128,
                                             n_routed_experts=16, num_experts_per_tok=4, first_k_dense_replace=1,
                                             num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
                                             kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                             n_group=4, topk_group=2), (16, 64, 32, 4, 1)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_census_of_moe_models_on_meta_tensors(name):
    from tunedb.families.group_gemm import moe

    if not _stacked_layout():
        pytest.skip(f"transformers {transformers.__version__} keeps experts as per-expert Linears")
    cls_name, kw, (e, h, i, k, layers) = MODELS[name]
    model = _meta(cls_name, **kw)
    found = moe.find_experts(model)
    assert [(f.experts, f.hidden, f.intermediate, f.top_k, f.dt) for f in found] == [(e, h, i, k, "bf16")] * layers
    census = moe.census(model, [1, 16])
    up = make_signature(e, 2 * i, h, k, "bf16", "token")
    down = make_signature(e, h, i, k, "bf16", "slot")
    assert census.signatures() == tuple(sorted((up, down)))
    assert {(p.signature, p.m): p.calls for p in census.points} == {(s, m): layers for s in (up, down) for m in (1, 16)}


def test_optimize_swaps_the_experts_and_keeps_the_outputs():
    if not _stacked_layout():
        pytest.skip("no stacked experts in this transformers")
    cls_name, kw, _ = MODELS["qwen2_moe"]
    cfg = getattr(transformers, cls_name)(num_hidden_layers=2, vocab_size=128, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        before = model(ids).logits.float()
        out = FAM.optimize(model)
        swapped = [n for n, mod in model.named_modules() if getattr(mod, "_tunedb_group_gemm", False)]
        after = model(ids).logits.float()
    assert out is model and swapped == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert model.model.layers[0].mlp.gate.__class__.__name__ .endswith("Router")  # the router stays the model's
    assert float((after - before).norm() / before.norm()) < 2e-2


def test_build_database_selector_serves_the_table(tmp_path):
    """A census of MoE keys through the pipeline (fake timer on the NULL device), the database
    file, and the selector serving its regions at run time."""
    from tunedb import database, pipeline, settings
    from tunedb.build.steps import simulated_timer
    from tunedb.records import Point, ShapeSet
    from tunedb.runtime import dispatch, selector

    sig = make_signature(4, 64, 32, 2, "bf16", "slot")
    shapes = ShapeSet((Point(sig, 3, 1.0, 1), Point(sig, 40, 1.0, 1)), "moe")
    timer = simulated_timer(FAM, shipped_profile("sm90"), seed=0, noise=0.01)
    out = tmp_path / "db"
    result = pipeline.build([("moe", shapes)], pipeline.BuildOptions(out=str(out), family="group_gemm", isolate=False,
                                                                      fill=False), timer=timer)
    (entry,) = result.entries
    assert entry.signature == sig and {"M=3", "M=40"} <= set(entry.evidence)
    assert entry.regions[-1].config_id == "torch"  # the fallback serves above the largest measured size
    db = database.load(out / "sm90" / "group_gemm.json", "group_gemm", "sm90")
    assert db.entries[sig].regions == entry.regions
    try:
        with settings.override(USER_DB=str(out)):
            selector.configure("sm90")
            for m in (3, 40):
                res = selector.peek("group_gemm", sig, m)
                assert res.tier == "user" and res.config.id == entry.lookup(m)
            args, _ = FAM.make_inputs(sig, 3, "cpu", seed=0)
            y = dispatch.call("group_gemm", "group_gemm", *args)
            ref = FAM.reference(sig, *args)
            assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
            assert selector.counters()["group_gemm"]["signatures"][sig.format()]["user"] >= 1
    finally:
        selector.configure()
        dispatch.clear()


def _mixtral_block(dtype):
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                     num_hidden_layers=1, vocab_size=64, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(1)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    if hasattr(block.experts, "config"):
        block.experts.config._experts_implementation = "eager"
    return block.to(dtype).eval()


def _hidden(y):
    return y[0] if isinstance(y, tuple) else y


def test_fp32_experts_are_not_recognised_and_stay_the_models():
    """A block built in fp32 (transformers' default) is not a group_gemm key: recognise says
    None (it used to raise SignatureError), optimize() leaves it alone, and census(dt=) still keys
    an fp32 meta model."""
    from tunedb.families.group_gemm import moe

    if not _stacked_layout():
        pytest.skip("no stacked experts in this transformers")
    block = _mixtral_block(torch.float32)
    assert moe.recognise(block.experts, block) is None
    assert moe.recognise(block.experts, block, dt="bf16") == (4, 64, 96, 2, "bf16")
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        ref = _hidden(block(x))
        assert moe.swap_experts(block) == []
        assert torch.equal(_hidden(block(x)), ref)
    cls_name, kw, (e, h, i, k, layers) = MODELS["mixtral"]
    cfg = getattr(transformers, cls_name)(num_hidden_layers=layers, vocab_size=128, **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    assert moe.find_experts(model) == []
    assert len(moe.census(model, [1], dt="bf16").points) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_swapped_mixtral_block_keeps_its_outputs_and_falls_back_after_a_cast(dtype):
    """The GPU test's block on the CPU (no graph): recognised once cast, swapped, outputs kept;
    cast to fp32 after the swap, it runs the model's own forward instead of raising."""
    from tunedb.families.group_gemm import moe
    from tunedb.runtime import dispatch

    if not _stacked_layout():
        pytest.skip("no stacked experts in this transformers")
    block = _mixtral_block(dtype)
    assert moe.recognise(block.experts, block) == (4, 64, 96, 2, {torch.bfloat16: "bf16"}.get(dtype, "fp16"))
    x = torch.randn(2, 3, 64, dtype=dtype)
    try:
        with torch.no_grad():
            ref = _hidden(block(x)).float()
            assert moe.swap_experts(block) == ["experts"]
            y = _hidden(block(x)).float()
            assert float((y - ref).norm() / ref.norm()) < 2e-2
            block.float()
            y32 = _hidden(block(x.float()))
        assert float((y32 - ref).norm() / ref.norm()) < 2e-2
    finally:
        dispatch.clear()


def test_every_build_space_tile_fits_the_arch_shared_memory():
    """The exhaustive grid's winners joined to the build space keep the space's own bounds: on an
    arch with ~99 KiB a block (sm89), the 136 KiB two-stage BK=128 tile is not offered."""
    for arch_family in ("sm80", "sm89", "sm90"):
        smem = configs.smem_per_block(arch_family)
        assert all(configs.smem_bytes(c) <= smem for c in FAM.config_space(arch_family)), arch_family


MOE_WORKLOAD = """
import torch, transformers

def make(device):
    cfg = transformers.MixtralConfig(num_hidden_layers=1, vocab_size=128, hidden_size=64, intermediate_size=96,
                                     num_local_experts=4, num_experts_per_tok=2, num_attention_heads=4,
                                     num_key_value_heads=2)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model, lambda batch, length: (torch.zeros(batch, length, dtype=torch.long, device=device),)
"""


def test_census_of_a_user_moe_model_as_tune_takes_it(tmp_path, monkeypatch):
    """`tunedb tune mod:make` of a user's MoE model takes the census of the optimized model on
    meta tensors: its swapped experts must yield their output's shape there, not launch Triton."""
    from tunedb import pipeline

    if not _stacked_layout():
        pytest.skip("no stacked experts in this transformers")
    (tmp_path / "moe_user_workload.py").write_text(MOE_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    shapes = pipeline.take_census("moe_user_workload:make", max_batch=2, fused=True)
    gemm = {p.signature for p in shapes.points if p.signature.family == "gemm" and p.signature.op != "bmm"}
    assert {(s.get("N"), s.get("K")) for s in gemm} >= {(64, 64), (32, 64), (128, 64)}  # q/o, k/v, head
