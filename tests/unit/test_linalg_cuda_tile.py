"""The CUDA tier's tile kernel (kernels_cuda_tile.py, `cudat_t<TS>`) on the CPU: its ids through the
family's parser, its one predicate (n range, tile sides, threads a block, fp64 registers), the
launch geometry, and every grid kernel compiling for sm_90 with NVRTC without a spill. The GPU
behaviour (the fp64 reference inside captured graphs, non-SPD, in place, both L layouts) is
tests/gpu/test_linalg_cuda_gpu.py's."""
import pytest

from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_cuda as kc, kernels_cuda_tile as tile


def test_tile_ids_parse_as_the_cuda_tier():
    cfg = configs.parse("cudat_t4")
    assert cfg.lane == "cuda" and cfg.param("tile") == 4 and configs.dependency("cudat_t4") == "cuda"
    assert tile.parse("cudat_t8") == 8 and tile.parse("cuda_p1_w2") is None and kc.parse("cudat_t4") is None
    for bad in ("cudat_t04", "cudat_", "cudat_t", "cudat_tx"):
        with pytest.raises(ConfigError, match="cudat_t<TS>"):
            configs.parse(bad)
    assert "cudat_t2" in kc.all_ids() and "cudat_t8" in kc.all_ids()
    # after the warp and block kernels in the tie band's order; the bigger tile (fewer threads) first
    assert configs.simplicity("cuda_p16_w8") < configs.simplicity("cudat_t8") < configs.simplicity("cudat_t2")


def test_the_predicate_names_what_is_wrong():
    assert "potrf, posv, trsv only, not gemm" in tile.invalid_reason("gemm", 4, 64, "fp32")
    assert "fp32, fp64 only, not fp16" in tile.invalid_reason("posv", 4, 64, "fp16")
    assert "n in 33..128, got n=129" in tile.invalid_reason("posv", 4, 129, "fp32")
    assert "n in 33..128, got n=32" in tile.invalid_reason("trsv", 2, 32, "fp32")  # the warp kernels' range
    assert "one of (2, 4, 8)" in tile.invalid_reason("potrf", 16, 128, "fp32")
    assert "n in 33..128, got n=16" in tile.invalid_reason("potrf", 8, 16, "fp32")
    assert tile.invalid_reason("potrf", 8, 128, "fp64") is None  # 64 doubles a thread: 184 registers, no spill
    # one thread a lower tile: n = 128 at 2 x 2 tiles is 2080 threads
    assert "2080 threads" in tile.invalid_reason("potrf", 2, 128, "fp32")
    assert tile.invalid_reason("posv", 2, 64, "fp32") is None and tile.threads("posv", 64, 2) == 560
    assert kc.arm_invalid("posv", "cudat_t4", 128, "fp64", check_runtime=False) is None
    assert "cudat_t<TS>" in kc.arm_invalid("posv", "cudaz_t4", 128, "fp64", check_runtime=False)


def test_the_block_covers_the_lower_tiles():
    # posv borders the matrix with b as row n: one more tile row where n % TS == 0
    assert tile.tiles("potrf", 128, 8) == (16, 16) and tile.tiles("posv", 128, 8) == (17, 16)
    assert tile.tiles("posv", 100, 8) == (13, 13) and tile.tiles("trsv", 100, 8) == (13, 13)
    assert tile.threads("potrf", 128, 8) == 16 * 17 // 2 and tile.block_threads("potrf", 128, 8) == 160
    head = tile.defines("posv", 100, "fp64", 4)
    assert (head["NTR"], head["NTC"], head["POSV"], head["DOUBLE"], head["TRSV"]) == (26, 25, 1, 1, 0)
    assert tile.defines("trsv", 40, "fp32", 4, colmajor=True)["COLMAJOR"] == 1
    assert tile.defines("potrf", 40, "fp32", 4, colmajor=True)["COLMAJOR"] == 0
    src = kc.arm_source("potrf", "cudat_t4", 40, "fp32")
    assert src.startswith("#define N 40\n#define TS 4\n") and src.endswith(tile.SOURCE)
    # the two column buffers, the solve's two vectors and the info word
    assert tile.smem_bytes("posv", 128, "fp64", 8) == 4 * 17 * 8 * 8 + 4


GRID = [(op, n, dt) for op in ("potrf", "posv", "trsv") for n in (33, 64, 100, 128) for dt in ("fp32", "fp64")]


def test_every_grid_tile_kernel_compiles_for_sm90_without_spilling():
    """Each tile kernel (every valid TS) at n 33..128 compiles with NVRTC for sm_90 on the CPU
    machine and ptxas reports no spill (trsv in both of L's layouts)."""
    from nvrtc_cpu import compile_report, library

    lib = library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    compiled = 0
    for op, n, dt in GRID:
        for ts in tile.TILES:
            if tile.invalid_reason(op, ts, n, dt):
                continue
            for colmajor in (False, True) if op == "trsv" else (False,):
                ok, log, usage = compile_report(lib, kc.arm_source(op, tile.config_id(ts), n, dt, colmajor))
                where = f"cudat_t{ts} {op} {dt} n={n} colmajor={colmajor}"
                assert ok, f"{where}: {log[:1500]}"
                assert usage.get("spill_bytes", 0) == 0, f"{where} spills: {usage}"
                compiled += 1
    assert compiled >= 60
