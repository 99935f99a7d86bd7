"""Linear-algebra and cutoff inputs no test named before (session 56 probe): vmap with a second
operand whose batch shape differs from A's, an empty batch's Cholesky factor layout, numpy scalars
as fit arguments, a bool as a switching signal, non-numbers in a trace, and an unknown policy
named before a missing one."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tunedb import cutoff
from tunedb.cutoff import fitting, probing, store
from tunedb.errors import CutoffError, SignatureError
from tunedb.families.linalg import ops as la


def _spd(*batch: int, n: int = 4) -> torch.Tensor:
    g = torch.randn(*batch, n, n, dtype=torch.float64)
    return g @ g.mT + n * torch.eye(n, dtype=torch.float64)


def test_vmap_names_a_batch_mismatch_as_an_eager_call_does():
    a, b = _spd(6, 3), torch.ones(4, dtype=torch.float64)
    with pytest.raises(SignatureError) as eager:
        la.posv(a[0], b)
    with pytest.raises(SignatureError) as mapped:
        torch.vmap(la.posv, in_dims=(0, None))(a, b)
    for info in (eager, mapped):
        assert "batch shape [] (shape [4]) differs from the first's [3]" in str(info.value)
        assert "the entry points" not in str(info.value)


def test_vmap_over_matching_operands_solves():
    a, b = _spd(6, 3), torch.randn(6, 3, 4, dtype=torch.float64)
    x, info = torch.vmap(la.posv)(a, b)
    assert torch.allclose(x, torch.linalg.solve(a, b), atol=1e-10) and not info.any()
    x2, _ = torch.vmap(la.posv, in_dims=(0, None))(a, b[0])
    assert torch.allclose(x2, torch.linalg.solve(a, b[0].expand(6, 3, 4)), atol=1e-10)


@pytest.mark.parametrize("shape", [(0, 4, 4), (0, 2, 4, 4), (2, 0, 4, 4), (0, 200, 200)])
def test_an_empty_batch_gets_a_row_major_factor(shape):
    a = torch.eye(shape[-1], dtype=torch.float64).expand(*shape)
    low, info = la.potrf(a)
    assert low.shape == shape and low.stride() == torch.empty(shape).stride()
    assert info.shape == shape[:-2]


def test_an_empty_batch_wanting_gradients_keeps_them_and_the_layout():
    a = torch.zeros(0, 4, 4, dtype=torch.float64, requires_grad=True)
    low, _ = la.potrf(a)
    assert low.stride() == (16, 4, 1) and low.requires_grad
    low.sum().backward()
    assert a.grad.shape == (0, 4, 4)


def test_fit_arguments_take_numpy_scalars():
    fitting.check_arguments(tolerance=np.float32(0.02), k=np.int64(5))
    with pytest.raises(CutoffError, match=r"tolerance must be a number in \[0, 1\); got np.float64\(1.5\)"):
        fitting.check_arguments(tolerance=np.float64(1.5))
    with pytest.raises(CutoffError, match="k must be an integer >= 1"):
        fitting.check_arguments(k=np.float64(5.0))


def test_fit_with_numpy_scalars_equals_the_fit_with_python_numbers():
    sig = tuple(float(s) for s in np.linspace(1e-6, 1e-3, 40))
    traces = {"direct": probing.Trace("direct", tuple(1.0 for _ in sig), sig),
              "iterative": probing.Trace("iterative", tuple(0.2 + 2000.0 * s for s in sig), sig)}
    want = fitting.fit(traces, statistic="mean", tolerance=0.02, k=3)
    got = fitting.fit(traces, statistic="mean", tolerance=np.float32(0.02), k=np.int64(3))
    assert got.cutoff == pytest.approx(want.cutoff) and type(got.tolerance) is float


@pytest.mark.parametrize("signal", [True, False, np.bool_(True)])
def test_a_bool_is_no_switching_signal(signal):
    strip = torch.zeros(1)  # refused before the strip is read
    with pytest.raises(CutoffError, match=r"signal=.* must be a number"):
        cutoff.solve(strip, torch.zeros(1), linsys="auto", signal=signal,
                     decision=store.Decision("p", "cpu", 0.5))


@pytest.mark.parametrize("times, signals, named", [(("1.0",), (0.1,), "time '1.0' (str) is not a number"),
                                                    ((1.0,), (True,), "signal True (bool) is not a number"),
                                                    ((None,), (0.1,), "time None (NoneType) is not a number")])
def test_a_trace_of_non_numbers_is_named(times, signals, named):
    with pytest.raises(CutoffError, match=named.replace("(", r"\(").replace(")", r"\)")):
        probing.Trace("direct", times, signals)


def test_a_probe_file_holding_a_string_time_names_it(tmp_path):
    good = probing.Trace("direct", (1.0, 2.0), (0.1, 0.2)).to_json()
    bad = dict(good, policy="iterative", times_ms=[1.0, "fast"])
    doc = {"format": probing.FORMAT, "version": 1, "problem": "toy", "device": "cpu", "timer": "perf_counter",
           "traces": {"direct": good, "iterative": bad}, "provenance": {}, "foreign_pids": []}
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CutoffError, match=r"time 'fast' \(str\) is not a number"):
        probing.Probe.load(path)


def test_cli_probe_names_an_unknown_policy_first(tmp_path, capsys):
    from tunedb.cli import main

    wl = tmp_path / "wl.py"
    wl.write_text("def run(solver):\n    raise AssertionError('probed')\n")
    argv = ["cutoff", "probe", "--workload", f"{wl}:run", "--problem", "toy", "--device", "cpu",
            "--policies", "direct,foo"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'foo' not supported; allowed: direct, iterative, auto" in err and "probed" not in err


def test_a_probe_refuses_a_bool_signal():
    def workload(solver):
        strip = torch.zeros(1, 4, 2, 6, dtype=torch.float64)
        strip[..., 2:4] = torch.eye(2, dtype=torch.float64) * 4
        b = torch.ones(1, 4, 2, dtype=torch.float64)
        for k in range(4):
            solver(strip, b, None, signal=(k % 2 == 0))

    with pytest.raises(CutoffError, match=r"signal=True must be a number .* not a bool"):
        probing.probe(workload, problem="toy", device="cpu", discard=0)


def test_prebuild_reads_a_referenced_table_from_standard_input_once(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import tunedb

    table = Path(tunedb.__file__).parent / "db" / "sm90" / "gemm.json"
    argv = [sys.executable, "-m", "tunedb", "prebuild", "--referenced", "-", "--arch", "sm100", "--dry-run"]
    done = subprocess.run(argv, input=table.read_text(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-800:]
    assert "--dry-run: nothing was compiled" in done.stdout
