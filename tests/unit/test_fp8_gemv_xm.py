"""bench/fp8_gemv_xm.py's probe kernel (fp8 row-wise GEMV with x on the MMA's M side) under the
Triton interpreter: every tile against the fp32 product of the dequantized operands at M = 1..16,
odd N and K, scales applied once; the launcher names what it refuses. The device times it
(bench/decode_gemv_fp8.py --xm)."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import interpret_child  # noqa: E402

HERE = Path(__file__).resolve().parent


def _interpreted() -> list:
    sys.path.insert(0, str(HERE.parents[1] / "bench"))
    import fp8_gemv_xm as xm

    torch.manual_seed(0)
    failures = []
    for (n, k, m), tile in zip(((40, 64, 1), (33, 96, 5), (130, 200, 16), (17, 512, 3)),
                               ((16, 256, 1, 5), (32, 64, 2, 2), (64, 128, 4, 2), (16, 512, 1, 4))):
        xf, wf = torch.randn(m, k), torch.randn(n, k)
        sx, sw = xf.abs().amax(1, keepdim=True) / 448, wf.abs().amax(1, keepdim=True) / 448
        x, w = (xf / sx).to(torch.float8_e4m3fn), (wf / sw).to(torch.float8_e4m3fn)
        ref = (x.double() * sx.double()) @ (w.double() * sw.double()).t()
        y = xm.launcher(tile, interpret=True)(x, w, sx, sw)
        err = (y.double() - ref).abs().max().item()
        # bf16's own rounding of the exact product, a few times over (the interpreter may truncate)
        bound = 3 * (ref.to(torch.bfloat16).double() - ref).abs().max().item() + 1e-3 * ref.abs().max().item()
        if not (y.dtype == torch.bfloat16 and y.shape == (m, n) and err <= bound):
            failures.append(f"N={n} K={k} M={m} tile={tile}: {y.dtype} {tuple(y.shape)} err {err:.3g} > {bound:.3g}")
    try:
        xm.launcher(xm.TILES[0], interpret=True)(torch.zeros(17, 64).to(torch.float8_e4m3fn),
                                                 torch.zeros(8, 64).to(torch.float8_e4m3fn), None, None)
        failures.append("17 rows of x were taken")
    except ValueError as exc:
        if "1 to 16 rows" not in str(exc):
            failures.append(f"the refusal does not say what is allowed: {exc}")
    return failures


def test_the_probe_under_the_interpreter():
    assert interpret_child.failures(__file__) == []


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    interpret_child.report(_interpreted())
