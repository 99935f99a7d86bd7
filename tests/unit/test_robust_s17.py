"""Session 17's robustness fixes on the CPU: settings the serving path honours, bad inputs named,
shapes a hashed launch cannot take, and models nobody gave us (each test fails before its fix)."""
from __future__ import annotations

import pytest
import torch

import tunedb
from tunedb import settings
from tunedb.database import tiers


def test_recommend_honours_model_fallback_off_as_the_serving_path_does(tmp_path):
    # the selector's default tier turns the linalg heuristic off under TUNEDB_MODEL_FALLBACK=0
    # (runtime/untuned.answer) and serves the library arm; recommend() still said the heuristic
    from tunedb import arch, families
    from tunedb.runtime import untuned

    fam = families.get("linalg")
    with tiers.system_root_override(tmp_path):
        guessed = tunedb.recommend("posv", "fp64", 16, 4096)
        with settings.override(MODEL_FALLBACK="0"):
            off = tunedb.recommend("posv", "fp64", 16, 4096)
            served = untuned.answer(fam, fam.make_signature("posv", "fp64", 16),
                                    arch.shipped_profile("sm90"), 4096)
    assert guessed.source == "heuristic" and guessed.arm != "torch"
    assert off.arm == "torch" and off.packing == "library" and off.source == "fallback"
    assert "TUNEDB_MODEL_FALLBACK=0" in off.reason
    assert served.id == "torch"  # the serving path's answer, which the plan now states


def test_recommend_still_reads_a_measured_entry_with_model_fallback_off():
    # the setting turns guesses off, not measurements: the shipped sm90 table keeps serving
    with settings.override(MODEL_FALLBACK="0"):
        got = tunedb.recommend("potrf", "fp32", 8, 2048)
    assert got.source == "measured"


@pytest.mark.parametrize("bad", [8, -1, 100])
def test_group_gemm_names_an_out_of_range_expert_id_and_the_allowed_range(bad):
    # the CPU arm indexed past the stacked experts (or wrapped around at -1) and returned garbage
    from tunedb.errors import SignatureError
    from tunedb.runtime import dispatch

    x = torch.randn(4, 16, dtype=torch.bfloat16)
    w = torch.randn(8, 32, 16, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, bad], [3, 4], [5, 6]])
    with pytest.raises(SignatureError, match=rf"expert id {bad} at \[1, 1\]; ids must be in 0\.\.7 "):
        dispatch.call("group_gemm", "group_gemm", x, w, ids)
    ids[1, 1] = 7  # the edge of the allowed range runs
    assert dispatch.call("group_gemm", "group_gemm", x, w, ids).shape == (4, 2, 32)


def test_group_gemm_ids_check_is_off_for_cuda_unless_asked():
    # a check of CUDA ids reads them back (a device sync per call): only under the debug setting
    assert settings.CHECK_INPUTS.default == "0"
    with settings.override(CHECK_INPUTS="1"):
        assert settings.check_inputs()
    with settings.override(CHECK_INPUTS="yes"), pytest.raises(Exception, match="TUNEDB_CHECK_INPUTS='yes'"):
        settings.check_inputs()


def test_depthwise_conv_above_the_grid_limit_runs_the_torch_form():
    # the direct depthwise kernel launches one grid-z program per batch row: a batch above 65535
    # failed to launch on the GPU; the serving layer now runs F.conv1d for it (the GPU test runs it)
    from tunedb.families.conv import configs
    from tunedb.families.conv.ops import GRID_YZ_MAX, grid_fits

    dw = configs.parse("dw_t64_c64_w4")
    small = torch.empty(GRID_YZ_MAX, 128, 8, device="meta")
    huge = torch.empty(GRID_YZ_MAX + 1, 128, 8, device="meta")
    wide = torch.empty(2, 64 * GRID_YZ_MAX + 1, 8, device="meta")
    assert grid_fits(dw, small) and not grid_fits(dw, huge) and not grid_fits(dw, wide)
    assert grid_fits(configs.parse("ig_b64x64x32_w4_s3"), huge)  # its grid is (M blocks, Cout blocks)


def _stdin_script(code: str, tmp_path) -> "subprocess.CompletedProcess[str]":
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src, "CUDA_VISIBLE_DEVICES": "", "HOME": str(tmp_path),
           "TUNEDB_USER_DB": str(tmp_path / "user"), "TUNEDB_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-"], input=code, text=True, capture_output=True, env=env,
                          cwd=tmp_path, timeout=240)


PREWARM_ON_STDIN = """
import torch, tunedb
m = tunedb.optimize(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                        torch.nn.Linear(128, 64)).to(torch.bfloat16))
print(tunedb.prewarm(m, (torch.randn(4, 64, dtype=torch.bfloat16),), budget_s=5).summary())
"""


def test_prewarm_from_a_script_on_stdin_without_a_gpu_says_why_in_one_line(tmp_path):
    # it started a compile pool whose spawned children re-ran '<stdin>' and died, one traceback
    # each, then warned once per point that the CUDA-graph timer needs a GPU
    got = _stdin_script(PREWARM_ON_STDIN, tmp_path)
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr and "FileNotFoundError" not in got.stderr
    assert "prewarm: 2 must-tune points, 0 measured, 2 uncovered" in got.stdout
    assert got.stderr.count("AutotuneWarning") == 1
    assert "prewarm measured nothing: no CUDA GPU here" in got.stderr


SPAWN_ON_STDIN = """
import os
from tunedb import families
from tunedb.build import compile_pool
pool = compile_pool._executor(families.get("gemm"), 1)
print("child", pool.submit(os.getpid).result(timeout=120) != os.getpid())
pool.shutdown()
"""


def test_a_compile_pool_started_from_a_script_on_stdin_runs(tmp_path):
    # on a GPU machine the same script measured nothing: each spawned child re-ran __main__ from
    # its __file__ '<stdin>' (spawn_main.importable_main drops a __file__ that names no file)
    got = _stdin_script(SPAWN_ON_STDIN, tmp_path)
    assert got.returncode == 0 and "child True" in got.stdout, got.stderr
    assert "Traceback" not in got.stderr
