"""The CUDA tier's blocked kernel (kernels_cuda_blocked.py, `cudab_b<NB>_w<W>`) on the CPU: its ids
through the family's parser, its one predicate (ops, n range, panel width, warps, shared memory),
the launch geometry and dynamic shared memory, the source, and every kernel compiling for sm_90 with
NVRTC. The GPU behaviour (the fp64 reference inside captured graphs, non-SPD, in place, misaligned
inputs) is tests/gpu/test_linalg_cuda_gpu.py's."""
import pytest

from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_cuda as kc, kernels_cuda_blocked as blocked
from tunedb.families.linalg import kernels_cuda_blocked_src as blocked_src


def test_blocked_ids_parse_as_the_cuda_tier():
    cfg = configs.parse("cudab_b16_w8")
    assert cfg.lane == "cuda" and cfg.param("warps") == 8 and cfg.param("panel") == 16
    assert configs.dependency("cudab_b16_w4") == "cuda"
    assert blocked.parse("cudab_b16_w4") == (16, 4) and blocked.parse("cudat_t4") is None
    assert kc.parse("cudab_b16_w4") is None and kc.wide.parse("cudab_b16_w4") is None
    for bad in ("cudab_b016_w4", "cudab_b16_w4\n", "cudab_b16", "cudab_bx_w4"):
        assert blocked.parse(bad) is None
        with pytest.raises(ConfigError, match="cudab_b<NB>_w<W>"):
            configs.parse(bad)
    assert set(blocked.ids()) == {"cudab_b16_w4", "cudab_b16_w8"} and set(blocked.ids()) <= set(kc.all_ids())
    # after the tiles in the tie band's order; fewer warps first
    assert configs.simplicity("cudat_t2") < configs.simplicity("cudab_b16_w4") < configs.simplicity("cudab_b16_w8")


def test_the_predicate_names_what_is_wrong():
    assert "potrf, posv only, not trsv" in blocked.invalid_reason("trsv", 16, 4, 128, "fp32")
    assert "fp32, fp64 only, not fp16" in blocked.invalid_reason("potrf", 16, 4, 128, "fp16")
    assert "n in 33..128, got n=32" in blocked.invalid_reason("potrf", 16, 4, 32, "fp32")
    assert "n in 33..128, got n=129" in blocked.invalid_reason("posv", 16, 4, 129, "fp64")
    assert "panel width must be one of (16,), got 8" in blocked.invalid_reason("potrf", 8, 4, 64, "fp32")
    assert "one of (4, 8), got 2" in blocked.invalid_reason("potrf", 16, 2, 64, "fp32")
    assert blocked.invalid_reason("posv", 16, 8, 128, "fp64") is None
    assert kc.arm_invalid("posv", "cudab_b16_w4", 100, "fp64", check_runtime=False) is None
    assert "cudab_b<NB>_w<W>" in kc.arm_invalid("posv", "cudab_b16", 100, "fp64", check_runtime=False)
    assert kc.config_ids("potrf", 128, "fp32") == ()  # no GPU here: the tier offers nothing


def test_shared_memory_and_geometry():
    # the lower tiles of the padded matrix (36 of 16 x 16 at n = 128), 1/l_kk, the column, posv's b
    assert blocked.smem_bytes("potrf", 128, "fp32", 16) == (36 * 256 + 3 * 16) * 4 + 16
    assert blocked.smem_bytes("posv", 128, "fp64", 16) == (36 * 256 + 3 * 16 + 128) * 8 + 16
    assert blocked.smem_bytes("potrf", 100, "fp32", 16) == (28 * 256 + 48) * 4 + 16  # padded to 7 tiles
    # what the measured occupancy rests on: 6 blocks an SM at fp32, 3 at fp64 (228 KiB, 1 KiB a block reserved)
    assert 6 * (blocked.smem_bytes("posv", 128, "fp32", 16) + 1024) <= 228 * 1024
    assert 3 * (blocked.smem_bytes("posv", 128, "fp64", 16) + 1024) <= 228 * 1024
    assert kc.arm_smem("posv", "cudab_b16_w8", 64, "fp64") == blocked.smem_bytes("posv", 64, "fp64", 16)
    assert kc.geometry("potrf", "cudab_b16_w8", 128, 1001) == (1001, 256)


def test_the_source_is_the_common_part_and_the_kernel():
    src = kc.arm_source("posv", "cudab_b16_w4", 100, "fp64")
    assert src.startswith("#define N 100\n#define NB 16\n#define NT 7\n#define NTHREADS 128\n#define DOUBLE 1\n"
                          "#define POSV 1\n#define PIPE 1\n#define MINB 3\n")
    assert src.endswith(blocked_src.SOURCE) and "extern __shared__" in src


def test_every_blocked_kernel_compiles_for_sm90():
    """Each blocked kernel compiles with NVRTC for sm_90 on the CPU machine within the registers
    its launch bounds allow for the blocks an SM the shared memory fits (fp32 at 4 warps: 6 blocks,
    80 registers; fp64: 3 blocks), spilling at most 96 B (the cap measured 1.0-1.7x faster than the
    uncapped form on the H200, session 24 call 7)."""
    from nvrtc_cpu import compile_report, library

    lib = library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    compiled = 0
    for op in blocked.OPS:
        for n in (33, 47, 64, 100, 128):
            for dt in blocked.DTYPES:
                for cid in blocked.ids():
                    ok, log, usage = compile_report(lib, kc.arm_source(op, cid, n, dt))
                    where = f"{cid} {op} {dt} n={n}"
                    assert ok, f"{where}: {log[:1500]}"
                    assert usage.get("spill_bytes", 0) <= 96, f"{where} spills: {usage}"
                    blocks = blocked.min_blocks(op, n, dt, *blocked.parse(cid))
                    assert usage.get("registers", 0) * 32 * blocked.parse(cid)[1] * blocks <= 65536, (where, usage)
                    if dt == "fp32" and cid == "cudab_b16_w4":
                        assert blocks == 6, (where, blocks)
                    compiled += 1
    assert compiled == 40
