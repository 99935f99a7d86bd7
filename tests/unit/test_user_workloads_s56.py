"""A user's own workload through `tunedb tune` / `tunedb census` (session 56 probe): the GPU command
kept --device cpu; sys.exit or an argparse call inside the factory ended tunedb with a usage line that
looked like tunedb's own; inputs made off the model's device got the meta-tensor hint; the user's
prints went into `census --out -`'s JSON; a `test.py` workload imported the standard library's
`test`; --simulate left an empty temporary directory behind a failed command; a plain-function model
was refused naming a flag the user never gave."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tunedb import cli
from tunedb.commands import tune

_CONSOLE = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')] ; "
            "from tunedb.cli import main; sys.exit(main(sys.argv[1:]))")  # the console script's sys.path


def _run(tmp_path, *argv, console=False):
    env = dict(os.environ, TUNEDB_CACHE_DIR=str(tmp_path / "c"), TUNEDB_USER_DB=str(tmp_path / "u"),
               TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-c", _CONSOLE, *argv] if console else [sys.executable, "-m", "tunedb", *argv]
    if not console:
        env["PYTHONPATH"] = str(tmp_path)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


_MLP = ("import torch\n"
        "def make(device='cpu'):\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)).to(device=device, dtype=torch.bfloat16)\n"
        "    return m, lambda b, n: (torch.randn(b, n, 64, device=device, dtype=torch.bfloat16),)\n")
_FLAGS = ("--unit", "tokens", "--max-length", "32", "--max-batch-size", "2", "--no-fused")


def test_the_gpu_command_keeps_the_census_device():
    args = cli.build_parser().parse_args(["tune", "mymodel:make", "--device", "cpu"])
    assert tune.tune_command(args).startswith("tunedb tune mymodel:make --device cpu")
    assert "--device" not in tune.tune_command(cli.build_parser().parse_args(["tune", "mymodel:make"]))


def test_an_exit_inside_the_factory_is_named(tmp_path):
    (tmp_path / "exiting_s56.py").write_text("def make(device='cpu'):\n    raise SystemExit(3)\n")
    out = _run(tmp_path, "tune", "exiting_s56:make", *_FLAGS)
    assert out.returncode == 2 and "called sys.exit(3) in building the model" in out.stderr
    assert "exiting_s56:make" in out.stderr and "Traceback" not in out.stderr


def test_an_argparse_parser_in_the_factory_reads_an_empty_command_line(tmp_path):
    (tmp_path / "parsing_s56.py").write_text(_MLP.replace(
        "def make(device='cpu'):\n",
        "def make(device='cpu'):\n    import argparse\n    p = argparse.ArgumentParser()\n"
        "    p.add_argument('--hidden', type=int, default=128)\n    assert p.parse_args().hidden == 128\n"))
    out = _run(tmp_path, "tune", "parsing_s56:make", *_FLAGS)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "census of parsing_s56:make" in out.stdout and "usage:" not in out.stderr


def test_inputs_off_the_model_device_are_told_so(tmp_path):
    (tmp_path / "offdev_s56.py").write_text(
        "import torch\n"
        "def make(device='cpu'):\n"
        "    m = torch.nn.Linear(64, 32).to(device=device, dtype=torch.bfloat16)\n"
        "    return m, lambda b, n: (torch.randn(b, n, 64, dtype=torch.bfloat16),)\n")
    out = _run(tmp_path, "tune", "offdev_s56:make", *_FLAGS)
    assert out.returncode == 2 and "input_factory must make its tensors on the device it is given" in out.stderr
    assert "--device cpu" not in out.stderr


def test_census_to_standard_output_keeps_the_workloads_prints_out_of_the_json(tmp_path):
    (tmp_path / "chatty_s56.py").write_text("print('loading chatty')\n" + _MLP.replace(
        "def make(device='cpu'):\n", "def make(device='cpu'):\n    print('building')\n"))
    out = _run(tmp_path, "census", "chatty_s56:make", "--unit", "tokens", "--max-length", "32",
               "--max-batch-size", "2", "--out", "-")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["points"]
    assert "loading chatty" in out.stderr and "building" in out.stderr


def test_a_workload_named_test_imports_from_the_working_directory(tmp_path):
    (tmp_path / "test.py").write_text(_MLP)
    out = _run(tmp_path, "tune", "test:make", *_FLAGS, console=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "census of test:make" in out.stdout


def test_a_failed_simulate_leaves_no_empty_directory(tmp_path):
    (tmp_path / "raising_s56.py").write_text("def make(device='cpu'):\n    raise ValueError('no model today')\n")
    out = _run(tmp_path, "tune", "raising_s56:make", "--simulate", *_FLAGS)
    assert out.returncode == 2 and "no model today" in out.stderr
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("tunedb-simulate-")]
