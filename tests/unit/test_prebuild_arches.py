"""`tunedb prebuild --arch A --arch B`: a compile per target the validity predicate allows, the
per-arch summary table, ptxas-less targets skipped with their reason, and the --dry-run plan."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tunedb import arch
from tunedb.cli import main
from tunedb.families.gemm import configs, prebuild

ARCHES = ("sm80", "sm89", "sm90", "sm100")


@pytest.mark.parametrize("name, per_block", [("sm80", 166912), ("sm89", 101376), ("sm100", 232448)])
def test_planning_profiles_carry_the_real_shared_memory_limits(name, per_block):
    prof = arch.planning_profile(name)
    assert prof.arch_family == name and prof.smem_per_block == per_block
    assert prof.dram_bw_gbs == 0.0 and "nothing measured" in prof.source
    assert arch.planning_profile("sm90") == arch.shipped_profile("sm90")


def test_validity_follows_each_arch_shared_memory():
    big = configs.parse("b128x256x64_w8_s4_g8")  # ~196 KiB of shared memory in 4 stages
    assert configs.arch_reason(big, "sm90", arch.planning_profile("sm90").smem_per_block) is None
    assert configs.arch_reason(big, "sm89", arch.planning_profile("sm89").smem_per_block) is not None


def _fake_run_jobs(calls):
    def run_jobs(jobs, arch_family, n_jobs, progress=None):
        calls.append((arch_family, len(jobs)))
        return {"jobs": len(jobs), "ok": len(jobs) - 1, "failed": [{"job": {}, "error": "x"}], "seconds": 1.5,
                "key": {"triton_key": "k", "ptxas": "12.8", "env": {}, "python": "3.11"}}
    return run_jobs


def test_several_arches_compile_in_turn_with_a_table_and_a_skipped_arch_says_why(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(prebuild, "run_jobs", _fake_run_jobs(calls))
    monkeypatch.setattr(prebuild, "ptxas_problem", lambda cap: "no ptxas for sm100 here" if cap == 100 else None)
    rc = main(["prebuild", "--arch", "sm80,sm89", "--arch", "sm100"])
    out, err = capsys.readouterr()
    assert rc == 1  # a failed job and a skipped arch
    assert [a for a, _ in calls] == ["sm80", "sm89"]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("sm")}
    assert set(rows) == {"sm80", "sm89", "sm100"}
    assert rows["sm80"][1:6] == [str(calls[0][1]), str(calls[0][1] - 1), rows["sm80"][3], "1", "1.5"]
    assert int(rows["sm89"][3]) > int(rows["sm80"][3])  # sm89's 99 KiB refuses more of the chosen configs
    assert "skipped: no ptxas for sm100 here" in out and "no ptxas for sm100 here" in err


def test_dry_run_prints_each_arch_plan_and_compiles_nothing(monkeypatch, capsys):
    monkeypatch.setattr(prebuild, "run_jobs", lambda *a, **k: pytest.fail("dry run compiled"))
    assert main(["prebuild", "--arch", "sm80", "--arch", "sm100", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sm80: compile set" in out and "sm100: compile set" in out
    assert "tunedb build --census CENSUS --arch sm100" in out and "nothing was compiled" in out


def test_an_unknown_arch_among_several_is_refused_before_compiling(monkeypatch, capsys):
    monkeypatch.setattr(prebuild, "run_jobs", lambda *a, **k: pytest.fail("compiled"))
    assert main(["prebuild", "--arch", "sm80,sm42"]) == 2
    assert "unknown --arch 'sm42'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("target", ARCHES)
def test_one_config_compiles_for_each_arch_on_this_cpu(target, tmp_path):
    pytest.importorskip("triton")
    why = prebuild.ptxas_problem(configs.capability(target))
    if why:
        pytest.skip(why)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join(sys.path))
    code = ("from tunedb.families.gemm import prebuild as p; import json, sys;"
            "s = p.run_jobs([p.Job('b64x64x32_w4_s3_g8', 'bf16')], sys.argv[1], 1); print(json.dumps(s))")
    out = subprocess.run([sys.executable, "-c", code, target], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["ok"] == 1 and summary["target"] == f"cuda:{configs.capability(target)}:32", summary["failed"]
    cubins = list(tmp_path.rglob("*.cubin"))
    assert cubins
    meta = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json") if not p.name.startswith(("__grp__", "tunedb"))]
    assert any(m.get("target", {}).get("arch") == configs.capability(target) for m in meta)
