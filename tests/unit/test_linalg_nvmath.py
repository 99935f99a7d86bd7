"""The linalg family's optional dependency tier (kernels_nvmath.py, spec 003) on the CPU: its ids,
its one validity predicate (op, dtype, shared memory, installed or not), the space and the ladder
taking it only where nvmath-python is installed (and outside the Triton cap), the Triton prebuild
leaving it alone, and a clear error where it cannot run. The GPU behaviour is
tests/gpu/test_linalg_nvmath_gpu.py's."""
import pytest

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.linalg import configs, kernels_nvmath, kernels_prebuild, ladder, signatures


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(kernels_nvmath, "available", lambda: True)
    monkeypatch.setitem(configs._DEVICE_API, "nvmath", True)  # as if nvmath.device had imported
    configs.config_space.cache_clear()  # the space is cached per process (an install does not move mid-run)
    yield
    configs.config_space.cache_clear()


@pytest.fixture
def absent(monkeypatch):
    monkeypatch.setattr(kernels_nvmath, "available", lambda: False)
    configs.config_space.cache_clear()
    yield
    configs.config_space.cache_clear()


def test_ids_parse_as_the_dependency_tier():
    cfg = configs.parse("nvmath_b1")
    assert cfg.lane == "nvmath" and cfg.param("per_program") == 1
    assert configs.dependency("nvmath_b1") == "nvmath" and "nvmath" in configs.LANES
    assert configs.shape_of(cfg) == ("nvmath", 1, 0) and configs.grid(cfg, 300) == 300
    for bad in ("nvmath", "nvmath_b", "nvmath_bx", "nvmath_p1_w1", "nvmath_b0", "nvmath_b01"):
        with pytest.raises(ConfigError, match="nvmath_b<B>"):
            configs.parse(bad)


def test_validity_names_what_is_wrong(installed):
    cfg = configs.parse("nvmath_b1")
    sm90 = shipped_profile("sm90")
    for op, dt, n in (("potrf", "fp32", 4), ("posv", "fp64", 64), ("posv", "fp64", 128), ("potrf", "fp32", 128)):
        assert configs.invalid_reason(cfg, signatures.make_signature(op, dt, n), 4096, sm90) is None
    assert "potrf, posv only, not trsv" in configs.invalid_reason(cfg, signatures.make_signature("trsv", "fp32", 8), 1, sm90)
    assert "one problem a block" in configs.invalid_reason(configs.parse("nvmath_b2"), signatures.make_signature("potrf", "fp32", 8), 1, sm90)
    assert kernels_nvmath.invalid_reason("potrf", 1, 128, "fp16").endswith("not fp16")
    # shared memory: n = 128 fp64 fits one problem (132 KiB), not past sm90's 227 KiB
    assert kernels_nvmath.smem_bytes(128, "fp64", 1) == (128 * 128 + 128) * 8 <= kernels_nvmath.SMEM_LIMIT
    assert "shared memory" in kernels_nvmath.invalid_reason("potrf", 1, 200, "fp64")
    # a GPU with less opt-in shared memory a block (sm89: 99 KiB) refuses n = 128 fp64 (132 KiB)
    from tunedb.arch import planning_profile

    sm89 = planning_profile("sm89")
    why = configs.invalid_reason(cfg, signatures.make_signature("posv", "fp64", 128), 4096, sm89)
    assert why is not None and "sm89 gives at most 101376" in why
    assert configs.invalid_reason(cfg, signatures.make_signature("posv", "fp64", 64), 4096, sm89) is None


def test_not_installed_is_invalid_and_not_in_the_space(absent):
    sig = signatures.make_signature("posv", "fp64", 64)
    why = configs.invalid_reason(configs.parse("nvmath_b1"), sig, 4096, shipped_profile("sm90"))
    assert "nvmath-python" in why and "not importable" in why
    assert not [c for c in configs.config_space("sm90") if c.lane == "nvmath"]
    assert not [a for a in ladder.arms(ladder.Cell("posv", "fp64", 64, 4096), shipped_profile("sm90"), 2)
                if configs.dependency(a)]


def test_installed_joins_the_space_and_every_cell_past_the_cap(installed):
    assert [c.id for c in configs.config_space("sm90") if c.lane == "nvmath"] == ["nvmath_b1"]
    sm90 = shipped_profile("sm90")
    capped = ladder.arms(ladder.Cell("posv", "fp64", 64, 4096), sm90, 2)
    assert "nvmath_b1" in capped and capped[0] == "torch"
    assert len([a for a in capped if not a.startswith(("torch", "nvmath"))]) <= 2
    assert "nvmath_b1" not in ladder.arms(ladder.Cell("trsv", "fp64", 64, 4096), sm90, 2)


def test_the_triton_prebuild_leaves_the_tier_to_its_own_process():
    assert kernels_prebuild.compile_all([("posv", "nvmath_b1", 64, "fp64"), ("potrf", "torch", 8, "fp32")]) == []


def test_launch_refuses_clearly_where_it_cannot_run(absent):
    import torch

    from tunedb.families.linalg.launch import launch

    a = torch.eye(8, dtype=torch.float64).expand(3, 8, 8).contiguous()
    with pytest.raises(ValueError, match="nvmath-python"):
        launch("potrf", "nvmath_b1", a)
    with pytest.raises(ValueError, match="nvmath_b<B>"):
        launch("potrf", "nvmath_q", a)


def _shipped_entry(op, dt, n):
    from tunedb import database

    files = database.lookup("sm90", "linalg")
    key = signatures.make_signature(op, dt, n)
    return next(res.db.entries[key] for res in files if key in res.db.entries)


