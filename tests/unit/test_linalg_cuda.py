"""The linalg family's CUDA C++ tier (kernels_cuda.py) on the CPU: its ids, its one validity
predicate (op, dtype, n, problems a warp, static shared memory, NVRTC present or not), the space
and the ladder taking it only where it can run (and outside the Triton cap), the pick rule's
dependency margin, the Triton prebuild leaving it alone, a clear error where it cannot run, and
the generated source's macros. The GPU behaviour is tests/gpu/test_linalg_cuda_gpu.py's."""
import pytest

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_cuda as kc, kernels_prebuild, ladder, signatures


@pytest.fixture
def present(monkeypatch):
    monkeypatch.setitem(kc._AVAILABLE, "nvrtc", True)  # as if the probe kernel had compiled
    configs.config_space.cache_clear()
    yield
    configs.config_space.cache_clear()


@pytest.fixture
def absent(monkeypatch):
    monkeypatch.setitem(kc._AVAILABLE, "nvrtc", False)
    configs.config_space.cache_clear()
    yield
    configs.config_space.cache_clear()


def test_ids_parse_as_their_own_tier():
    for cid, pipe in (("cuda_p2_w2", True), ("cudas_p2_w2", False)):
        cfg = configs.parse(cid)
        assert cfg.lane == "cuda" and configs.shape_of(cfg) == ("cuda", 2, 2) and configs.grid(cfg, 301) == 151
        assert configs.dependency(cid) == "cuda" and kc.parse(cid) == (2, 2, pipe)
    assert "cuda" in configs.LANES
    for bad in ("cuda", "cuda_p2", "cuda_w2", "cuda_p02_w2", "cuda_p2_w02", "cuda_px_w1", "cudax_p1_w1"):
        with pytest.raises(ConfigError, match="cuda_p<P>_w<W>"):
            configs.parse(bad)
    # after every Triton packing in the tie band's order; serial pivots, then fewer warps first
    assert configs.simplicity("cudas_p1_w1") > configs.simplicity("pdottf_w4")
    assert configs.simplicity("cudas_p1_w1") < configs.simplicity("cudas_p2_w2") < configs.simplicity("cuda_p1_w1")


def test_problems_a_block_follow_n_and_the_warps():
    assert [kc.per_warp(n) for n in (2, 3, 4, 5, 8, 9, 16, 17, 32)] == [16, 8, 8, 4, 4, 2, 2, 1, 1]
    for n in (2, 5, 16, 32):
        for w in kc.WARPS:
            p = w * kc.per_warp(n)
            assert kc.invalid_reason("potrf", p, w, n, "fp32", check_runtime=False) is None
            why = kc.invalid_reason("potrf", p * 2, w, n, "fp32", check_runtime=False)
            assert f"P must be {p} at {w} warps, got P={2 * p}" in why


def test_validity_names_what_is_wrong():
    assert "potrf, posv, trsv only, not gemv" in kc.invalid_reason("gemv", 1, 1, 32, "fp32", check_runtime=False)
    assert "fp32, fp64 only, not fp16" in kc.invalid_reason("posv", 1, 1, 32, "fp16", check_runtime=False)
    assert "posv at n in 2..64, got n=65" in kc.invalid_reason("posv", 1, 2, 65, "fp64", check_runtime=False)
    assert "trsv at n in 2..32, got n=33" in kc.invalid_reason("trsv", 1, 2, 33, "fp64", check_runtime=False)
    # past n = 32 one problem a block of NP / 32 warps, pipelined pivots only
    assert kc.invalid_reason("potrf", 1, 2, 33, "fp64", check_runtime=False) is None
    assert "(cuda_p1_w2), got P=2, W=4" in kc.invalid_reason("potrf", 2, 4, 64, "fp32", check_runtime=False)
    assert "serial-pivot form" in kc.invalid_reason("posv", 1, 2, 64, "fp32", check_runtime=False, pipe=False)
    assert "serial-pivot form" in kc.invalid_reason("trsv", 1, 1, 32, "fp32", check_runtime=False, pipe=False)
    assert kc.smem_bytes(64, "fp64", 2) == (64 * 65 + 2 * (64 + 2)) * 8 <= kc.STATIC_SMEM
    assert "one of (1, 2, 4, 8)" in kc.invalid_reason("posv", 3, 3, 32, "fp64", check_runtime=False)
    # static shared memory: fp64 n=32 holds 8960 B a warp, so 8 warps (71680 B) pass 48 KiB
    assert kc.smem_bytes(32, "fp64", 1) == (32 * 33 + 64) * 8
    assert kc.invalid_reason("potrf", 4, 4, 32, "fp64", check_runtime=False) is None
    assert "static shared memory" in kc.invalid_reason("potrf", 8, 8, 32, "fp64", check_runtime=False)


