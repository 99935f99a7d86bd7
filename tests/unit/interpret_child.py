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


def snippet(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """In the test: run `code` (python -c) under TRITON_INTERPRET=1 with src/ and this folder
    importable; the finished process (the caller checks its return code and output)."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(os.path.dirname(here)), "src")
    path = os.pathsep.join([src, here] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path))


def gate_failures(family, sig, m: int, config_ids) -> dict:
    """In the child: the measuring protocol's gate (NaN poison, second poison, tolerance) over
    `config_ids` at (sig, M), timed eagerly once; {config: (status, detail)} of those it failed."""
    from tunedb.measure import protocol
    from tunedb.measure.arms import problem_for
    from tunedb.measure.eager import EagerTimer

    problem = problem_for(family, sig, m, list(config_ids))
    got = protocol.measure_problem(problem, timer=EagerTimer(calls=1), seed=0)
    return {r.config_id: (r.status, r.detail) for r in got if not r.status.ok}
