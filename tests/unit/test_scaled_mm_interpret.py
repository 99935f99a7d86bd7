"""The quantized GEMM's Triton lanes under the Triton interpreter (CPU), small odd shapes.

TRITON_INTERPRET must be set before any kernel is defined, so the checks run in a child process
(this file run as a script) and report failures as JSON.

int8: every lane (data-parallel, split-K, the heuristic) computes the same bits as the CPU torch
path (int32-exact product, then (acc * x_scale) * w_scale in fp32, one rounding), and the
`_quant` op's int8 output and scales are bitwise equal too. fp8: the interpreter supports the
float8 dot (it upcasts), so the tensor / row / block lanes are checked against the fp32 product
of the dequantized operands. The interpreter rounds fp32 to bf16 by truncation (the GPU rounds
to nearest even), so bf16 outputs are compared with the torch path's fp32 product truncated the
same way (still bitwise), and fp8's bf16 error bound is the gate's 4x the rounding error. Its fp32 -> float8_e4m3fn conversion is wrong where rounding
carries into the exponent (125.57 converts to 64, torch gives 128), so the fp8 `_quant` op's q is
left to tests/gpu/test_scaled_mm_gpu.py; here only its scales are checked.

The measurement protocol's gate (tunedb.measure.gate) is run over the families too: int8 (exact,
including the `_quant` op's q) and fp8 with a bf16 output. The gate handles float8 outputs now
(tests/unit/test_scaled_mm_gate.py), but the fp8 `_quant` lanes' q meets the interpreter's
conversion defect above, so that gate runs on the GPU (tests/gpu/test_scaled_mm_gpu.py).
QuantizedLinear's CUDA activation quantizer (launch.quantize_rows, the `_quant` op's row kernel
on a bf16 activation) is bitwise equal to the torch row quantizer for int8.
"""
import pytest

import interpret_child

INT8_IDS = ("b16x32x64_w4_s2_g8", "b32x64x128_w4_s2_g8", "sk2_b16x64x64_w4_s2", "sk3_b16x32x32_w4_s2",
            "heuristic")
FP8_IDS = ("b16x32x64_w4_s2_g8", "b32x64x128_w4_s2_g8", "sk2_b16x64x64_w4_s2", "heuristic")
TMA_IDS = ("tma_b16x32x64_w4_s2_g8", "tma_b32x64x128_w4_s2_g8")
SHAPES = ((80, 200), (48, 136))  # N, K: K not a multiple of 16 or of the 128 scale block
MS = (1, 3, 17)


