"""`tunedb diff` of two families' tables: the family line, not a cost model dumped whole (a gemm
table against the linalg one printed a 31,782-character 'model refit' line)."""
import subprocess
import sys
from pathlib import Path

import tunedb

DB = Path(tunedb.__file__).parent / "db" / "sm90"


def test_tables_of_two_families_differ_by_family_alone():
    out = subprocess.run([sys.executable, "-m", "tunedb", "diff", str(DB / "gemm.json"), str(DB / "linalg.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stdout.strip().splitlines() == ["~ file: kernel_family gemm -> linalg"]
