"""Probe, persist and the auto switch: traces kept whole, the decision's round trip with its
provenance, linsys="auto" reading it back, the busy-GPU refusal, the CLI and the worked example."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tunedb import settings
from tunedb.cutoff import fitting as fitmod
from tunedb.cutoff import layout, probing as probemod, solvers, store
from tunedb.errors import BusyGPUError, CutoffError
from bench_modules import bench_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def small_workload(solver, steps=12):
    """A seeded loop: the warm start drifts by a known amount, which is the signal."""
    strip, b = layout.random_system(4, 5, 3, seed=0)
    x = None
    gen = torch.Generator().manual_seed(1)
    for k in range(steps):
        level = 10.0 ** (-8 + (k % 6))
        bk = b + level * torch.randn(b.shape, generator=gen, dtype=b.dtype)
        x = solver(strip, bk, x, signal=level)
        assert float(layout.residual(strip, bk, x).max()) < 1e-6


def test_probe_keeps_every_solve_and_its_signal():
    p = probemod.probe(small_workload, problem="toy", device="cpu", discard=2, tol=1e-9, max_iter=200)
    assert p.timer == "perf_counter" and p.device == "cpu" and p.problem == "toy"
    for pol in ("direct", "iterative"):
        tr = p.traces[pol]
        assert len(tr.times_ms) == 10 and all(t > 0 for t in tr.times_ms)
        assert tr.signals == tuple(10.0 ** (-8 + (k % 6)) for k in range(2, 12))
    assert p.provenance["utc"].endswith("Z") and p.provenance["torch"]
    again = probemod.Probe.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p


class BusyEnv:
    def foreign_pids(self):
        return frozenset({4242})

    def identity(self):
        return {}


def test_probe_refuses_a_busy_gpu_before_running_anything():
    ran = []
    with pytest.raises(BusyGPUError, match="4242"):
        probemod.probe(lambda solver: ran.append(1), problem="toy", device="cuda", env=BusyEnv())
    assert not ran
    with pytest.raises(CutoffError, match="policy 'fastest' not supported"):
        probemod.probe(small_workload, problem="toy", device="cpu", policies=("fastest",))


def make_probe():
    sig = tuple(float(s) for s in range(1, 41))
    return probemod.Probe("mpc|n=4", "cpu", "perf_counter", {
        "iterative": probemod.Trace("iterative", tuple(0.5 * s for s in sig), sig),
        "direct": probemod.Trace("direct", tuple(10.0 for _ in sig), sig)},
        {"utc": "2026-12-01T03:00:00Z", "git_commit": "abc123", "gpu_name": "NVIDIA H200", "torch": "2.11"})


def test_persist_round_trip_with_provenance(tmp_path):
    path = tmp_path / "cfg" / "decisions.json"
    probe = make_probe()
    f = fitmod.fit(probe, statistic="mean")
    d = store.persist(f, probe, path=path)
    other = probemod.Probe("other", "NVIDIA H200", "cuda_events", probe.traces, {"utc": "x"})
    store.persist(fitmod.fit(other, statistic="max"), other, path=path)
    table = store.load(path)
    assert set(table) == {"mpc|n=4@cpu", "other@NVIDIA H200"}
    back = table["mpc|n=4@cpu"]
    assert back == d
    assert back.cutoff == f.cutoff and back.band == f.band and back.statistic == "mean"
    assert back.provenance["git_commit"] == "abc123" and back.provenance["gpu_name"] == "NVIDIA H200"
    assert back.provenance["timer"] == "perf_counter"
    assert fitmod.Fit.from_json(back.fit) == f
    assert [p.name for p in path.parent.iterdir()] == ["decisions.json"]  # no temp file left
    # re-measuring one class replaces its entry only
    store.persist(fitmod.fit(probe, statistic="p99"), probe, path=path)
    table = store.load(path)
    assert table["mpc|n=4@cpu"].statistic == "p99" and table["other@NVIDIA H200"].statistic == "max"


def test_default_path_is_under_the_cache_root_and_lookup_errors(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path)):
        assert store.config_path() == tmp_path / "cutoff" / "decisions.json"
        with pytest.raises(CutoffError, match="no cutoff for problem 'nope' on 'cpu'"):
            store.lookup("nope", "cpu")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(CutoffError, match="not a cutoff decision file"):
        store.load(bad)


def test_auto_switches_per_solve_on_the_signal(tmp_path):
    strip, b = layout.random_system(3, 4, 3, seed=4)
    problem = store.problem_class(strip)
    assert problem == "btd|dt=fp64|n=3|T=4|batch=3"
    probe = probemod.Probe(problem, "cpu", "perf_counter", make_probe().traces)
    f = fitmod.fit(probe, statistic="mean")  # iterative at or under ~20, direct above
    assert 15 < f.cutoff < 25
    x0 = torch.zeros_like(b)
    exact = solvers.direct(strip, b)[0]
    with settings.override(CACHE_DIR=str(tmp_path)):
        store.persist(f, probe)
        # max_iter=0 makes the iterative policy visible: it returns the warm start unchanged
        below = solvers.solve(strip, b, x0, linsys="auto", signal=f.cutoff - 1, max_iter=0)
        above = solvers.solve(strip, b, x0, linsys="auto", signal=f.cutoff + 1, max_iter=0)
        at = solvers.solve(strip, b, x0, linsys="auto", signal=f.cutoff, max_iter=0)
    assert torch.equal(below, x0) and torch.equal(at, x0)
    torch.testing.assert_close(above, exact)
    with pytest.raises(CutoffError, match="no cutoff for problem"):
        solvers.solve(strip, b, linsys="auto", signal=1.0, problem="unknown-class")


def test_cli_probe_persist_fit_show(tmp_path, capsys):
    from tunedb.cli import main

    wl = tmp_path / "wl.py"
    wl.write_text("from tunedb.cutoff import layout\n"
                  "def run(solver):\n"
                  "    strip, b = layout.random_system(2, 3, 2, seed=0)\n"
                  "    x = None\n"
                  "    for k in range(8):\n"
                  "        x = solver(strip, b, x, signal=float(k))\n")
    cfg, traces = tmp_path / "d.json", tmp_path / "t.json"
    rc = main(["cutoff", "probe", "--workload", f"{wl}:run", "--problem", "toy", "--device", "cpu",
               "--out", str(traces), "--persist", "--config", str(cfg), "--stat", "mean"])
    assert rc == 0
    assert "toy on cpu: mean cutoff" in capsys.readouterr().out
    assert store.load(cfg)["toy@cpu"].statistic == "mean"
    assert main(["cutoff", "fit", str(traces), "--stat", "max", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fit"]["statistic"] == "max"
    assert main(["cutoff", "show", "--config", str(cfg)]) == 0
    assert "toy@cpu: cutoff" in capsys.readouterr().out
    assert main(["cutoff", "probe", "--workload", "nomodule", "--problem", "x"]) == 2


def test_worked_example_flow_on_cpu(tmp_path):
    cutoff_mpc = bench_module("cutoff_mpc")
    out = tmp_path / "mpc.json"
    rc = cutoff_mpc.main(["--device", "cpu", "--quick", "--steps", "30", "--out", str(out),
                          "--config", str(tmp_path / "decisions.json")])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["rows"]) == {"direct", "iterative", "auto", "direct(torch.linalg)"}
    assert set(doc["goals"]) >= {"auto_within_2pct_mean", "second_cutoff_in_first_band"}
    assert doc["probes"]["first"]["traces"]["direct"]["times_ms"]
    assert Path(doc["png"]).stat().st_size > 1000
    assert store.load(tmp_path / "decisions.json")  # persisted and read back by the auto run


def test_an_open_band_persists_and_switches(tmp_path):
    """One policy everywhere (the band open below): the decision round-trips (the infinite end
    included) and auto serves the winning policy on every observed signal."""
    path = tmp_path / "decisions.json"
    sig = tuple(float(s) for s in range(1, 41))
    probe = probemod.Probe("mpc|n=4", "cpu", "perf_counter", {
        "direct": probemod.Trace("direct", tuple(1.0 for _ in sig), sig),
        "iterative": probemod.Trace("iterative", tuple(3.0 for _ in sig), sig)}, {"utc": "x"})
    f = fitmod.fit(probe, statistic="max")
    assert f.band[0] == float("-inf")
    store.persist(f, probe, path=path)
    back = store.load(path)["mpc|n=4@cpu"]
    assert back.band == f.band and back.cutoff == f.cutoff
    assert {back.policy_for(s) for s in sig} == {"direct"}


def test_worked_example_comparison_run_solves_every_step_by_every_policy():
    """The example's comparison run: each step's system is solved by every policy (same inputs,
    same signal), the order rotates per step, and the loop goes on from the followed policy."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cutoff_mpc
    finally:
        sys.path.remove(str(ROOT / "bench"))
    d = store.Decision("p", "cpu", 1e-5)  # small_workload's signals run 1e-8..1e-3: both policies
    seen, outs = [], {}

    class Spy(probemod.Recorder):
        def __call__(self, strip, b, x0=None, *, signal):
            seen.append(self.policy)
            outs[self.policy] = super().__call__(strip, b, x0, signal=signal)
            return outs[self.policy]

    recs = [Spy(p, "cpu", d if p == "auto" else None, tol=1e-9, max_iter=50) for p in ("direct", "iterative", "auto")]
    run = cutoff_mpc.Interleaved(recs, "auto", cuda=False)
    strip, b = layout.random_system(4, 5, 3, seed=0)
    assert run(strip, b, None, signal=1.0) is outs["auto"]
    small_workload(run, steps=6)
    assert seen[:3] == ["direct", "iterative", "auto"] and seen[3:6] == ["iterative", "auto", "direct"]
    traces = {r.policy: r.trace() for r in recs}
    assert all(len(t.times_ms) == 7 for t in traces.values())
    assert traces["direct"].signals == traces["iterative"].signals == traces["auto"].signals


