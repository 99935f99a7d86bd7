"""Shipped (system-tier) group_gemm and bmm tables are served at run time, on the CPU.

Each table here is built by the pipeline with the simulated timer into a temporary directory and
put in place of the package's system tier (never shipped): optimize()'s swapped MoE experts and
the bmm op's resolution must then answer from the system tier, under the keys a census of the
same model records. Also: `tunedb build --tie-band`, the plan bench/prewarm.py warms (the
build's own), and bench/moe_exhaustive.py's table and regret bookkeeping on made-up times."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tunedb import database, families, pipeline, settings
from tunedb.arch import shipped_profile
from tunedb.build.steps import simulated_timer
from tunedb.records import Point, ShapeSet, Signature
from tunedb.runtime import dispatch, selector
from bench_modules import bench_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SM90 = shipped_profile("sm90")


_bench = bench_module


def _system_table(family: str, shapes: ShapeSet, root: Path) -> Path:
    """A simulated build of `shapes` written where a system tier's root holds it."""
    fam = families.get(family)
    pipeline.build([("t", shapes)], pipeline.BuildOptions(out=str(root), family=family, isolate=False, fill=False),
                   timer=simulated_timer(fam, SM90, seed=0, noise=0.01))
    path = root / "sm90" / f"{family}.json"
    assert path.exists()
    return path


def _mixtral_model():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                     num_hidden_layers=1, vocab_size=64, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    from tunedb.families.group_gemm import moe

    if not moe.find_experts(model):
        pytest.skip("no stacked experts in this transformers")
    return model


def test_a_system_group_gemm_table_serves_the_swapped_experts(tmp_path):
    """census(model) -> table in the system tier -> optimize(model): both expert GEMMs of every
    layer resolve from the system tier (the run-time keys are the census's keys)."""
    from tunedb.families.group_gemm import moe

    model = _mixtral_model()
    shapes = moe.census(model, [3, 40])
    path = _system_table("group_gemm", shapes, tmp_path)
    db = database.load(path, "group_gemm", "sm90")
    assert set(db.entries) == set(shapes.signatures()) and len(db.entries) == 2
    ids = torch.randint(0, 64, (1, 3))
    try:
        with settings.override(USER_DB="off"), database.system_root_override(tmp_path):
            selector.configure("sm90")
            for sig in shapes.signatures():
                assert selector.peek("group_gemm", sig, 3).tier == "system"
            with torch.no_grad():
                before = model(ids).logits.float()
                families.get("group_gemm").optimize(model)
                seen = selector.counters().get("group_gemm", {}).get("signatures", {})  # earlier tests' calls
                after = model(ids).logits.float()
            counts = selector.counters()["group_gemm"]["signatures"]
            for sig in shapes.signatures():
                old = seen.get(sig.format(), {})
                new = {t: n - old.get(t, 0) for t, n in counts[sig.format()].items()}
                assert new["system"] >= 1 and new.get("default", 0) == 0, (old, counts)
        assert float((after - before).norm() / before.norm()) < 2e-2
    finally:
        selector.configure()
        dispatch.clear()


def test_a_system_bmm_table_is_served_by_optimize_and_the_op(tmp_path, monkeypatch):
    """A bmm table in the system tier: optimize() installs the product mode (it does so only where
    a table has entries) and the op's resolution of a run-time bf16 call with the census's
    shapes and layout answers from the system tier's `half` entry."""
    from tunedb.families.bmm import ops, serving

    scores = Signature.make("bmm", "bmm", "half", B=8, N=1500, K=64, lay="nt")
    path = _system_table("bmm", ShapeSet((Point(scores, 1500, weight=1.0, calls=6),), "attn"), tmp_path)
    want = database.load(path, "bmm", "sm90").entries[scores].lookup(1500)
    q = torch.randn(8, 1500, 64, dtype=torch.bfloat16)
    k = torch.randn(8, 1500, 64, dtype=torch.bfloat16)
    try:
        with settings.override(USER_DB="off"), database.system_root_override(tmp_path):
            selector.configure("sm90")
            database.reload()
            assert serving.has_table()
            monkeypatch.setattr(serving, "can_serve", lambda: True)  # as on a GPU
            from eager_attention import Attention  # tests/unit: attention written as matmuls

            model = families.get("bmm").optimize(Attention())
            assert getattr(model, "_tunedb_bmm_serving", False)
            bound = ops.bound_for(q, k.transpose(1, 2))
            assert bound.tier == "system" and bound.signature.get("lay") == "nt"
            assert bound.config.id == ("torch" if want == "default" else want)
        with settings.override(USER_DB="off"), database.system_root_override(tmp_path / "none"):
            selector.configure("sm90")
            database.reload()
            assert not serving.has_table()  # no table: the mode is not installed
    finally:
        selector.configure()
        database.reload()
        ops._clear()
        dispatch.clear()