def test_a_batch_past_the_kernels_int_is_refused_by_the_predicate(present):
    # the kernels take the batch as a 32-bit int (launch raised at 2**31, after the pick)
    sig = signatures.make_signature("trsv", "fp32", 3)
    cfg = configs.parse("cuda_p32_w4")
    assert configs.invalid_reason(cfg, sig, 2 ** 31 - 1, shipped_profile("sm90")) is None
    assert "batch < 2**31" in configs.invalid_reason(cfg, sig, 2 ** 31, shipped_profile("sm90"))


def test_absent_is_invalid_and_not_in_the_space(absent):
    sig = signatures.make_signature("posv", "fp32", 32)
    why = configs.invalid_reason(configs.parse("cuda_p1_w1"), sig, 4096, shipped_profile("sm90"))
    assert "NVRTC" in why
    assert not [c for c in configs.config_space("sm90") if c.lane == "cuda"]
    assert not [a for a in ladder.arms(ladder.Cell("posv", "fp32", 32, 4096), shipped_profile("sm90"), 2)
                if configs.dependency(a)]
    from tunedb.families.linalg import FAMILY

    assert FAMILY.dependency_available("cuda_p1_w1") is False and FAMILY.dependency_available("shfl_p1_w1")


def test_present_joins_every_cell_it_can_run_past_the_cap(present):
    sm90 = shipped_profile("sm90")
    capped = ladder.arms(ladder.Cell("posv", "fp32", 16, 4096), sm90, 2)
    got = sorted(a for a in capped if a.startswith("cuda"))
    assert got == sorted(f"{tier}_p{p}_w{w}" for tier in ("cuda", "cudas") for p, w in ((2, 1), (4, 2), (8, 4), (16, 8)))
    assert len([a for a in capped if not a.startswith(("torch", "cuda"))]) <= 2
    fp64 = [a for a in ladder.arms(ladder.Cell("potrf", "fp64", 32, 4096), sm90, 2) if a.startswith("cuda")]
    assert sorted(fp64) == sorted([f"{tier}_p{w}_w{w}" for tier in ("cuda", "cudas") for w in (1, 2, 4)]  # 8 warps: > 48 KiB
                                  + ["cudaw_p2_w1", "cudaw_p4_w2", "cudaw_p8_w4"])  # two problems a warp from n = 17
    trsv = sorted(a for a in ladder.arms(ladder.Cell("trsv", "fp32", 16, 4096), sm90, 2) if a.startswith("cuda"))
    assert trsv == ["cuda_p16_w8", "cuda_p2_w1", "cuda_p4_w2", "cuda_p8_w4"]  # no serial trsv; the tiles from n = 33
    assert [a for a in ladder.arms(ladder.Cell("posv", "fp32", 64, 4096), sm90, 2) if a.startswith("cuda")] == [
        "cuda_p1_w2", "cudab_b16_w4", "cudab_b16_w8", "cudat_t2", "cudat_t4", "cudat_t8", "cudaw_p1_w1", "cudaw_p2_w2",
        "cudaw_p4_w4"]
    # fp64: four wide warps a block would need 70 KiB of static shared memory
    assert [a for a in ladder.arms(ladder.Cell("potrf", "fp64", 64, 4096), sm90, 2) if a.startswith("cudaw")] == [
        "cudaw_p1_w1", "cudaw_p2_w2"]
    # n = 128: the blocked and tile kernels, and not t2 (one thread a 2 x 2 tile: 2080 threads a block)
    assert [a for a in ladder.arms(ladder.Cell("posv", "fp32", 128, 4096), sm90, 2) if a.startswith("cuda")] == [
        "cudab_b16_w4", "cudab_b16_w8", "cudat_t4", "cudat_t8"]
    trsv64 = [a for a in ladder.arms(ladder.Cell("trsv", "fp64", 64, 4096), sm90, 2) if a.startswith("cuda")]
    assert trsv64 == ["cudat_t2", "cudat_t4", "cudat_t8"]  # the blocked kernel runs potrf / posv only
    assert not [a for a in ladder.arms(ladder.Cell("gemv", "fp32", 16, 4096), sm90, 2) if a.startswith("cuda")]