def _nvmath_entry():
    """posv fp32 n=64 as session 20 E measured it: cuSOLVERDx's arm won batch 65536 by the
    dependency margin (1.14x), pdot_w1 the native winner (the shipped table lost that entry to the
    CUDA tier's block kernel in session 22 D, so the entry is rebuilt here from the shipped one)."""
    import dataclasses

    from tunedb.records import Region

    return dataclasses.replace(_shipped_entry("posv", "fp32", 64), regions=(Region(None, "nvmath_b1"),),
                               regions_native=(Region(None, "pdot_w1"),))


@pytest.mark.parametrize("have", [True, False])
def test_serving_takes_the_native_winner_where_the_dependency_is_missing(monkeypatch, have):
    """An entry whose full winner is cuSOLVERDx's arm and pdot_w1 the native one (_nvmath_entry):
    without nvmath-python the native region serves, not the next tier."""
    from tunedb.families.linalg import FAMILY
    from tunedb.runtime import serving

    monkeypatch.setattr(kernels_nvmath, "available", lambda: have)
    monkeypatch.setitem(configs._DEVICE_API, "nvmath", have)  # as if nvmath.device had (not) imported
    entry = _nvmath_entry()
    assert entry.lookup(65536) == "nvmath_b1" and entry.lookup(65536, native=True) == "pdot_w1"
    sig = signatures.make_signature("posv", "fp32", 64)
    got = [cid for _tag, _key, cid in serving.walk(FAMILY, sig, 65536, [("system", {sig: entry})])]
    assert got == (["nvmath_b1"] if have else ["pdot_w1"])
    assert FAMILY.dependency_available("pdot_w1") and FAMILY.dependency_available("nvmath_b1") is have


def test_recommend_names_the_full_and_the_native_winner():
    import tunedb

    entry = _shipped_entry("posv", "fp32", 64)  # the CUDA tier's block kernel since session 22 D
    full = tunedb.recommend("posv", "fp32", 64, 65536, deps="all")
    native = tunedb.recommend("posv", "fp32", 64, 65536, deps="native")
    assert (full.arm, full.packing, full.source) == (entry.lookup(65536), "cuda", "measured")
    assert native.arm == entry.lookup(65536, native=True) and configs.dependency(native.arm) is None
    assert tunedb.recommend("gemv", "fp32", 16, 4096, deps="all").arm == tunedb.recommend(
        "gemv", "fp32", 16, 4096, deps="native").arm  # gemv: no tier runs it


def test_a_broken_numba_counts_as_absent_not_as_an_error(tmp_path, monkeypatch):
    """available() finds `numba.cuda`, which runs numba's __init__: where that raises something
    other than ImportError (an OSError from a broken llvmlite), the tier is absent and the
    native space and serving stand (before: config_space, so every linalg selection, raised)."""
    import sys

    from tunedb.families.linalg import FAMILY
    from tunedb.runtime import serving

    (tmp_path / "nvmath").mkdir()
    (tmp_path / "nvmath" / "__init__.py").write_text("")
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text("raise OSError('libllvmlite.so: cannot open shared object file')\n")
    for name in ("nvmath", "numba", "numba.cuda"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    configs.config_space.cache_clear()
    try:
        space = configs.config_space("sm90")
        assert space and not [c for c in space if c.lane == "nvmath"]
        assert FAMILY.dependency_available("nvmath_b1") is False
        entry = _nvmath_entry()
        sig = signatures.make_signature("posv", "fp32", 64)
        got = [cid for _tag, _key, cid in serving.walk(FAMILY, sig, 65536, [("system", {sig: entry})])]
        assert got == ["pdot_w1"]
    finally:
        configs.config_space.cache_clear()


def test_found_but_without_its_device_api_counts_as_absent(monkeypatch):
    """nvmath-python found (say, installed without the device extra) but nvmath.device does not
    import here: the tier is absent, so the native regions serve (asked once a process)."""
    monkeypatch.setattr(kernels_nvmath, "available", lambda: True)
    monkeypatch.delitem(configs._DEVICE_API, "nvmath", raising=False)
    monkeypatch.setattr(kernels_nvmath, "_numba_cuda", lambda: (_ for _ in ()).throw(ImportError("no numba.cuda")))
    assert configs.dependency_tier_available() is False
    assert configs._DEVICE_API["nvmath"] is False
    monkeypatch.delitem(configs._DEVICE_API, "nvmath")


def test_a_user_table_naming_the_tier_is_served_and_gives_way_without_it(tmp_path, monkeypatch):
    """The shipped table names no nvmath arm since session 22, so a user table does: an entry
    written to the user database (as `tunedb linalg tune` on a machine with nvmath-python would)
    serves cuSOLVERDx's arm where the tier is installed and its native winner where it is not.
    tests/gpu/test_linalg_nvmath_gpu.py serves the public op through this same entry."""
    from tunedb import database, settings
    from tunedb.runtime import selector

    sig = signatures.make_signature("posv", "fp32", 64)
    entry = _nvmath_entry()
    with settings.override(USER_DB=str(tmp_path / "user")):
        database.write_entries("user", "linalg", "sm90", [entry],
                               configs=[configs.parse("nvmath_b1"), configs.parse("pdot_w1")])
    for have, want in ((True, "nvmath_b1"), (False, "pdot_w1")):
        monkeypatch.setattr(kernels_nvmath, "available", lambda have=have: have)
        monkeypatch.setitem(configs._DEVICE_API, "nvmath", have)
        with settings.override(USER_DB=str(tmp_path / "user")):
            selector.configure("sm90")
            try:
                got = selector.resolve("linalg", sig, 65536)
                assert (got.tier, got.config.id) == ("user", want), got
            finally:
                selector.configure()