def test_build_takes_a_tie_band_and_refuses_a_bad_one():
    from tunedb.build import steps
    from tunedb.commands.build import configure, options_from
    from tunedb.errors import BuildError
    import argparse

    fam = families.get("group_gemm")
    assert steps.pick_rule(fam).tie_band == 0.03
    assert steps.pick_rule(fam, tie_band=0.01).tie_band == 0.01
    parser = argparse.ArgumentParser()
    configure(parser)
    opts = options_from(parser.parse_args(["--census", "c.json", "--out", "d", "--family", "group_gemm",
                                           "--tie-band", "0.01"]))
    assert opts.tie_band == 0.01
    with pytest.raises(BuildError, match="--tie-band=1.5"):
        steps.check_options(options_from(parser.parse_args(["--census", "c", "--out", "d", "--tie-band", "1.5"])), True)


def test_a_narrower_tie_band_changes_what_a_build_serves(tmp_path):
    """Two arms 2% apart: the shipped 3% band serves the simpler (default), a 1% band the faster."""
    from tunedb.build import partition, steps

    sig = Signature.make("group_gemm", "group_gemm", "bf16", E=4, N=64, K=32, top_k=2, x="token")
    pts = [Point(sig, 8, weight=1.0, calls=1)]
    table = {(8, "torch"): 1.2, (8, "default"): 1.0, (8, "b16x64x64_w4_s3_g8"): 0.98}
    fam = families.get("group_gemm")
    assert partition.partition(pts, table, steps.pick_rule(fam)).regions[0].config_id == "default"
    narrow = partition.partition(pts, table, steps.pick_rule(fam, tie_band=0.01))
    assert narrow.regions[0].config_id == "b16x64x64_w4_s3_g8"


def test_prewarm_launches_exactly_what_the_build_measures(tmp_path):
    from tunedb.census.censusfile import write_census
    from tunedb.families.group_gemm.keys import make_signature

    prewarm = _bench("prewarm")
    sig = make_signature(8, 4096, 14336, 2, "bf16", "slot")
    census = tmp_path / "c.json"
    write_census(census, ShapeSet((Point(sig, 1, 1.0, 1), Point(sig, 1024, 1.0, 1)), "moe"))
    work = prewarm.planned_work("group_gemm", [str(census)], fill=False)
    res = pipeline.build([("c", pipeline.read_census(census))],
                         pipeline.BuildOptions(out=str(tmp_path), family="group_gemm", dry_run=True, fill=False,
                                               arch_family="sm90"))
    (plan,) = res.plans
    assert {(m, c) for _, m, c in work} == {(m, c) for m, ids in plan.arms.items() for c in ids if c != "torch"}
    assert any(c.startswith("sl_") for _, m, c in work if m == 1)  # the slot lane where it is valid
    assert not any(c.startswith("sl_") for _, m, c in work if m == 1024)


def test_exhaustive_bench_builds_the_table_like_a_build_and_scores_regret():
    mx = _bench("moe_exhaustive")
    from tunedb.families.group_gemm import configs
    from tunedb.families.group_gemm.keys import make_signature

    grid = mx.grid_ids()
    assert {c.id for c in configs.config_space("sm90")} <= set(grid)  # the build space is in the grid
    assert len(grid) > 300 and all(configs.invalid_reason(configs.parse(c), make_signature(8, 4096, 4096, 2),
                                                          1, SM90) is None for c in grid if not c.startswith("sl_"))
    sig = make_signature(8, 4096, 14336, 2, "bf16", "slot")
    mx.PROFILE = SM90
    tile, other = "b64x128x64_w4_s3_g8", "b128x128x64_w8_s3_g8"
    rows = {1: {"torch": 1.0, "default": 0.9, tile: 0.5}, 4: {"torch": 1.0, "default": 0.9, tile: 0.6},
            16: {"torch": 1.0, "default": 0.9, tile: 0.7, other: 0.69}}
    measured = {"points": [(1, 1.0), (4, 0.0), (16, 1.0)], "rows": rows, "pruned": {}}
    parts = mx.tables(sig, measured, mx.rules())
    assert mx.served(parts["shipped"], 2) == tile and mx.served(parts["shipped"], 10**6) == "torch"
    scored = [{"key": "k", "M": 16, "best_tile": other, "best_in_build_space": True,
               "rules": {"shipped": {"pick": tile, "regret": 0.7 / 0.69 - 1}}},
              {"key": "k", "M": 1, "best_tile": tile, "best_in_build_space": True,
               "rules": {"shipped": {"pick": tile, "regret": 0.0}}}, {"M": 4, "skipped": True}]
    s = mx.summary(scored)["shipped"]
    assert s["points"] == 2 and s["worst_at"] == "k M=16" and len(s["over_2pct"]) == 0
    assert abs(s["worst_regret"] - (0.7 / 0.69 - 1)) < 1e-12


