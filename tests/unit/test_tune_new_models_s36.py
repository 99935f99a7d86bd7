"""`tunedb tune` on models the project never saw (an audit of session 36): an input factory that
returns a dict is named as the workload's mistake, the build plan on a narrow terminal shows
short keys rather than cutting every row to `gemm|op=gemm...`, a family whose calls tune's
census cannot record says so, and another family's points are not called unserved."""
from __future__ import annotations

import textwrap

from tunedb import cli, pipeline, settings
from tunedb.records import Point, ShapeSet, Signature

SIGS = [Signature.make("gemm", "gemm", "half", N=n, K=k) for n, k in ((192, 192), (768, 192), (192, 768))]
MOE = Signature.make("group_gemm", "group_gemm", "bf16", E=8, N=512, K=256, top_k=2, x="token")


def test_an_input_factory_returning_a_dict_is_the_workloads_mistake(tmp_path, monkeypatch, capsys):
    (tmp_path / "kwmodel.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                return self.fc(x)

        def build(device):
            return M().to(device).half(), lambda b, t: {"x": torch.randn(b, t, 16, device=device, dtype=torch.half)}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        rc = cli.main(["census", "kwmodel:build", "--unit", "tokens", "--max-length", "32", "--fused",
                       "--out", str(tmp_path / "c.json")])
    err = " ".join(capsys.readouterr().err.split())
    assert rc != 0 and "input_factory" in err and "returned a dict" in err and "kwmodel:build" in err


def _cpu_plan(tmp_path, monkeypatch, shapes):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: shapes)


def test_the_build_plan_on_a_narrow_terminal_shows_short_keys(tmp_path, monkeypatch, capsys):
    shapes = ShapeSet(tuple(Point(s, m, 0.1, 4, True) for s in SIGS for m in (64, 512)), "w", (("mode", "offline"),))
    _cpu_plan(tmp_path, monkeypatch, shapes)
    monkeypatch.setenv("COLUMNS", "80")
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert cli.main(["tune", "whisper-base", "--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("build plan"):]
    assert "gemm|op=gemm…" not in plan and "…" not in plan
    assert all(f"{n}x{k}" in plan for n, k in ((192, 192), (768, 192), (192, 768)))
    assert max(len(line) for line in out.splitlines()) <= 80


def test_another_familys_points_are_other_not_unserved(tmp_path, monkeypatch, capsys):
    shapes = ShapeSet(tuple(Point(s, m, 0.1, 4, True) for s in (SIGS[0], MOE) for m in (64, 512)), "w",
                      (("mode", "offline"),))
    _cpu_plan(tmp_path, monkeypatch, shapes)
    monkeypatch.setenv("COLUMNS", "120")
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert cli.main(["tune", "whisper-base"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "0 unserved, 2 other" in flat
    assert "other families: 2 point(s) of group_gemm" in flat


def test_a_family_tunes_census_cannot_record_says_so(tmp_path, monkeypatch, capsys):
    shapes = ShapeSet(tuple(Point(s, m, 0.1, 4, True) for s in SIGS[:1] for m in (64,)), "w", (("mode", "offline"),))
    _cpu_plan(tmp_path, monkeypatch, shapes)
    monkeypatch.setenv("COLUMNS", "120")
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert cli.main(["tune", "whisper-base", "--family", "rnn"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "tune's census records no call of the rnn family" in flat
    assert "A GPU would measure nothing here either" not in flat
