"""The grouped GEMM on the GPU: every arm (a sample of Triton tiles, the untuned default, the torch
fallback, torch._grouped_mm where it runs, the loop) against the fp32 reference with random
routings, experts that receive no slot and one expert that receives every slot, both input
forms, bf16 and fp16; the Triton path captured in a CUDA graph and replayed with a new routing;
optimize()'s swapped experts inside a captured graph (the untuned default, and a table that
serves the slot lane at small M). About 60-90 s on an H200, mostly Triton compiles (8 tiles x 2
forms x 2 dtypes x 2 divisibility specialisations); a failing test lists
every failing arm and routing with its error or exception."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.group_gemm import arms  # noqa: E402
from tunedb.families.group_gemm.keys import make_signature  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("group_gemm")
TILES = ("b16x64x128_w4_s4_g8", "b32x128x64_w4_s3_g8", "b64x128x64_w8_s4_g8", "b128x256x64_w8_s3_g8",
         "b128x128x64_w8_s3_g8", "sl_b1x16x256_w2_s1", "sl_b1x64x128_w4_s3")  # last two: the slot lane
# (E, N, K, top_k): ragged (N, K not multiples of the tiles), Mixtral's down at reduced E, Qwen3-like
KEYS = [(5, 200, 136, 2), (8, 512, 1024, 2), (16, 384, 256, 8)]


def routings(m, e, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    yield "random", arms.random_routing(m, e, top_k, gen, "cuda")
    yield "one_expert_takes_all", torch.stack([torch.full((m,), (e - 1 - j) % e, dtype=torch.int32)
                                               for j in range(top_k)], 1).cuda()
    # experts 0 and e-1 never chosen (E >= top_k + 2 in every KEYS row)
    yield "empty_experts", (arms.random_routing(m, e - 2, top_k, gen, "cuda") + 1)


def arms_of(sig, m):
    """The arms the predicate accepts at M (the slot lane only while M * top_k <= SLOTS_MAX)."""
    ids = ["default", "torch", *TILES]
    return [c for c in ids if FAM.invalid_reason(FAM.parse_config(c), sig, m, SM90) is None]


def check_arm(cid, fn, sig, call, ref, bound, route_name):
    """None when the arm writes `out` fully, returns it and is within `bound`; else what went wrong."""
    m, top_k = call[2].shape
    out = torch.full((m, top_k, sig.get("N")), float("nan"), dtype=call[0].dtype, device="cuda")
    try:
        y = FAM.launch(FAM.parse_config(cid), sig, *call, out=out) if fn is None else fn(sig, *call, out=out)
        torch.cuda.synchronize()
    except Exception as exc:  # every arm is tried and reported, not only the first that fails
        return f"{cid} {route_name}: {type(exc).__name__}: {str(exc)[:300]}"
    if y is not out:
        return f"{cid} {route_name}: returned a new tensor, not the `out` it was given"
    if torch.isnan(out).any():
        return f"{cid} {route_name}: {int(torch.isnan(out).sum())} of {out.numel()} outputs not written"
    err = float((out.float() - ref).norm() / ref.norm())
    return None if err <= bound else f"{cid} {route_name}: error {err:.2e} > {bound:.2e}"


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("form", ["token", "slot"])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("m", [1, 33, 257])
def test_every_arm_matches_the_fp32_reference(dt, form, key, m):
    sig = make_signature(*key, dt, form)
    args, _ = FAM.make_inputs(sig, m, "cuda", seed=m)
    e, n, k, top_k = key
    gm = arms.grouped_mm_reason(dt, "cuda", n, k)
    extra = [("grouped_mm", arms.grouped_mm)] if gm is None else []
    failures = []
    for name, ids in routings(m, e, top_k, seed=m + 1):
        call = (args[0], args[1], ids, *args[3:])
        ref = FAM.reference(sig, *call)
        base = float((arms.loop(sig, *call).float() - ref).norm() / ref.norm())
        bound = max(4 * base, 8e-3)
        for cid, fn in [(c, None) for c in arms_of(sig, m)] + extra:
            why = check_arm(cid, fn, sig, call, ref, bound, name)
            if why:
                failures.append(why)
    assert not failures, (f"{sig.format()} M={m} (torch {torch.__version__}; grouped_mm: {gm or 'runs'}):\n  "
                          + "\n  ".join(failures))


def test_grouped_mm_is_present_for_bf16_on_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not an sm90 device")
    assert hasattr(torch, "_grouped_mm"), f"torch {torch.__version__} lacks _grouped_mm"
    assert arms.grouped_mm_reason("bf16", "cuda", 512, 1024) is None


@pytest.mark.parametrize("cid", ["default", "b16x64x128_w4_s4_g8", "sl_b1x32x256_w4_s3", "torch"])
def test_captured_graph_replays_a_new_routing(cid):
    sig = make_signature(8, 256, 512, 2, "bf16", "slot")
    args, _ = FAM.make_inputs(sig, 40, "cuda", seed=5)
    x, w, ids, tw = (a.clone() for a in args)
    out = torch.empty((40, 2, 256), dtype=torch.bfloat16, device="cuda")
    run = FAM.launcher(FAM.parse_config(cid), sig)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(x, w, ids, tw, out=out)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            run(x, w, ids, tw, out=out)
    torch.cuda.current_stream().wait_stream(s)
    for seed, all_to_one in ((6, False), (7, True)):
        gen = torch.Generator().manual_seed(seed)
        new = torch.full_like(ids, 3) if all_to_one else arms.random_routing(40, 8, 2, gen, "cuda")
        if all_to_one:
            new[:, 1] = 6
        ids.copy_(new)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ref = FAM.reference(sig, x, w, ids, tw)
        assert float((out.float() - ref).norm() / ref.norm()) < 1e-2, f"{cid} replay with routing {seed}"


def _hidden(y):
    """A MoE block's hidden states (some transformers 5.x blocks also return router logits)."""
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("serve", ["tables", "slot_lane"])
def test_swapped_moe_block_runs_in_a_cuda_graph(serve):
    """`tables`: whatever the tiers serve (the untuned default without a table); `slot_lane`: a
    table that serves the routing-free lane (transformers' int64 ids and bf16 weights as given)."""
    import contextlib

    transformers = pytest.importorskip("transformers")
    from tunedb.families.group_gemm import moe
    from tunedb.runtime import launch_table

    def slot_lane(family, sig, m):
        return (family.parse_config("sl_b1x32x256_w4_s3"), "test") if family.name == "group_gemm" else None

    def serving_cm():
        return launch_table.overriding(slot_lane) if serve == "slot_lane" else contextlib.nullcontext()

    serving = serving_cm()

    cfg = transformers.MixtralConfig(hidden_size=256, intermediate_size=512, num_local_experts=8,
                                     num_experts_per_tok=2, num_hidden_layers=1, vocab_size=64,
                                     num_attention_heads=4, num_key_value_heads=2)
    try:
        block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg)
    except Exception as exc:
        pytest.skip(f"transformers {transformers.__version__}: {exc}")
    # the block is built in fp32, which group_gemm does not serve: cast before recognising
    block = block.to("cuda", torch.bfloat16).eval()
    if moe.recognise(block.experts, block) is None:
        pytest.skip(f"transformers {transformers.__version__} does not keep stacked experts")
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(3, 5, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), serving:
        if hasattr(block.experts, "config"):
            block.experts.config._experts_implementation = "eager"
        ref = _hidden(block(x)).float()
        assert moe.swap_experts(block) == ["experts"]
        eager = _hidden(block(x)).float()
        err = float((eager - ref).norm() / ref.norm())
        assert err < 2e-2, f"swapped block, eager: error {err:.2e} against transformers' own experts"
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            block(x)
            with torch.cuda.graph(g, stream=s):
                y = _hidden(block(x))
        torch.cuda.current_stream().wait_stream(s)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
    err = float((y.float() - ref).norm() / ref.norm())
    assert err < 2e-2, f"swapped block, graph replay: error {err:.2e} against transformers' own experts"
    # the op is opaque to torch.compile: fullgraph traces the swapped block, the same arm serves
    with torch.no_grad(), serving_cm():
        compiled = _hidden(torch.compile(block, fullgraph=True)(x)).float()
    err = float((compiled - ref).norm() / ref.norm())
    assert err < 2e-2, f"swapped block, torch.compile fullgraph: error {err:.2e} against transformers' own experts"
