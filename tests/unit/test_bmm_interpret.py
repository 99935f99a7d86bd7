"""The bmm Triton kernel under the Triton interpreter (CPU), fp16 and fp32, against an fp64
reference: every layout (transposed operands read in place), odd M / N / K (edge tiles, a K
tail), an expanded batch (stride 0) and a strided output; each case's inputs key as
keys.keyed_as says (at M = 1 a transposed a keys as 'n'). TRITON_INTERPRET must be set before
the kernel is defined, so the checks run in a child process (this file run as a script). The
interpreter's tl.dot mishandles bf16 on CPU: bf16 is covered by tests/gpu/test_bmm_gpu.py."""
import sys

import pytest

import interpret_child

CASES = [  # (config, B, N, K, Ms)
    ((16, 32, 16, 2, 3, 8), 3, 40, 24, (1, 17)),   # K tail: 24 = 16 + 8
    ((32, 64, 32, 4, 3, 1), 2, 72, 40, (33,)),     # edge tiles in M and N, group_m 1
    ((64, 64, 32, 4, 3, 8), 3, 40, 24, (1,)),      # the GPU run's failing case, its tile
]


def _child(dt: str) -> None:
    import torch

    from tunedb.families.bmm import FAMILY, configs, keys

    failures = []

    def check(cfg, sig, m, a=None, b=None, out=None):
        if a is None:
            (a, b), _ = FAMILY.make_inputs(sig, m, "cpu", seed=m)
            # the GPU run failed here at M=1, a transposed (the row is stored row-major)
            if keys.signature_of("bmm", a, b) != (keys.keyed_as(sig, m), m):
                failures.append(f"{sig.format()} M={m}: inputs key as {keys.signature_of('bmm', a, b)}")
        ref = FAMILY.reference(sig, a, b, torch.float64)
        y = FAMILY.launch(cfg, sig, a, b, out=out)
        torch_y = torch.matmul(a, b) if a.dtype != torch.float16 else torch.matmul(a.float(), b.float()).half()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        torch_err = ((torch_y.double() - ref).norm() / ref.norm()).item()
        bad = torch.isnan(y).any().item() or err > 4 * torch_err + (1e-6 if dt == "fp32" else 1e-3)
        if bad or (out is not None and y is not out):
            failures.append(f"{cfg.id} {sig.format()} M={m}: err {err:.3g} (torch {torch_err:.3g})")

    for params, bt, n, k, ms in CASES:
        cfg = configs.make(*params)
        for lay in configs.LAYOUTS:
            for m in ms:
                check(cfg, keys.make_signature(bt, n, k, dt, lay), m)
    dtype = torch.float16 if dt == "fp16" else torch.float32
    cfg = configs.make(16, 32, 32, 2, 3, 8)
    # grouped-query attention's expanded KV heads: batch stride 0, no copy
    a = torch.randn(4, 9, 24).to(dtype)
    kv = (torch.randn(1, 24, 40) * 0.2).to(dtype).expand(4, 24, 40)
    check(cfg, keys.make_signature(4, 40, 24, dt, "nn"), 9, a, kv)
    # an output written through strides (a transposed [B, N, M] buffer viewed as [B, M, N])
    (a, b), _ = FAMILY.make_inputs(keys.make_signature(2, 40, 24, dt, "nt"), 17, "cpu", seed=1)
    out = torch.full((2, 40, 17), float("nan"), dtype=dtype).transpose(1, 2)
    check(cfg, keys.make_signature(2, 40, 24, dt, "nt"), 17, a, b, out)
    # 2-D operands are one batch
    check(cfg, keys.make_signature(1, 40, 24, dt, "nn"), 5, a[0, :5], b[0])
    interpret_child.report(failures)


@pytest.mark.slow
@pytest.mark.parametrize("dt", ["fp16", "fp32"])
def test_the_triton_kernel_matches_the_reference_under_the_interpreter(dt):
    assert interpret_child.failures(__file__, dt, timeout=600) == []


if __name__ == "__main__":
    _child(sys.argv[1])
