"""Triton kernels checked under the interpreter on the CPU. TRITON_INTERPRET must be set before
triton is imported, so a test runs its own file as a child process (`failures(__file__)`) whose
checks end with `report(failures)`: the child's list of failed checks, [] when all passed."""
import json
import os
import subprocess
import sys

MARK = "RESULT "


def report(failures: list) -> None:
    """In the child: hand the failed checks to the parent."""
    print(MARK + json.dumps(failures))


def failures(script: str, *args: str, timeout: float = 900, **env: str) -> list:
    """In the test: run `script` with `args` under TRITON_INTERPRET=1 (plus `env`); the child
    must exit 0 and report; its failed checks."""
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TRITON_INTERPRET="1", **env))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len(MARK):])