def test_exhaustive_bench_dry_run_counts_the_grid_and_the_build_arms(tmp_path, capsys):
    mx = _bench("moe_exhaustive")
    assert mx.main(["--out", str(tmp_path), "--dry-run", "--models", "qwen3-30b-a3b", "--table-ms", "1,64,4096",
                    "--grid-ms", "1,4096"]) == 0
    out = capsys.readouterr().out
    n_build = len(mx.build_arms(mx.keys_of("qwen3-30b-a3b")["up"], 64, SM90))
    assert f"qwen3-30b-a3b up: M=1: 338, M=64: {n_build}, M=4096: 260" in out  # slot tiles only at small M
    with pytest.raises(SystemExit):
        mx.main(["--out", str(tmp_path), "--dry-run", "--models", "gpt-5"])


def test_exhaustive_bench_runs_end_to_end_with_stand_in_timers(tmp_path, monkeypatch, capsys):
    """The bench's wiring on the CPU: tiny keys, the launchers' CPU path (every tile computes the
    torch result, checked against the reference), crc-derived times standing in for the GPU's.
    Both passes, the in-run table, the --table file's picks, the summary and the JSON."""
    import json
    import zlib

    mx = _bench("moe_exhaustive")
    monkeypatch.setattr(mx, "DEVICE", "cpu")
    monkeypatch.setattr(mx, "MODELS", {"tiny": (4, 64, 48, 2)})
    monkeypatch.setattr(mx, "keys_of", lambda model: {"up": _tiny("token"), "down": _tiny("slot")})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    from tunedb.families.group_gemm import configs

    few = list(dict.fromkeys(mx.grid_ids()[::12] + [c.id for c in configs.config_space("sm90")]))  # CPU time
    monkeypatch.setattr(mx, "grid_ids", lambda: few)

    def fake_ms(run):
        cid = run.config_id if hasattr(run, "config_id") else str(run)
        return 0.01 * (1 + (zlib.crc32(cid.encode()) % 400) / 1000.0)

    monkeypatch.setattr(mx.Point1, "run_of", lambda self, cid: _Named(self.fam.launcher(mx._cfg(cid), self.sig), cid))
    monkeypatch.setattr(mx.Point1, "eager", lambda self, run: fake_ms(run))
    monkeypatch.setattr(mx.Point1, "time", lambda self, run, quick=False: fake_ms(run))
    table = tmp_path / "db"
    _system_table("group_gemm", ShapeSet(tuple(Point(s, m, 1.0, 1) for s in (_tiny("token"), _tiny("slot"))
                                              for m in (1, 16)), "t"), table)
    assert mx.main(["--out", str(tmp_path / "out"), "--models", "tiny", "--table-ms", "1,16", "--grid-ms", "1,16",
                    "--compile-workers", "0", "--table", str(table / "sm90" / "group_gemm.json")]) == 0
    res = json.loads((tmp_path / "out" / "moe_exhaustive.json").read_text())
    assert set(res["summary"]) == {"shipped", "tie1", "tie0", "tie1_nogate", "file"}
    for key in res["keys"]:
        for e in key["scored"]:
            best = min(fake_ms(c) for c in key["pass1"][str(e["M"])] if c not in ("default", "torch")
                       and key["pass1"][str(e["M"])][c] is not None)
            assert abs(e["best_ms"] - best) < 1e-12  # the grid's best tile is found
            assert e["rules"]["tie0"]["regret"] >= -1e-12  # a 0% band never beats the grid's best
    assert "regret against the exhaustive grid" in capsys.readouterr().out


class _Named:
    def __init__(self, fn, config_id):
        self.fn, self.config_id = fn, config_id

    def __call__(self, *args):
        return self.fn(*args)


def _tiny(form):
    from tunedb.families.group_gemm.keys import make_signature

    return make_signature(4, 64, 48, 2, "bf16", form)


@pytest.mark.slow  # two spawned processes import torch: about 10 s
def test_prewarm_pool_launches_every_item_once(monkeypatch):
    """The process pool's plumbing (spawned workers, shares by config id) on the CPU, where the
    group_gemm launcher computes with torch."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    prewarm = _bench("prewarm")
    work = [(_tiny(form).format(), m, cid) for form in ("token", "slot") for m in (1, 5)
            for cid in ("default", "b16x64x64_w4_s3_g8", "sl_b1x32x256_w4_s3")]
    res = prewarm.prewarm("group_gemm", work, 2, log=lambda s: None, device="cpu")
    assert res["launches"] == len(work) and res["errors"] == [] and res["processes"] == 2
