"""What a new user met in `tunedb tune` (session 28 audit): the GPU command it suggested dropped
flags the census was taken with; --min-speedup nan passed the check and crashed after the census;
a non-UTF-8 manifest, capture or census crashed with a traceback; a capture naming a key no
family serves was measured and then refused; `tunedb tune mymodel:make` beside mymodel.py did
not find the module (the console script has no working directory on sys.path)."""
import json
import shlex
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb import cli
from tunedb.build import partition, steps
from tunedb.census import read_capture, read_census
from tunedb.census.modes import read_manifest
from tunedb.commands import tune
from tunedb.errors import BuildError, CensusError


def _args(*argv):
    return cli.build_parser().parse_args(["tune", *argv])


def test_the_gpu_command_keeps_every_census_flag():
    args = _args("conformer", "--mode", "streaming", "--chunk-size", "64", "--max-batch-size", "4",
                 "--impl", "mirror", "--capture", "my cap.jsonl", "--no-fused", "--manifest", "m.jsonl")
    cmd = tune.tune_command(args)
    assert cmd == ("tunedb tune conformer --mode streaming --max-batch-size 4 --chunk-size 64 "
                   "--manifest m.jsonl --capture 'my cap.jsonl' --impl mirror --no-fused")
    again = _args(*shlex.split(cmd)[2:])
    assert tune.tune_command(again) == cmd  # the command parses back to the same census flags
    assert tune.tune_command(_args("whisper-base")) == "tunedb tune whisper-base"


@pytest.mark.parametrize("value", ["nan", "inf", "0.5"])
def test_min_speedup_must_be_a_finite_number_at_least_one(value):
    with pytest.raises(BuildError, match=f"--min-speedup={value} must be a finite number >= 1.0"):
        steps.check_options(_args("whisper-base", "--min-speedup", value), gpu=True)
    with pytest.raises(BuildError, match="must be a finite number >= 1.0"):
        partition._rule(None, None, float(value), None)


def test_min_speedup_nan_is_refused_before_the_census(tmp_path):
    env = dict(os.environ, TUNEDB_CACHE_DIR=str(tmp_path / "c"), TUNEDB_USER_DB=str(tmp_path / "u"))
    out = subprocess.run([sys.executable, "-m", "tunedb", "tune", "whisper-base", "--min-speedup", "nan"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "--min-speedup=nan must be a finite number" in out.stderr
    assert "census of" not in out.stdout and "Traceback" not in out.stderr


def test_files_that_are_not_text_are_named(tmp_path):
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b'{"duration": 1.0}\n\xff\xfe\x00garbage\n')
    with pytest.raises(CensusError, match="manifest .*bin.jsonl is not UTF-8 text"):
        read_manifest(bad, "duration")
    with pytest.raises(CensusError, match="capture .*bin.jsonl is not UTF-8 text"):
        read_capture(bad)
    with pytest.raises(CensusError, match="census .*bin.jsonl is not UTF-8 text"):
        read_census(bad)


def test_a_capture_naming_a_key_no_family_takes_is_refused_when_read(tmp_path):
    cap = tmp_path / "cap.jsonl"
    rows = [{"signature": "gemm|op=gemm|dt=bf16|N=64|K=64", "M": 8, "calls": 3},
            {"signature": "gemm|op=gemm|dt=half|N=0|K=-5", "M": 8, "calls": 1}]
    cap.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CensusError, match="line 2.*N=0 must be a positive integer"):
        read_capture(cap)
    cap.write_text(json.dumps(rows[0]) + "\n")
    assert [p.m for p in read_capture(cap).points] == [8]


def test_a_workload_module_in_the_working_directory_imports(tmp_path):
    (tmp_path / "mymodel_s28.py").write_text(
        "import torch\n"
        "def make(device='cpu'):\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)).to(device=device, dtype=torch.bfloat16)\n"
        "    return m, lambda b, n: (torch.randn(b, n, 64, device=device, dtype=torch.bfloat16),)\n")
    # the console script's sys.path: the interpreter's, without the working directory
    code = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')] ; "
            "from tunedb.cli import main; sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, TUNEDB_CACHE_DIR=str(tmp_path / "c"), TUNEDB_USER_DB=str(tmp_path / "u"))
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", code, "tune", "mymodel_s28:make", "--unit", "tokens",
                          "--max-length", "64", "--max-batch-size", "2", "--no-fused"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "census of mymodel_s28:make" in out.stdout and "No GPU: nothing was measured" in out.stdout
    assert not (Path.cwd() / "mymodel_s28.py").exists()


def test_census_out_dash_writes_standard_output(tmp_path):
    """`tunedb census ... --out -` wrote a file named '-'."""
    (tmp_path / "mymodel_s28b.py").write_text(
        "import torch\n"
        "def make(device='cpu'):\n"
        "    m = torch.nn.Linear(64, 32).to(device=device, dtype=torch.bfloat16)\n"
        "    return m, lambda b, n: (torch.randn(b, n, 64, device=device, dtype=torch.bfloat16),)\n")
    env = dict(os.environ, TUNEDB_CACHE_DIR=str(tmp_path / "c"), PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "tunedb", "census", "mymodel_s28b:make", "--unit", "tokens",
                          "--max-length", "32", "--max-batch-size", "2", "--out", "-"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["points"] and all(p["signature"].startswith("gemm|") for p in data["points"])
    assert "-> standard output" in out.stderr and not (tmp_path / "-").exists()