def test_the_pick_takes_it_only_past_the_dependency_margin():
    from tunedb.families.linalg import pick

    rule = pick.LINALG_RULE
    close = pick.decide({"torch": 100.0, "shfl_p1_w1": 10.0, "cuda_p1_w1": 9.8}, rule)
    clear = pick.decide({"torch": 100.0, "shfl_p1_w1": 10.0, "cuda_p1_w1": 7.0}, rule)
    assert (close.winner, close.native) == ("shfl_p1_w1", "shfl_p1_w1")
    assert (clear.winner, clear.native) == ("cuda_p1_w1", "shfl_p1_w1")


def test_the_triton_prebuild_leaves_the_tier_to_its_own_process():
    assert kernels_prebuild.compile_all([("posv", "cuda_p1_w1", 32, "fp64")]) == []


def test_launch_refuses_clearly_where_it_cannot_run(absent):
    import torch

    from tunedb.families.linalg.launch import launch

    a = torch.eye(8, dtype=torch.float64).expand(3, 8, 8).contiguous()
    with pytest.raises(ValueError, match="NVRTC"):
        launch("potrf", "cuda_p4_w1", a)
    with pytest.raises(ValueError, match="cuda_p<P>_w<W>"):
        launch("potrf", "cuda_q", a)
    with pytest.raises(ValueError, match="NVRTC"):
        launch("posv", "cudas_p4_w1", a, a[:, 0])


def test_the_source_is_specialised_by_macros():
    from tunedb.families.linalg import kernels_cuda_src as cs

    assert kc.source("trsv", 13, "fp32", 2).endswith(cs.TRSV) and kc.source("posv", 40, "fp32", 2).endswith(cs.BLOCK)
    assert kc.source("potrf", 32, "fp64", 1).endswith(cs.WARP)
    src = kc.source("posv", 13, "fp64", 2, pipe=False)
    head = src.split("\n")[:7]
    assert head == ["#define N 13", "#define NP 16", "#define WARPS 2", "#define DOUBLE 1", "#define POSV 1", "#define PIPE 0",
                    "#define COLMAJOR 0"]
    assert kc.defines("trsv", 8, "fp32", 1, colmajor=True)["COLMAJOR"] == 1
    assert kc.defines("potrf", 8, "fp32", 1, colmajor=True)["COLMAJOR"] == 0  # trsv's L layout only
    assert 'extern "C" __global__' in src and "tunedb_linalg" in src
    assert kc.defines("potrf", 2, "fp32", 8)["NP"] == 2 and kc.defines("potrf", 2, "fp32", 8)["POSV"] == 0


GRID = [(op, n, dt, pipe) for op in ("potrf", "posv", "trsv") for n in (4, 8, 16, 32, 64) for dt in ("fp32", "fp64")
        for pipe in (True, False)]


def test_every_grid_kernel_compiles_for_sm90_without_spilling():
    """Each kernel of the grid's n (4..64) compiles with NVRTC for sm_90 on the CPU machine (the
    nvidia-cuda-nvrtc-cu12 wheel) and ptxas reports no spill: the sources are checked where no GPU
    runs them."""
    from nvrtc_cpu import compile_report, library

    lib = library()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc-cu12 wheel is not installed")
    compiled = 0
    for op, n, dt, pipe in GRID:
        shapes = [(1, 2)] if n > kc.WARP_MAX_N else [(w * kc.per_warp(n), w) for w in kc.WARPS]
        valid = [(p, w) for p, w in shapes if not kc.invalid_reason(op, p, w, n, dt, check_runtime=False, pipe=pipe)]
        for p, w in valid[:1] + valid[-1:] if len(valid) > 1 else valid:  # the warps change bounds and arrays only
            for colmajor in (False, True) if op == "trsv" else (False,):
                ok, log, usage = compile_report(lib, kc.source(op, n, dt, w, pipe, colmajor))
                where = f"{kc.config_id(p, w, pipe)} {op} {dt} n={n} colmajor={colmajor}"
                assert ok, f"{where}: {log[:1500]}"
                assert usage.get("spill_bytes", 0) == 0, f"{where} spills: {usage}"
                compiled += 1
    assert compiled >= 60
