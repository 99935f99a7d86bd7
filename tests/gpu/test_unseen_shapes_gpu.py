"""Shapes no table measured, on the GPU, through the selector (shipped tables, no user tier): the
arm served is the one tests/unit/test_unseen_shapes.py expects, and its output is within 4x
torch's own error of the fp64 reference (bf16, which the CPU interpreter cannot check). About 15 s
on the H200 (the int8 heuristic tiles and group_gemm's untuned tile compile on first use)."""
import pytest
import torch

from tunedb import families, settings
from tunedb.records import Config
from tunedb.runtime import selector

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def shipped():
    with settings.override(USER_DB="off"):
        selector.configure()
        yield
    selector.configure()


def _rel(y, ref):
    return float((y.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("n, k", [(18944, 3584), (4000, 96), (200, 4096)])
@pytest.mark.parametrize("m", [1, 17, 300])
def test_int8_unseen_widths_run_the_heuristic_tile_exactly(n, k, m):
    """Qwen2-7B's up projection, K < 128 with N not a multiple of 128, a narrow N: the int8
    fallback (the heuristic's tile) equals the torch path bit for bit where _int_mm runs (M > 16)."""
    fam = families.get("scaled_mm")
    sig = fam.make_signature("scaled_mm", n, k, "bf16")
    assert selector.peek("scaled_mm", sig, m).config.id == "heuristic"
    args, _ = fam.make_inputs(sig, m, "cuda", seed=m)
    y = fam.launch(Config.sentinel("heuristic"), sig, *args)
    ref = fam.reference(sig, *args, dtype=torch.float64)
    assert _rel(y, ref) <= 2 ** -7
    if m > 16:
        assert torch.equal(y, fam.launch(Config.sentinel("torch"), sig, *args))


@pytest.mark.parametrize("m", [1, 64])
def test_whisper_decoder_cross_attention_runs_torch_bmm(m):
    fam = families.get("bmm")
    sig = fam.make_signature(20, 1500, 64, "half", "nt")
    assert selector.peek("bmm", sig, m).config.id == "torch"


@pytest.mark.parametrize("dt, n, k, m, want", [("bf16", 14336, 4096, 33, "default"), ("bf16", 14336, 4096, 600, "torch"),
                                               ("bf16", 1000, 36, 33, "default"), ("fp16", 512, 256, 600, "default")])
def test_unseen_moe_keys_serve_grouped_mm_or_the_tile_and_match_the_reference(dt, n, k, m, want):
    """bf16 keys where torch._grouped_mm runs: the untuned tile up to 512 tokens, torch above;
    elsewhere the tile at every size (group_gemm's heuristic)."""
    fam = families.get("group_gemm")
    sig = fam.make_signature(8, n, k, 2, dt, "token")
    got = selector.peek("group_gemm", sig, m).config
    assert got.id == want
    args, _ = fam.make_inputs(sig, m, "cuda", seed=1)
    y = fam.launch(got, sig, *args)
    ref = fam.reference(sig, *args, dtype=torch.float64)
    base = _rel(fam.launch(Config.sentinel("torch"), sig, *args), ref)
    assert _rel(y, ref) <= max(4 * base, 2e-3)
