"""The bmm family on the GPU: torch.bmm and a sample of Triton tiles (those the validity
predicate admits) at the presets' attention keys and odd shapes, bf16 / fp16 / fp32, every
layout, each launched inside a captured CUDA graph and compared with the fp32 (fp64 for fp32
keys) reference; the run-time op and optimize()'s product mode inside a captured graph.
Expected run time on the H200: about 40 s (mostly Triton compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.bmm import configs, keys, ops, serving  # noqa: E402
from tunedb.records import Config  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
BMM = families.get("bmm")
TILES = ("b16x64x32_w4_s3_g8", "b64x64x32_w4_s3_g8", "b128x128x64_w8_s4_g8", "b64x128x64_w4_s3_g8")
# (B, N, K, lay, M): whisper-base's q @ k^T and probs @ v (batch 2), Llama-3-8B prefill at 512
# tokens (32 heads), decode-like M=1, and odd shapes in every layout
BF16_CASES = [(16, 1500, 64, "nt", 1500), (16, 64, 1500, "nn", 1500), (32, 512, 128, "nt", 512),
              (32, 128, 512, "nn", 512), (32, 1, 128, "nn", 1), (64, 300, 128, "nt", 1)]
ODD = [(3, 40, 24, lay, m) for lay in configs.LAYOUTS for m in (1, 17)] + [(5, 72, 200, "nt", 33)]
CASES = [("bf16", *c, TILES) for c in BF16_CASES + ODD] + \
        [(dt, *c, TILES[1:3]) for dt in ("fp16", "fp32") for c in ODD]


def graph_launch(cfg, sig, a, b, m):
    out = torch.full((sig.get("B"), m, sig.get("N")), float("nan"), dtype=a.dtype, device="cuda")
    BMM.launch(cfg, sig, a, b, out=out)  # compile and warm outside the capture
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        BMM.launch(cfg, sig, a, b, out=out)
    g.replay()
    torch.cuda.synchronize()
    return out


def rel_err(y, ref):
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dt, bt, n, k, lay, m, tiles", CASES)
def test_every_arm_matches_the_reference_inside_a_graph(dt, bt, n, k, lay, m, tiles):
    sig = keys.make_signature(bt, n, k, dt, lay)
    (a, b), _ = BMM.make_inputs(sig, m, "cuda", seed=m + n)
    # one row of a transposed a is a row-major row: M = 1 keys tn as nn, tt as nt (keys.keyed_as)
    assert keys.signature_of("bmm", a, b) == (keys.keyed_as(sig, m), m)
    ref = BMM.reference(sig, a, b)
    torch_err = rel_err(graph_launch(Config.sentinel("torch"), sig, a, b, m), ref)
    eps = 1e-6 if dt == "fp32" else 1e-3
    ran = 0
    for cid in tiles:
        cfg = configs.parse(cid)
        if configs.invalid_reason(cfg, sig, m, SM90):
            continue
        y = graph_launch(cfg, sig, a, b, m)
        assert not torch.isnan(y).any(), f"{cid} {sig} M={m} left outputs unwritten"
        err = rel_err(y, ref)
        assert err <= 4 * torch_err + eps, f"{cid} {sig} M={m}: err {err:.3g}, torch.bmm {torch_err:.3g}"
        ran += 1
    assert ran >= 1


def test_expanded_kv_heads_run_in_place():
    a = torch.randn(8, 33, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 1, 128, 96, device="cuda", dtype=torch.bfloat16).expand(2, 4, 128, 96).reshape(8, 128, 96)
    sig, m = keys.signature_of("bmm", a, kv)
    y = BMM.launch(configs.UNTUNED, sig, a, kv)
    assert rel_err(y, a.float() @ kv.float()) < 1e-2


def _always_tile(family, sig, m):
    return (configs.UNTUNED, "autotune") if family.name == "bmm" else None


def test_the_op_and_the_product_mode_inside_a_captured_graph():
    """Eager attention written as matmuls, served by the Triton tile through optimize()'s mode
    (the selection forced by an override, as autotune() installs), captured and replayed."""
    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.matmul(torch.matmul(q, k.transpose(-1, -2)).softmax(-1), v)

    q, k, v = (torch.randn(2, 8, 200, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    model = serving.install(Attend())
    want = Attend()(q.float(), k.float(), v.float())
    serving._clear()
    with launch_table.overriding(_always_tile):
        before = getattr(serving._state, "served", 0)
        model(q, k, v)  # compile, resolve: both products served by the tile (nothing kept after)
        assert serving._state.served - before == 2 and not serving._decisions
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(q, k, v)
            direct = ops.bmm(q.reshape(16, 200, 64), k.reshape(16, 200, 64).transpose(1, 2))
        g.replay()
    torch.cuda.synchronize()
    torch_err = rel_err(Attend()(q, k, v), want)  # the same bf16 attention on torch's products
    assert rel_err(out, want) <= 4 * torch_err + 1e-3
    assert rel_err(direct, q.float().reshape(16, 200, 64) @ k.float().reshape(16, 200, 64).transpose(1, 2)) < 1e-2
    serving._clear()
