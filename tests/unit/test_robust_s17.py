"""Session 17's robustness fixes on the CPU: settings the serving path honours, bad inputs named,
shapes a hashed launch cannot take, and models nobody gave us (each test fails before its fix)."""
from __future__ import annotations

import sys

import pytest
import torch

import tunedb
from tunedb import settings
from tunedb.database import tiers

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


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
    assert got.stderr.count("Warning: ") == 1 and "NoGPUWarning" in got.stderr  # one line, the no-GPU class
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


MIXED_WORKLOAD = """
import torch
import torch.nn.functional as F
from torch import nn


class Conv1D(nn.Module):
    # transformers.pytorch_utils.Conv1D's layout: weight [in, out], y = addmm(bias, x, weight)

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)


class Net(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.c_attn = Conv1D(3 * d, d)
        self.mha = nn.MultiheadAttention(d, 4, batch_first=True)
        self.head = nn.Parameter(torch.randn(16, d) * 0.02)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        x = self.mha(q, k, v, need_weights=False)[0]
        return F.linear(self.proj(x), self.head)


def make(device):
    with torch.device(device):
        model = Net().to(torch.bfloat16).eval()
    return model, lambda batch, length: (torch.zeros(batch, length, 32, dtype=torch.bfloat16, device=device),)
"""

UNPATCHED_CONV1D = "gemm|op=unpatched|dt=half|N=96|K=32|src=conv1d"
UNPATCHED_CALL = "gemm|op=unpatched|dt=half|N=16|K=32|src=call"  # F.linear(x, self.head)


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    (tmp_path / "mixed_workload.py").write_text(MIXED_WORKLOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def test_gemms_optimize_does_not_swap_are_keyed_seen_not_patched(mixed):
    # a Conv1D ([in, out] weight: GPT-2), F.linear and nn.MultiheadAttention's projections were
    # census'd as op=gemm points: planned, measured, and never served by optimize()
    from tunedb import pipeline
    from tunedb.records import Signature

    fused = pipeline.take_census("mixed_workload:make", unit="tokens", max_length=64, max_batch=2)
    sigs = {p.signature.format() for p in fused.points if p.signature.family == "gemm"}
    assert sigs == {"gemm|op=gemm|dt=half|N=32|K=32",  # self.proj: the one nn.Linear
                    "gemm|op=unpatched|dt=half|N=32|K=32|src=call",  # MHA's q/k/v and out projections
                    UNPATCHED_CALL, UNPATCHED_CONV1D}
    # MHA's attention is SDPA (its meta math path gave an fp32 bmm key per sequence length)
    assert not [p for p in fused.points if p.signature.family == "bmm"]
    # an aten-level census cannot tell F.linear from nn.Linear; an [in, out] weight it can
    aten = pipeline.take_census("mixed_workload:make", unit="tokens", max_length=64, max_batch=2, fused=False)
    assert UNPATCHED_CONV1D in {p.signature.format() for p in aten.points}
    # nothing is built for them: no family serves the key
    from tunedb import families

    assert not families.serves(families.get("gemm"), Signature.parse(UNPATCHED_CONV1D))


def test_tune_says_seen_not_patched_and_groups_a_long_plan(mixed, monkeypatch, capsys):
    from tunedb import pipeline
    from tunedb.cli import main
    from tunedb.commands import plan_table

    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["tune", "mixed_workload:make", "--unit", "tokens", "--max-length", "512"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    census = int(out.split("census of mixed_workload:make (offline): ")[1].split(" point")[0])
    assert census > plan_table.FULL_ROWS
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert 0 < len(rows) <= plan_table.TOP_ROWS  # one screen: a row per signature
    assert any(UNPATCHED_CONV1D in r and " unserved " in r for r in rows)
    assert "One row per point: --all-points" in out
    text = " ".join(out.split())
    assert "seen, not patched:" in text and "Conv1D-style [in, out] weight" in text
    assert "F.linear, a packed in-projection (nn.MultiheadAttention)" in text
    assert "it measures these 1 signature(s)" in text  # only the nn.Linear's key is measured
    assert main(argv + ["--all-points"]) == 0
    every = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert len(every) == census


def test_the_grouped_plan_orders_signatures_by_time_share():
    from tunedb.commands import plan_table
    from tunedb.records import Point, Signature

    class Served:
        def __init__(self, sig, m, calls):
            self.point = Point(Signature.parse(sig), m, weight=0.0, calls=calls)
            self.tier, self.config_id = "model", "torch"

    big, small = "gemm|op=gemm|dt=half|N=4096|K=4096", "gemm|op=gemm|dt=half|N=64|K=64"
    served = [Served(small, m, 100) for m in (1, 2, 4, 8)] + [Served(big, 2048, 1)]
    rows, basis = plan_table.grouped(served, "sm90")
    assert basis == "time" and [r.signature.format() for r in rows] == [big, small]
    assert rows[1].points == 4 and (rows[1].m_lo, rows[1].m_hi) == (1, 8)
    assert abs(sum(r.share for r in rows) - 1) < 1e-9


def test_tuning_report_lists_gemm_modules_seen_not_patched(mixed):
    import importlib

    torch.manual_seed(0)
    model, inputs = importlib.import_module("mixed_workload").make("cpu")
    x = inputs(2, 5)[0].normal_()
    with torch.no_grad():
        ref = model(x)
        tuned = tunedb.optimize(model)
        torch.testing.assert_close(tuned(x), ref, rtol=0, atol=0)
    report = tunedb.tuning_report()
    line = next(l for l in report.splitlines() if "seen, not patched" in l)
    assert line.startswith("gemm: 2 modules (Net) seen, not patched") and "1 Conv1D with an [in, out] weight" in line
    assert "1 nn.MultiheadAttention packed in-projection" in line


def test_a_fused_hf_tanh_gelu_on_the_cpu_computes_what_the_model_wrote():
    # Phi / GPT-J's NewGELUActivation computes tanh-GELU step by step in bf16; the fused op's CPU
    # path ran F.gelu(approximate="tanh"), 67% of a Phi's logits differed (by up to 1 bf16 ulp)
    pytest.importorskip("transformers")
    from transformers.activations import NewGELUActivation
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(64, 256), NewGELUActivation(), nn.Linear(256, 64)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    torch.manual_seed(0)
    plain = MLP().to(torch.bfloat16)
    x = torch.randn(4, 9, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = plain(x)
        tuned = tunedb.optimize(plain, inplace=False)
        assert [m.__dict__["act"] for m in tuned.modules() if type(m).__name__ == "TunedLinear"] == ["gelu_tanh", "none"]
        torch.testing.assert_close(tuned(x), ref, rtol=0, atol=0)
        assert set(tuned.state_dict()) == set(plain.state_dict())


def test_importable_main_keeps_a_relative_file_that_exists_from_pythons_start_dir(tmp_path, monkeypatch):
    """A script run by a relative path that later chdirs keeps its __file__ (spawn reopens it from
    the directory Python started in); '<stdin>' is dropped."""
    import types
    from multiprocessing import process

    from tunedb.measure import spawn_main

    (tmp_path / "run.py").write_text("x = 1\n")
    monkeypatch.setattr(process, "ORIGINAL_DIR", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name, keep in (("run.py", True), ("<stdin>", False)):
        main = types.ModuleType("__main__")
        main.__file__, main.__spec__ = name, None
        monkeypatch.setitem(sys.modules, "__main__", main)
        spawn_main.importable_main()
        assert hasattr(main, "__file__") is keep, name
