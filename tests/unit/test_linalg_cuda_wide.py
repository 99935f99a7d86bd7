"""The CUDA tier's wide-warp kernel (kernels_cuda_wide.py, `cudaw_p<W>_w<W>`) on the CPU: its ids
through the family's parser, its one predicate (ops, n range, warps, static shared memory), the
launch source, and every kernel compiling for sm_90 with NVRTC (fp32 without a spill). The GPU
behaviour (the fp64 reference inside captured graphs, non-SPD, in place) is
tests/gpu/test_linalg_cuda_gpu.py's."""
import pytest

from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_cuda as kc, kernels_cuda_wide as wide


def test_wide_ids_parse_as_the_cuda_tier():
    cfg = configs.parse("cudaw_p2_w2")
    assert cfg.lane == "cuda" and cfg.param("per_program") == 2 and cfg.param("warps") == 2
    assert configs.dependency("cudaw_p2_w2") == "cuda"
    assert wide.parse("cudaw_p4_w4") == 4 and wide.parse("cudat_t4") is None and kc.parse("cudaw_p1_w1") is None
    for bad in ("cudaw_p2_w1", "cudaw_p02_w02", "cudaw_p1_w1\n", "cudaw_p1", "cudaw_px_wx"):
        assert wide.parse(bad) is None
        with pytest.raises(ConfigError, match="cudaw_p<W>_w<W>"):
            configs.parse(bad)
    assert {"cudaw_p1_w1", "cudaw_p2_w2", "cudaw_p4_w4"} <= set(kc.all_ids())
    # after the warp and block kernels in the tie band's order, before the tiles; fewer warps first
    assert (configs.simplicity("cuda_p1_w2") < configs.simplicity("cudaw_p1_w1") < configs.simplicity("cudaw_p4_w4")
            < configs.simplicity("cudat_t8"))


def test_the_predicate_names_what_is_wrong():
    assert "potrf, posv only, not trsv" in wide.invalid_reason("trsv", 1, 64, "fp32")
    assert "fp32, fp64 only, not bf16" in wide.invalid_reason("potrf", 1, 64, "bf16")
    assert "n in 33..64, got n=32" in wide.invalid_reason("posv", 1, 32, "fp32")  # the warp kernel's range
    assert "n in 33..64, got n=65" in wide.invalid_reason("posv", 1, 65, "fp32")
    assert "one of (1, 2, 4)" in wide.invalid_reason("potrf", 8, 64, "fp32")
    assert "70656 B of static shared memory" in wide.invalid_reason("potrf", 4, 64, "fp64")
    assert wide.invalid_reason("potrf", 4, 64, "fp32") is None and wide.invalid_reason("posv", 2, 64, "fp64") is None
    assert kc.arm_invalid("posv", "cudaw_p2_w2", 48, "fp64", check_runtime=False) is None
    assert "cudaw_p<W>_w<W>" in kc.arm_invalid("posv", "cudaw_p2_w1", 48, "fp64", check_runtime=False)
    assert kc.arm_smem("potrf", "cudaw_p2_w2", 64, "fp32") == 2 * (32 * 65 + 128) * 4


def test_the_source_is_the_common_part_and_the_kernel():
    src = kc.arm_source("posv", "cudaw_p2_w2", 40, "fp64")
    assert src.startswith("#define N 40\n#define WARPS 2\n#define DOUBLE 1\n#define POSV 1\n") and src.endswith(wide.SOURCE)


def test_every_wide_kernel_compiles_for_sm90():
    """Each wide kernel at n 33..64 compiles with NVRTC for sm_90 on the CPU machine; fp32 keeps
    both rows in at most 168 registers, without a spill except posv past n = 56, which is capped
    there (launch bounds: 12 warps an SM, measured faster on the H200 than the uncapped form). fp64
    holds 96 doubles a lane: ptxas may spill past n = 48, which the ladder's timing then judges."""
    from nvrtc_cpu import compile_report, library

    lib = library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    compiled = 0
    for op in wide.OPS:
        for n in (33, 40, 48, 63, 64):
            for dt in wide.DTYPES:
                for w in wide.WARPS:
                    if wide.invalid_reason(op, w, n, dt):
                        continue
                    ok, log, usage = compile_report(lib, kc.arm_source(op, wide.config_id(w), n, dt))
                    where = f"cudaw_p{w}_w{w} {op} {dt} n={n}"
                    assert ok, f"{where}: {log[:1500]}"
                    if dt == "fp32" and not (op == "posv" and n > 56):  # posv there: capped at 168 registers
                        assert usage.get("spill_bytes", 0) == 0, f"{where} spills: {usage}"
                    if dt == "fp32":
                        assert usage.get("registers", 0) <= 168, f"{where}: {usage}"
                    compiled += 1
    assert compiled >= 50
