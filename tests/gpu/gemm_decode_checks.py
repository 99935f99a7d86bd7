"""What the GEMM decode-lane GPU tests share (test_gemm_decode_gpu.py, test_decode_stream_gpu.py,
test_gemm_decode_pf_gpu.py): the decode shapes, the validity check, a warmed-up graph capture, the
check against fp32, and the deterministic reduction's bitwise repeatability."""
import torch

from tunedb.arch import shipped_profile
from tunedb.families.gemm import FAMILY

SM90 = shipped_profile("sm90")
# (N, K): Llama-3-8B decode (k/v, q/o, qkv fused, gate/up, gate+up fused, down, lm_head), Conformer
SHAPES = [(1024, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336),
          (128256, 4096), (3584, 3584), (1536, 512), (2048, 512), (512, 2048), (512, 512), (512, 9728)]
MS = (1, 4, 8, 16)


def valid(cid, sig, m):
    return FAMILY.invalid_reason(FAMILY.parse_config(cid), sig, m, SM90) is None


def capture(cid, sig, x, w, b, out):
    """One warm-up launch on a side stream, then the launch captured in a CUDA graph."""
    cfg = FAMILY.parse_config(cid)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        FAMILY.launch(cfg, sig, x, w, b, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        FAMILY.launch(cfg, sig, x, w, b, out=out)
    return g


def check(y, ref, what, x_dtype):
    """Every element written and the error within 4x the output rounding (+ 2e-3 of the largest)."""
    assert not torch.isnan(y).any(), f"{what}: elements left unwritten (NaN)"
    rounding = (ref.to(x_dtype).float() - ref).abs().max().item()
    err = (y.float() - ref).abs().max().item()
    assert err <= 4 * rounding + 2e-3 * ref.abs().max().item(), f"{what}: error {err:.3e} (rounding {rounding:.3e})"


def check_bitwise_repeatable(cid, sig, x, w, b):
    """The config's output checked against fp32, then bitwise the same on three more eager calls
    and on three replays of a captured graph (NaN-poisoned before each). Returns the output."""
    cfg = FAMILY.parse_config(cid)
    first = FAMILY.launch(cfg, sig, x, w, b).clone()
    check(first, FAMILY.reference(sig, x, w, b), cid, x.dtype)
    for _ in range(3):
        assert torch.equal(FAMILY.launch(cfg, sig, x, w, b), first)
    out = torch.empty_like(first)
    g = capture(cid, sig, x, w, b, out)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    return first
