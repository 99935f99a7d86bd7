"""`tunedb prebuild`: job planning, CLI errors, and one real sm90 compile without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb.cli import main
from tunedb.families.gemm import FAMILY, configs, prebuild


def test_census_signatures_are_found_whatever_the_layout(tmp_path):
    census = tmp_path / "c.json"
    census.write_text(json.dumps({"points": [
        {"signature": "gemm|op=gemm|dt=bf16|N=80|K=72", "M": 3},
        {"signature": "gemm|op=gemm_act|dt=half|N=5120|K=1280|act=gelu|bias=1", "M": 1500},
        {"signature": "gemm|op=gemm|dt=fp32|N=8|K=8", "M": 1}]}))
    found = sorted(s.format() for s in prebuild.signatures_in(census))
    assert found == ["gemm|op=gemm_act|dt=half|N=5120|K=1280|act=gelu|bias=1", "gemm|op=gemm|dt=bf16|N=80|K=72"]


def test_census_jobs_follow_alignment_class_and_validity():
    odd = FAMILY.make_signature("gemm", "bf16", 80, 72)
    jobs = prebuild.jobs_for_census([odd], "sm90")
    assert jobs and all(j.dt == "bf16" and j.n_aligned and not j.k_aligned for j in jobs)
    ids = {j.config_id for j in jobs}
    assert "sk16_b16x32x256_w4_s3" not in ids  # K=72 has one 256-wide K tile
    half = FAMILY.make_signature("gemm", "half", 4096, 4096)
    assert {j.dt for j in prebuild.jobs_for_census([half], "sm90")} == {"fp16", "bf16"}


def test_plain_jobs_cover_both_dtypes_of_the_compile_set():
    chosen = FAMILY.compile_set("sm90", [])
    jobs = prebuild.jobs_for(chosen)
    assert len(jobs) == 2 * len(chosen)


@pytest.mark.parametrize("argv, message", [
    (["prebuild", "--arch", "hopper"], "unknown --arch 'hopper'"),
    (["prebuild", "--arch", "sm999"], "prebuild compiles for sm80, sm86"),
    (["prebuild", "--jobs", "0"], "--jobs must be >= 1"),
    (["prebuild", "--family", "nosuch"], "unknown kernel family 'nosuch'"),
    (["prebuild", "--census", "/nonexistent/census.json"], "does not exist"),
])
def test_cli_errors_name_the_bad_value(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_census_without_gemm_signatures(tmp_path, capsys):
    census = tmp_path / "empty.json"
    census.write_text("{}")
    assert main(["prebuild", "--census", str(census)]) == 2
    assert "names no GEMM signature" in capsys.readouterr().err


@pytest.mark.parametrize("text, flags, says", [
    ("{not json", [], "is not valid JSON: Expecting property name enclosed in double quotes (line 1, column 2)"),
    ("", [], "is empty"),
    # truncated after a signature: its signature text is no census to compile from
    ('{"points": [{"signature": "gemm|op=gemm|dt=bf16|N=80|K=72", "M": 3}', ["--every-valid"],
     "is not valid JSON: Expecting ',' delimiter (line 1, column 68)"),
])
def test_cli_says_what_is_wrong_with_a_census_that_is_not_json(tmp_path, capsys, text, flags, says):
    """It said 'names no GEMM signature' (or compiled from a truncated file's fragments)."""
    census = tmp_path / "corrupt.json"
    census.write_text(text)
    assert main(["prebuild", "--census", str(census), "--dry-run", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tunedb prebuild: error: census file {census} {says}; give a census "
                   f"(`tunedb census ... --out FILE`) or database file (JSON)")


@pytest.mark.slow
def test_compiles_for_sm90_without_a_gpu_and_the_second_run_hits_the_cache(tmp_path):
    """One small config for sm90 (no device here): cubins land in the cache; a rerun adds none."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    code = ("from tunedb.families.gemm import prebuild as p, configs as c; import json;"
            "s = p.run_jobs([p.Job('sk2_b16x32x64_w4_s4', 'fp16')], 'sm90', 1); print(json.dumps(s))")

    def run():
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    summary = run()
    assert summary["ok"] == 1 and summary["target"] == "cuda:90:32" and summary["triton"] != "absent"
    assert set(summary["key"]) == {"triton_key", "ptxas", "env", "python"}  # what a GPU box must match
    cubins = sorted(Path(tmp_path / "triton").rglob("*.cubin"))
    assert len(cubins) == 2  # the partial and the reduction kernels
    assert (tmp_path / "triton" / "tunedb-prebuild-sm90.json").is_file()
    entries = sorted(p.name for p in (tmp_path / "triton").iterdir())
    run()
    assert sorted(p.name for p in (tmp_path / "triton").iterdir()) == entries


def test_relocated_cache_points_group_files_at_the_new_root(tmp_path):
    old = tmp_path / "old" / "triton"
    new = tmp_path / "new" / "triton"
    (new / "ABC").mkdir(parents=True)
    grp = new / "ABC" / "__grp__k.json"
    grp.write_text(json.dumps({"child_paths": {"k.cubin": f"{old}/ABC/k.cubin", "k.json": f"{old}/ABC/k.json"}}))
    assert prebuild.relocate_cache(new, str(old)) == 1
    assert json.loads(grp.read_text())["child_paths"] == {"k.cubin": f"{new}/ABC/k.cubin",
                                                          "k.json": f"{new}/ABC/k.json"}
    assert prebuild.relocate_cache(new, str(old)) == 0


@pytest.mark.parametrize("flags, says", [
    (["--thin"], "--thin needs --max-points N with N >= 2, got None"),
    (["--max-points", "3"], "--max-points needs --thin"),
])
def test_thinning_flags_are_checked_as_build_checks_them(flags, says, capsys):
    census = Path(__file__).resolve().parents[2] / "bench" / "census" / "llama-3-8b_decode.json"
    assert main(["prebuild", "--dry-run", "--census", str(census), *flags]) == 2
    assert says in capsys.readouterr().err