def _truncated_bf16(y32):
    """fp32 -> bf16 by dropping the low 16 bits: what the interpreter's conversion does."""
    import torch

    return (y32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def _child() -> None:
    import torch

    from tunedb import families
    from tunedb.families.scaled_mm import arms, configs
    from tunedb.families.scaled_mm import ops  # noqa: F401 -- the CPU path to compare with

    failures = []
    int8, fp8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")

    def cfg(cid):
        return configs.parse(cid) if cid == "heuristic" else configs.parse(cid)

    for n, k in SHAPES:
        for m in MS:
            for out in ("bf16", "fp16"):
                sig = int8.make_signature("scaled_mm", n, k, out)
                args, _ = int8.make_inputs(sig, m, "cpu", seed=m + n)
                want = ops._cpu(sig, *args)
                if out == "bf16":
                    want = _truncated_bf16(ops.cpu_product(sig, *args))
                for cid in INT8_IDS:
                    y = torch.full((m, n), float("nan"), dtype=arms.torch_dtype(out))
                    got = int8.launch(cfg(cid), sig, *args, out=y)
                    if got is not y or not torch.equal(got, want):
                        failures.append(f"int8 {cid} {sig} M={m}: not bitwise equal to the torch path")
                ref = int8.reference(sig, *args, dtype=torch.float64)
                if (want.double() - ref).abs().max() > ref.abs().max() * 2 ** -7:
                    failures.append(f"int8 torch path {sig} M={m} far from the fp64 reference")
            qsig = int8.make_signature("scaled_mm_quant", n, k, "int8")
            args, _ = int8.make_inputs(qsig, m, "cpu", seed=m)
            wq, ws = ops._cpu(qsig, *args)
            pair = (torch.empty((m, n), dtype=torch.int8), torch.full((m, 1), float("nan")))
            if int8.launch(cfg("sk2_b16x64x64_w4_s2"), qsig, *args, out=pair) is not pair or \
                    not (torch.equal(pair[0], wq) and torch.equal(pair[1], ws)):
                failures.append(f"int8 quant into out {qsig} M={m}")
            for cid in INT8_IDS:
                q, s = int8.launch(cfg(cid), qsig, *args)
                if not (torch.equal(q, wq) and torch.equal(s, ws)):
                    failures.append(f"int8 quant {cid} {qsig} M={m}: q equal {torch.equal(q, wq)}, s equal {torch.equal(s, ws)}")
            for scale in ("tensor", "row", "block"):
                sig = fp8.make_signature("scaled_mm", n, k, "bf16", scale)
                args, _ = fp8.make_inputs(sig, m, "cpu", seed=m)
                ref = fp8.reference(sig, *args)
                bound = 4 * (ref.to(torch.bfloat16).float() - ref).abs().max().item() + 1e-5 * ref.abs().max().item()
                for cid in FP8_IDS:
                    got = fp8.launch(cfg(cid), sig, *args).float()
                    err = (got - ref).abs().max().item()
                    if torch.isnan(got).any() or err > bound:
                        failures.append(f"fp8 {cid} {sig} M={m}: err {err} > {bound}")
                qsig = fp8.make_signature("scaled_mm_quant", n, k, "fp8", scale)
                _, s = fp8.launch(cfg("b16x32x64_w4_s2_g8"), qsig, *args)
                _, ws = arms.quantize_rows(ref, "fp8")
                if (s - ws).abs().max() > 1e-5 * ws.abs().max():
                    failures.append(f"fp8 quant scales {qsig} M={m} differ from the reference's")
    # the TMA lane (K a multiple of 16; N unaligned: the store masks), persistent over 4 programs
    for m in (1, 19, 70):
        sig = int8.make_signature("scaled_mm", 80, 272, "fp16")
        args, _ = int8.make_inputs(sig, m, "cpu", seed=m)
        for cid in TMA_IDS:
            if not torch.equal(int8.launch(configs.parse(cid), sig, *args), ops._cpu(sig, *args)):
                failures.append(f"int8 {cid} {sig} M={m}: not bitwise equal to the torch path")
        qsig = int8.make_signature("scaled_mm_quant", 80, 272, "int8")
        q, s = int8.launch(configs.parse(TMA_IDS[0]), qsig, *args)
        wq, ws = ops._cpu(qsig, *args)
        if not (torch.equal(q, wq) and torch.equal(s, ws)):
            failures.append(f"int8 quant {TMA_IDS[0]} M={m}")
        for scale in ("tensor", "row", "block"):
            sig = fp8.make_signature("scaled_mm", 80, 272, "bf16", scale)
            args, _ = fp8.make_inputs(sig, m, "cpu", seed=m)
            ref = fp8.reference(sig, *args)
            bound = 4 * (ref.to(torch.bfloat16).float() - ref).abs().max().item() + 1e-5 * ref.abs().max().item()
            for cid in TMA_IDS:
                err = (fp8.launch(configs.parse(cid), sig, *args).float() - ref).abs().max().item()
                if err > bound:
                    failures.append(f"fp8 {cid} {sig} M={m}: err {err} > {bound}")
    # the measurement protocol's gate over the family (make_out, reference, verify rule)
    from tunedb.measure.arms import problem_for
    from tunedb.measure.gate import gate_arms

    for fam, sig in ((int8, int8.make_signature("scaled_mm", 80, 272, "fp16")),
                     (int8, int8.make_signature("scaled_mm_quant", 80, 272, "int8")),
                     (fp8, fp8.make_signature("scaled_mm", 80, 272, "bf16", "block")),
                     (fp8, fp8.make_signature("scaled_mm", 80, 272, "bf16", "row"))):
        ids = ["heuristic", "torch", "sk2_b16x64x64_w4_s2", TMA_IDS[0]]
        if sig.get("scale") == "block":
            ids.remove("torch")
        problem = problem_for(fam, sig, 19, ids)
        args, kwargs = problem.make_inputs("cpu", 3)
        results = gate_arms(problem, args, kwargs, problem.make_out, lambda: None)
        if sorted(results) != sorted(ids):
            failures.append(f"gate {sig}: judged {sorted(results)}, not {sorted(ids)}")
        for cid, res in results.items():
            if not res.status.ok:
                failures.append(f"gate {sig} {cid}: {res.status} {res.detail}")
    # the activation quantizer of QuantizedLinear on a bf16 activation (a zero row included)
    from tunedb.families.scaled_mm.launch import quantize_rows

    xa = torch.randn(5, 300, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16) * 3
    xa[2] = 0
    q, s = quantize_rows(xa, "int8")
    wq, ws = arms.quantize_rows(xa.float(), "int8")
    if not (torch.equal(q, wq) and torch.equal(s, ws)):
        failures.append("quantize_rows(int8) differs from the torch row quantizer")
    # a 3-D, non-contiguous activation is the same GEMM
    sig = int8.make_signature("scaled_mm", 80, 200, "fp16")
    (x, w, sx, sw), _ = int8.make_inputs(sig, 6, "cpu", seed=5)
    x3 = x.t().contiguous().t().reshape(2, 3, 200)
    got = int8.launch(configs.parse("b16x32x64_w4_s2_g8"), sig, x3, w, sx, sw)
    if got.shape != (2, 3, 80) or not torch.equal(got.reshape(6, 80), ops._cpu(sig, x, w, sx, sw)):
        failures.append("3-D / strided activation differs")
    interpret_child.report(failures)


@pytest.mark.slow
def test_lanes_under_interpreter():
    assert interpret_child.failures(__file__) == []


if __name__ == "__main__":
    _child()
