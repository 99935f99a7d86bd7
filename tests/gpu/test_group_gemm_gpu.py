"""The grouped GEMM on the GPU: every arm (a sample of Triton tiles, the untuned default, the torch
fallback, torch._grouped_mm where it runs, the loop) against the fp32 reference with random
routings, experts that receive no slot and one expert that receives every slot, both input
forms, bf16 and fp16; the Triton path captured in a CUDA graph and replayed with a new routing;
optimize()'s swapped experts inside a captured graph. About 40 s on an H200 (compiles)."""
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
         "b128x128x64_w8_s3_g8")
# (E, N, K, top_k): ragged (N, K not multiples of the tiles), Mixtral's down at reduced E, Qwen3-like
KEYS = [(5, 200, 136, 2), (8, 512, 1024, 2), (16, 384, 256, 8)]


def routings(m, e, top_k, seed):
    gen = torch.Generator().manual_seed(seed)
    yield "random", arms.random_routing(m, e, top_k, gen, "cuda")
    yield "one_expert_takes_all", torch.stack([torch.full((m,), (e - 1 - j) % e, dtype=torch.int32)
                                               for j in range(top_k)], 1).cuda()
    # experts 0 and e-1 never chosen (E >= top_k + 2 in every KEYS row)
    yield "empty_experts", (arms.random_routing(m, e - 2, top_k, gen, "cuda") + 1)


def arms_of(sig):
    ids = ["default", "torch", *TILES]
    return [c for c in ids if FAM.invalid_reason(FAM.parse_config(c), sig, None, SM90) is None]


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("form", ["token", "slot"])
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("m", [1, 33, 257])
def test_every_arm_matches_the_fp32_reference(dt, form, key, m):
    sig = make_signature(*key, dt, form)
    args, _ = FAM.make_inputs(sig, m, "cuda", seed=m)
    e, n, _, top_k = key
    for name, ids in routings(m, e, top_k, seed=m + 1):
        call = (args[0], args[1], ids, *args[3:])
        ref = FAM.reference(sig, *call)
        base = float((arms.loop(sig, *call).float() - ref).norm() / ref.norm())
        bound = max(4 * base, 8e-3)
        extra = [("grouped_mm", arms.grouped_mm)] if arms.grouped_mm_reason(dt, "cuda", n, key[2]) is None else []
        for cid, fn in [(c, None) for c in arms_of(sig)] + extra:
            out = torch.full((m, top_k, n), float("nan"), dtype=args[0].dtype, device="cuda")
            y = FAM.launch(FAM.parse_config(cid), sig, *call, out=out) if fn is None else fn(sig, *call, out=out)
            err = float((y.float() - ref).norm() / ref.norm())
            assert y is out and not torch.isnan(y).any(), f"{cid} {name}: output not fully written"
            assert err <= bound, f"{sig.format()} M={m} {name} {cid}: error {err:.2e} > {bound:.2e}"


def test_grouped_mm_is_present_for_bf16_on_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not an sm90 device")
    assert hasattr(torch, "_grouped_mm"), f"torch {torch.__version__} lacks _grouped_mm"
    assert arms.grouped_mm_reason("bf16", "cuda", 512, 1024) is None


@pytest.mark.parametrize("cid", ["default", "b16x64x128_w4_s4_g8", "torch"])
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


def test_swapped_moe_block_runs_in_a_cuda_graph():
    transformers = pytest.importorskip("transformers")
    from tunedb.families.group_gemm import moe

    cfg = transformers.MixtralConfig(hidden_size=256, intermediate_size=512, num_local_experts=8,
                                     num_experts_per_tok=2, num_hidden_layers=1, vocab_size=64,
                                     num_attention_heads=4, num_key_value_heads=2)
    try:
        block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg)
    except Exception as exc:
        pytest.skip(f"transformers {transformers.__version__}: {exc}")
    if moe.recognise(block.experts, block) is None:
        pytest.skip("this transformers does not keep stacked experts")
    block = block.to("cuda", torch.bfloat16).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(3, 5, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        if hasattr(block.experts, "config"):
            block.experts.config._experts_implementation = "eager"
        ref = block(x).float()
        assert moe.swap_experts(block) == ["experts"]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            block(x)
            with torch.cuda.graph(g, stream=s):
                y = block(x)
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        torch.cuda.synchronize()
    assert float((y.float() - ref).norm() / ref.norm()) < 2e-2
