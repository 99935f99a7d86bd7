"""The one-command retune under a fake timer: a pure-noise re-run regenerates the same table,
a busy GPU is refused, a foreign process invalidates its leg, --dry-run writes nothing, the
file carries provenance and correctness fingerprints; and the CLI's smoke paths."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb.database import schema
from tunedb.errors import BusyGPUError, TunedbError
from tunedb.families.linalg import cli, configs, ladder
from tunedb.families.linalg.ladder import Cell

ROOT = Path(__file__).resolve().parents[2]


def cost(cell: Cell, arm: str) -> float:
    """True ns per problem: packings separated by far more than the tie band, and configs of
    one packing within 1.1% of each other (the band keeps the simplest: fewest warps, then
    fewest problems per program)."""
    if arm == "torch":
        return 60.0 * cell.n
    if arm == configs.EAGER_ONLY:
        return 200.0 * cell.n
    packing, per, warps = configs.shape_of(configs.parse(arm))
    if packing in ("lane", "reg", "rows", "panel", "pdot", "pdottf"):  # slower than the others here
        return {"lane": 30.0, "reg": 32.0, "rows": 34.0, "panel": 36.0, "pdot": 38.0, "pdottf": 40.0}[packing] * cell.n * (1 + 0.001 * warps + 0.00001 * per)
    order = {"thread": 0, "warp": 1, "block": 2}[packing]
    if cell.n >= 32:
        order = 2 - order  # larger problems favour the wider packings
    return (10.0 + 5.0 * order) * cell.n * (1 + 0.001 * warps + 0.00001 * per)


def _args(out: Path, **kw) -> argparse.Namespace:
    base = dict(prebuild=False, quick=True, legs=None, ops=None, dtypes=None, margin=None, rounds=9,
                max_arms=12, build_jobs=None, dry_run=False, out=str(out), seed=0, n=None)
    base.update(kw)
    return argparse.Namespace(**base)


def _regions(path: Path) -> dict[str, list]:
    db = schema.load(path)
    return {sig.format(): [r.to_json() for r in e.regions] for sig, e in db.entries.items()}


def test_a_pure_noise_rerun_regenerates_the_same_table(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert cli.tune(_args(a), timer=ladder.FakeTimer(cost, noise=0.004, seed=1), arch_family="sm90") == 0
    assert cli.tune(_args(b), timer=ladder.FakeTimer(cost, noise=0.004, seed=2), arch_family="sm90") == 0
    first, second = _regions(a), _regions(b)
    assert first == second and len(first) == 6 * 4  # quick: six ops, fp32, n in 4..32, batch 4096
    # the band keeps the simplest packing and, within it, the configs' own order decides nothing
    # random: at n=4 the thread packing wins
    assert first["linalg|op=potrf|dt=fp32|n=4"][0][1].startswith("thread_")
    assert first["linalg|op=potrf|dt=fp32|n=32"][0][1].startswith("block_")


def test_the_table_carries_provenance_fingerprints_and_the_rule(tmp_path):
    out = tmp_path / "t.json"
    cli.tune(_args(out, legs="solver"), timer=ladder.FakeTimer(cost, seed=1), arch_family="sm90")
    raw = json.loads(out.read_text())
    record = raw["model"]["tune"]
    assert {"utc_start", "git_commit", "git_dirty", "gpu_name", "torch", "triton"} <= set(record["provenance"])
    assert record["rule"]["tie_band"] == 0.02 and record["rule"]["dep_margin"] == 0.05
    assert len(record["legs"]["solver"]["fingerprint"]) == 16
    point = raw["entries"]["linalg|op=potrf|dt=fp32|n=8"]["evidence"]["M=4096"]
    assert point["_inputs"] == "ring" and point["torch"][2] == 9 and configs.EAGER_ONLY in point
    assert raw["validators"]["impl_hash"]


def test_the_eager_only_arm_is_measured_but_never_served(tmp_path):
    def eager_wins(cell: Cell, arm: str) -> float:
        return 1.0 if arm == configs.EAGER_ONLY else cost(cell, arm)
    out = tmp_path / "t.json"
    cli.tune(_args(out, legs="solver"), timer=ladder.FakeTimer(eager_wins, seed=1), arch_family="sm90")
    assert all(cid != configs.EAGER_ONLY for regions in _regions(out).values() for _hi, cid in regions)


def test_an_arm_failing_the_gate_never_wins(tmp_path):
    out = tmp_path / "t.json"
    cli.tune(_args(out, ops="dot", legs="ladder"), timer=ladder.FakeTimer(cost, seed=1), arch_family="sm90")
    best = {cid for regions in _regions(out).values() for _hi, cid in regions}
    out2 = tmp_path / "t2.json"
    cli.tune(_args(out2, ops="dot", legs="ladder"), timer=ladder.FakeTimer(cost, seed=1, failing=frozenset(best)),
             arch_family="sm90")
    after = {cid for regions in _regions(out2).values() for _hi, cid in regions}
    assert not (after & best)
    raw = json.loads(out2.read_text())
    statuses = [p[a] for e in raw["entries"].values() for p in e["evidence"].values() for a in best if a in p]
    assert statuses and set(statuses) == {"incorrect"}


def test_a_busy_gpu_is_refused(tmp_path):
    timer = ladder.FakeTimer(cost, intruder_after=-1)
    with pytest.raises(BusyGPUError, match="busy"):
        cli.tune(_args(tmp_path / "t.json"), timer=timer, arch_family="sm90")
    assert not (tmp_path / "t.json").exists()


def test_a_foreign_process_invalidates_its_leg_and_keeps_the_old_entries(tmp_path, capsys):
    out = tmp_path / "t.json"
    cli.tune(_args(out), timer=ladder.FakeTimer(cost, seed=1), arch_family="sm90")
    before = _regions(out)
    # the solver leg runs second; a process appears in it after a few samples
    timer = ladder.FakeTimer(lambda c, a: cost(c, a) * (3.0 if a == "torch" else 1.0), seed=3,
                             intruder_after=12 * 9 + 5)
    timer_ok = timer.foreign_pids()  # quiet at the start
    assert not timer_ok
    cli.tune(_args(out), timer=timer, arch_family="sm90")
    err = capsys.readouterr().err
    assert "leg solver invalid" in err or "leg ladder invalid" in err
    raw = json.loads(out.read_text())
    invalid = [leg for leg, rec in raw["model"]["tune"]["legs"].items() if "invalid" in rec]
    assert invalid
    after = _regions(out)
    for sig, regions in before.items():
        if sig.split("|")[1][3:] in ladder.LEGS[invalid[0]]:
            assert after[sig] == regions  # the invalid leg's entries are the old ones


def test_dry_run_diffs_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "t.json"
    cli.tune(_args(out, legs="ladder", ops="dot"), timer=ladder.FakeTimer(cost, seed=1), arch_family="sm90")
    text = out.read_text()
    capsys.readouterr()
    slower = lambda c, a: cost(c, a) * (0.3 if a.startswith("block_") else 1.0)  # noqa: E731
    cli.tune(_args(out, legs="ladder", ops="dot", dry_run=True), timer=ladder.FakeTimer(slower, seed=1),
             arch_family="sm90")
    printed = capsys.readouterr().out
    assert "dry run: nothing written" in printed and "~ linalg|op=dot" in printed
    assert "beyond the 2% band" in printed and "inside" not in printed
    assert out.read_text() == text


def test_a_margin_and_legs_are_checked():
    with pytest.raises(TunedbError, match="solvers"):
        ladder.parse_legs("ladder,solvers")
    with pytest.raises(TunedbError, match="--margin 2.0"):
        cli.tune(_args(Path("/nonexistent/x.json"), margin=2.0), timer=ladder.FakeTimer(cost), arch_family="sm90")


def test_fewer_than_nine_rounds_are_refused():
    with pytest.raises(TunedbError, match="9 paired rounds"):
        ladder.measure_cell(ladder.FakeTimer(cost), Cell("dot", "fp32", 4, 256), ["torch"], rounds=5)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "TUNEDB_USER_DB": "off", "PATH": "/usr/bin:/bin",
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "tunedb", "linalg", *argv], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_recommend_prints_the_plan_and_why():
    got = _cli("recommend", "potrf", "fp32", "8", "4096", "--json")
    assert got.returncode == 0, got.stderr
    plan = json.loads(got.stdout)
    assert plan["op"] == "potrf" and plan["source"] in ("measured", "heuristic") and plan["reason"]
    bad = _cli("recommend", "potrf", "fp16", "8", "4096")
    assert bad.returncode == 2 and "fp16" in bad.stderr and "allowed" in bad.stderr


def test_cli_plot_writes_a_png(tmp_path):
    got = _cli("plot", "--out", str(tmp_path / "grid.png"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    assert "216 cells" in got.stdout


def test_cli_tune_without_a_gpu_says_so():
    got = _cli("tune", "--quick", "--dry-run", "--out", "/nonexistent/linalg.json")
    assert got.returncode == 2 and "needs a CUDA GPU" in got.stderr


def test_the_ring_hands_every_timed_launch_a_fresh_valid_system():
    """A solver that overwrites its input (potrf in place) consumes its working set; restoring
    the ring between passes means the next pass factors the original systems again, never its
    own output, and the pristine sets are never touched."""
    import torch

    from tunedb.families.linalg import launch, problems, signatures

    sig = signatures.make_signature("potrf", "fp64", 6)
    ring = ladder.Ring(lambda k: problems.make_inputs(sig, 4, "cpu", k)[0], 3)
    originals = [args[0].clone() for args in ring.pristine]
    assert not torch.equal(originals[0], originals[1])  # distinct systems per slot
    for _pass in range(2):
        ring.restore()
        for k, (a,) in enumerate(ring.working):
            assert torch.equal(a, originals[k])  # fresh: what the launch sees is the original
            launch.launch("potrf", "torch", a, inplace=True)  # consumes it
            assert not torch.equal(a, originals[k])
    assert all(torch.equal(p[0], o) for p, o in zip(ring.pristine, originals))
    with pytest.raises(ValueError, match="ring size"):
        ladder.Ring(lambda k: (), 0)


def test_allow_busy_measures_and_marks_the_legs_contended(tmp_path):
    out = tmp_path / "t.json"
    cli.tune(_args(out, legs="solver", ops="potrf", allow_busy=True), timer=ladder.FakeTimer(cost, intruder_after=-1),
             arch_family="sm90")
    record = json.loads(out.read_text())["model"]["tune"]["legs"]["solver"]
    assert record["contended_by"] == [4242] and record["cells"] == 4


def test_a_partial_run_keeps_the_cells_it_did_not_measure(tmp_path, monkeypatch):
    out = tmp_path / "t.json"
    monkeypatch.setattr(ladder, "QUICK_BATCH", (256, 4096, 65536))
    cli.tune(_args(out, legs="solver", ops="potrf"), timer=ladder.FakeTimer(cost, seed=1), arch_family="sm90")
    full = json.loads(out.read_text())["entries"]["linalg|op=potrf|dt=fp32|n=8"]
    monkeypatch.setattr(ladder, "QUICK_BATCH", (4096,))
    # only batch 4096 again, where block now wins by far: the other batches keep their cells
    faster = lambda c, a: cost(c, a) * (0.2 if a.startswith("block_") else 1.0)  # noqa: E731
    cli.tune(_args(out, legs="solver", ops="potrf"), timer=ladder.FakeTimer(faster, seed=2), arch_family="sm90")
    entry = json.loads(out.read_text())["entries"]["linalg|op=potrf|dt=fp32|n=8"]
    assert set(entry["evidence"]) == {"M=256", "M=4096", "M=65536"}
    assert entry["evidence"]["M=256"] == full["evidence"]["M=256"]
    winners = {hi: cid for hi, cid in entry["regions"]}
    assert winners[256] == full["regions"][0][1] and winners[4096].startswith("block_")


def test_a_potrf_only_rerun_over_the_shipped_table_keeps_every_other_cell(tmp_path):
    # The re-measure of the potrf cells alone (--ops potrf --base <shipped table>) must leave
    # every other entry of the shipped table as it was and replace every potrf cell.
    shipped = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db" / "sm90" / "linalg.json"
    out = tmp_path / "linalg.json"
    cli.tune(_args(out, quick=False, legs="solver", ops="potrf", max_arms=4, base=str(shipped)),
             timer=ladder.FakeTimer(cost, seed=3), arch_family="sm90")
    before = json.loads(shipped.read_text())["entries"]
    after = json.loads(out.read_text())["entries"]
    assert set(after) == set(before)
    for key, entry in before.items():
        if "|op=potrf|" not in key:
            assert after[key] == entry, key
    potrf = [k for k in after if "|op=potrf|" in k]
    assert len(potrf) == len(ladder.GRID_N) * len(ladder.GRID_DTYPES)
    for key in potrf:
        assert set(after[key]["evidence"]) == {f"M={b}" for b in ladder.GRID_BATCH}
        assert any(cid != "torch" for _hi, cid in after[key]["regions"])  # the fake cost: Triton wins


def test_an_n_narrowed_rerun_replaces_only_those_cells_and_times_the_lane_arms(tmp_path):
    # The s13 retune: potrf and posv at n <= 32 only (--ops potrf,posv --n 4,8,16,32 over the
    # shipped table): the n >= 64 entries and the other ops stay as shipped; each new cell timed
    # the lane packing beside the older ones (the capped prior keeps lane configs first).
    shipped = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db" / "sm90" / "linalg.json"
    out = tmp_path / "linalg.json"
    cli.tune(_args(out, quick=False, legs="solver", ops="potrf,posv", n="4,8,16,32", max_arms=8,
                   base=str(shipped)), timer=ladder.FakeTimer(cost, seed=5), arch_family="sm90")
    before = json.loads(shipped.read_text())["entries"]
    after = json.loads(out.read_text())["entries"]
    assert set(after) == set(before)
    redone = {k for k in after if ("|op=potrf|" in k or "|op=posv|" in k)
              and int(k.rsplit("n=", 1)[1]) <= 32}
    assert len(redone) == 2 * 4 * 2
    for key, entry in before.items():
        if key not in redone:
            assert after[key] == entry, key
    for key in redone:
        timed = {a for ev in after[key]["evidence"].values() for a in ev if not a.startswith("_")}
        assert any(a.startswith("lane_") for a in timed), key
        assert any(a.startswith(("warp_", "block_")) for a in timed), key
        # the reg packing (session 14) too, wherever it runs (n <= 8 in either dtype here)
        assert any(a.startswith("reg_") for a in timed) == (int(key.rsplit("n=", 1)[1]) <= 16
                                                            and ("fp32" in key or int(key.rsplit("n=", 1)[1]) <= 12)), key
    with pytest.raises(TunedbError, match="n"):
        cli.tune(_args(out, quick=False, legs="solver", n="5"), timer=ladder.FakeTimer(cost), arch_family="sm90")
