"""The CUDA tier's wide-warp kernel (kernels_cuda_wide.py, `cudaw_p<P>_w<W>`) on the CPU: its ids
through the family's parser, its one predicate (ops, n range, warps, static shared memory), the
launch source, and every kernel compiling for sm_90 with NVRTC (fp32 without a spill). The GPU
behaviour (the fp64 reference inside captured graphs, non-SPD, in place) is
tests/gpu/test_linalg_cuda_gpu.py's."""
import pytest

from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_cuda as kc, kernels_cuda_wide as wide


def test_wide_ids_parse_as_the_cuda_tier():
    cfg = configs.parse("cudaw_p4_w2")
    assert cfg.lane == "cuda" and cfg.param("per_program") == 4 and cfg.param("warps") == 2
    assert configs.dependency("cudaw_p2_w2") == "cuda"
    assert wide.parse("cudaw_p4_w4") == (4, 4) and wide.parse("cudat_t4") is None and kc.parse("cudaw_p1_w1") is None
    for bad in ("cudaw_p02_w2", "cudaw_p1_w1\n", "cudaw_p1", "cudaw_px_wx"):
        assert wide.parse(bad) is None
        with pytest.raises(ConfigError, match="cudaw_p<P>_w<W>"):
            configs.parse(bad)
    # one problem a warp past n = 32, two (16 lanes each) from n = 17 to 32
    assert wide.ids_at(64) == ("cudaw_p1_w1", "cudaw_p2_w2", "cudaw_p4_w4")
    assert wide.ids_at(17) == ("cudaw_p2_w1", "cudaw_p4_w2", "cudaw_p8_w4") == wide.ids_at(32)
    assert set(wide.ids_at(17) + wide.ids_at(64)) <= set(kc.all_ids())
    assert wide.defines("posv", 32, "fp32", 2)["L"] == 16 and wide.defines("posv", 33, "fp32", 2)["L"] == 32
    # after the warp and block kernels in the tie band's order, before the tiles; fewer warps first
    assert (configs.simplicity("cuda_p1_w2") < configs.simplicity("cudaw_p1_w1") < configs.simplicity("cudaw_p4_w4")
            < configs.simplicity("cudat_t8"))


def test_the_predicate_names_what_is_wrong():
    assert "potrf, posv only, not trsv" in wide.invalid_reason("trsv", 1, 1, 64, "fp32")
    assert "fp32, fp64 only, not bf16" in wide.invalid_reason("potrf", 1, 1, 64, "bf16")
    assert "n in 17..64, got n=16" in wide.invalid_reason("posv", 2, 1, 16, "fp32")  # the warp kernel's alone
    assert "n in 17..64, got n=65" in wide.invalid_reason("posv", 1, 1, 65, "fp32")
    assert "one of (1, 2, 4)" in wide.invalid_reason("potrf", 8, 8, 64, "fp32")
    assert "P must be 2 at 1 warps, got P=1" in wide.invalid_reason("potrf", 1, 1, 32, "fp32")
    assert "P must be 1 at 1 warps, got P=2" in wide.invalid_reason("potrf", 2, 1, 33, "fp32")
    assert "70656 B of static shared memory" in wide.invalid_reason("potrf", 4, 4, 64, "fp64")
    assert wide.invalid_reason("potrf", 4, 4, 64, "fp32") is None and wide.invalid_reason("posv", 4, 2, 24, "fp64") is None
    assert kc.arm_invalid("posv", "cudaw_p2_w2", 48, "fp64", check_runtime=False) is None
    assert "P must be 4" in kc.arm_invalid("posv", "cudaw_p2_w2", 20, "fp64", check_runtime=False)
    assert "cudaw_p<P>_w<W>" in kc.arm_invalid("posv", "cudaw_p2", 48, "fp64", check_runtime=False)
    assert kc.arm_smem("potrf", "cudaw_p2_w2", 64, "fp32") == 2 * (32 * 65 + 128) * 4
    assert kc.geometry("posv", "cudaw_p4_w2", 24, 1001) == (251, 64)


def test_the_source_is_the_common_part_and_the_kernel():
    src = kc.arm_source("posv", "cudaw_p2_w2", 40, "fp64")
    assert src.startswith("#define N 40\n#define L 32\n#define WARPS 2\n#define DOUBLE 1\n#define POSV 1\n")
    assert src.endswith(wide.SOURCE)


def test_every_wide_kernel_compiles_for_sm90():
    """Each wide kernel at n 17..64 compiles with NVRTC for sm_90 on the CPU machine; fp32 keeps
    both rows in at most 168 registers, spilling at most 64 B except posv past n = 56, which is capped
    there (launch bounds: 12 warps an SM, measured faster on the H200 than the uncapped form). fp64
    holds 96 doubles a lane: ptxas may spill past n = 48, which the ladder's timing then judges."""
    from nvrtc_cpu import compile_report, library

    lib = library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    compiled = 0
    for op in wide.OPS:
        for n in (17, 24, 32, 33, 40, 48, 63, 64):
            for dt in wide.DTYPES:
                for cid in wide.ids_at(n):
                    if wide.invalid_reason(op, *wide.parse(cid), n, dt):
                        continue
                    ok, log, usage = compile_report(lib, kc.arm_source(op, cid, n, dt))
                    where = f"{cid} {op} {dt} n={n}"
                    assert ok, f"{where}: {log[:1500]}"
                    if dt == "fp32" and not (op == "posv" and n > 56):  # posv there: capped at 168 registers
                        assert usage.get("spill_bytes", 0) <= 64, f"{where} spills: {usage}"
                    if dt == "fp32":
                        assert usage.get("registers", 0) <= 168, f"{where}: {usage}"
                    compiled += 1
    assert compiled >= 80
