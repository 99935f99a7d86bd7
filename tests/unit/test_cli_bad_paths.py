"""Command-line inputs that named something unusable printed a Python traceback: `tunedb linalg
plot --out grid.txt` (matplotlib's ValueError) and `tunedb cutoff probe --workload nosuch:fn`
(ModuleNotFoundError). Each is now the CLI's one-line error (exit status 2) naming the value."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunedb.commands import cutoff as cutoff_cmd
from tunedb.errors import CutoffError

ROOT = Path(__file__).resolve().parents[2]


def _cli(home: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(home), "TUNEDB_USER_DB": "off",
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "tunedb", *argv], capture_output=True, text=True, timeout=300, env=env)


def test_linalg_plot_to_an_unknown_format_says_which_are_written(tmp_path):
    got = _cli(tmp_path, "linalg", "plot", "--out", str(tmp_path / "grid.txt"))
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert "grid.txt" in got.stderr and ".png, .pdf, .svg" in got.stderr
    assert not (tmp_path / "grid.txt").exists()


def test_a_workload_module_that_does_not_exist_is_named():
    with pytest.raises(CutoffError, match="no module named 'nosuch_tunedb_mod'"):
        cutoff_cmd.load_workload("nosuch_tunedb_mod:fn")
    with pytest.raises(CutoffError, match="no module named 'tunedb.nosuch'"):
        cutoff_cmd.load_workload("tunedb.nosuch:fn")
    with pytest.raises(CutoffError, match="has no callable 'nosuch'"):
        cutoff_cmd.load_workload("tunedb.errors:nosuch")


def test_a_workloads_own_failing_import_keeps_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "wl_broken_import.py").write_text("import nosuch_dependency_xyz\n\ndef fn(solver):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="nosuch_dependency_xyz"):
        cutoff_cmd.load_workload("wl_broken_import:fn")


@pytest.mark.parametrize("suffix, magic", [("svg", b"<?xml"), ("pdf", b"%PDF"), ("png", b"\x89PNG")])
def test_a_figure_is_written_in_the_format_its_suffix_names(tmp_path, suffix, magic):
    """They were PNG bytes whatever the suffix."""
    out = tmp_path / f"grid.{suffix}"
    got = _cli(tmp_path, "linalg", "plot", "--out", str(out))
    assert got.returncode == 0, got.stderr
    assert out.read_bytes().startswith(magic)


def test_a_closed_stdout_is_not_a_traceback(tmp_path):
    """`tunedb diff A A >&-` raised AttributeError at its flush and exited 1 ("the files differ")."""
    gemm = str(ROOT / "src" / "tunedb" / "db" / "sm90" / "gemm.json")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TUNEDB_USER_DB": "off",
           "CUDA_VISIBLE_DEVICES": ""}
    got = subprocess.run([sys.executable, "-m", "tunedb", "diff", gemm, gemm], stdout=None, stderr=subprocess.PIPE,
                         text=True, timeout=300, env=env, close_fds=True, preexec_fn=lambda: __import__("os").close(1))
    assert got.returncode == 0 and "Traceback" not in got.stderr