def test_cli_a_failing_workload_and_a_trace_file_of_the_wrong_shape_are_one_line(tmp_path, capsys):
    """The user's workload raising, and `cutoff fit` of JSON that is no probe file (a list, a
    number where the traces go): one error line naming the file or the policy, never a traceback
    (session 33's CLI audit)."""
    from tunedb.cli import main

    wl = tmp_path / "boom.py"
    wl.write_text("def run(solver):\n    raise RuntimeError('boom in user code')\n")
    assert main(["cutoff", "probe", "--workload", f"{wl}:run", "--problem", "toy", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "the workload failed under policy" in err and "boom in user code" in err and "Traceback" not in err
    for i, text in enumerate(("[1, 2, 3]", "null", '{"problem": "x", "device": "cpu", "traces": 5}')):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(text)
        assert main(["cutoff", "fit", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "probe file" in err and "Traceback" not in err and err.count("\n") == 1, err


def test_probe_on_a_machine_without_cuda_or_a_bad_device_says_so(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CutoffError, match="device='cuda': no CUDA GPU here"):
        probemod.probe(small_workload, problem="toy", device="cuda")
    with pytest.raises(CutoffError, match="device='bogus' is not a torch device"):
        probemod.probe(small_workload, problem="toy", device="bogus")


def _decision_file(path, decisions, version=1):
    path.write_text(json.dumps({"format": "tunedb-cutoff-decisions", "version": version, "decisions": decisions}))
    return path


@pytest.mark.parametrize("decisions,message", [
    ([], "'decisions' must be an object"),
    ({"a": 5}, "malformed decision 5: a JSON object expected"),
    ({"a": [1, 2]}, "malformed decision \\[1, 2\\]"),
])
def test_a_decision_file_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, decisions, message):
    path = _decision_file(tmp_path / "d.json", decisions)
    with pytest.raises(CutoffError, match=message):
        store.load(path)


@pytest.mark.parametrize("field,value,message", [
    ("below", "bogus", "below='bogus'; allowed: direct, iterative"),
    ("statistic", "weird", "statistic='weird'; allowed: mean, p99, max"),
    ("tolerance", -5, "tolerance=-5.0"),
    ("provenance", [1], "malformed decision"),
])
def test_a_decision_value_no_fit_writes_is_named_at_load(tmp_path, field, value, message):
    probe = make_probe()
    good = tmp_path / "good.json"
    store.persist(fitmod.fit(probe, statistic="mean"), probe, path=good)
    doc = json.loads(good.read_text())
    doc["decisions"]["mpc|n=4@cpu"][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(CutoffError, match=message):
        store.load(bad)


def test_a_newer_decision_file_is_refused_and_never_rewritten(tmp_path):
    path = _decision_file(tmp_path / "d.json", {}, version=2)
    before = path.read_bytes()
    with pytest.raises(CutoffError, match="version 2; this tunedb reads version 1"):
        store.load(path)
    probe = make_probe()
    with pytest.raises(CutoffError, match="version 2"):
        store.persist(fitmod.fit(probe, statistic="mean"), probe, path=path)
    assert path.read_bytes() == before


def test_a_decision_file_repeating_a_key_is_refused(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"format": "tunedb-cutoff-decisions", "version": 1, "decisions": {}, "decisions": {}}')
    with pytest.raises(CutoffError, match="duplicate key 'decisions'"):
        store.load(path)


@pytest.mark.parametrize("flags, says", [(["--tol", "nan"], "tolerance must be a number in"),
                                         (["--policies", "direct"], "add 'iterative'")])
def test_cli_probe_refuses_what_its_fit_would_refuse_before_probing(tmp_path, capsys, flags, says):
    # the workload would fail if it ran: the refusal must come first (a probe may take minutes)
    from tunedb.cli import main

    wl = tmp_path / "wl.py"
    wl.write_text("def run(solver):\n    raise AssertionError('probed')\n")
    assert main(["cutoff", "probe", "--workload", f"{wl}:run", "--problem", "toy", "--device", "cpu", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "probed" not in err
