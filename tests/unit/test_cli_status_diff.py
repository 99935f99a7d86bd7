"""`tunedb status` and `tunedb diff` on hand-written files in tests/data/db (valid, corrupt, other arch)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb import cli, settings
from tunedb.commands import status as status_cmd
from tunedb.database import tiers

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
TIER = DATA / "tier"


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """System tier: tests/data/db/tier; user tier: a temp dir holding one valid sm90 gemm file."""
    monkeypatch.setenv("COLUMNS", "250")
    user = tmp_path / "user"
    (user / "sm90").mkdir(parents=True)
    shutil.copy(TIER / "sm90" / "gemm.json", user / "sm90" / "gemm.json")
    with settings.override(USER_DB=str(user)), tiers.system_root_override(TIER):
        yield user


def _files(report, tier):
    (t,) = [t for t in report["tiers"] if t["tier"] == tier]
    return {(f["arch_family"], f["kernel_family"]): f for f in t["files"]}


def test_diff_reports_added_removed_and_changed_one_line_each(capsys):
    rc, out, _ = run_cli(capsys, "diff", str(DATA / "a.json"), str(DATA / "b.json"))
    assert rc == 1
    assert out.splitlines() == [
        '+ gemm|op=gemm|dt=bf16|N=80|K=17: [[null,"torch"]]',
        '~ gemm|op=gemm|dt=half|N=512|K=256: regions [[512,"b32x64x64_w4_s3_g8"],[null,"torch"]] '
        '-> [[256,"b32x64x64_w4_s3_g8"],[null,"torch"]]',
        '~ gemm|op=gemm|dt=half|N=768|K=256: config b64x64x64_w4_s3_g8 '
        '{"lane":"triton_mma","block":[64,64,64],"warps":4,"stages":3} -> '
        '{"lane":"triton_mma","block":[64,64,64],"warps":4,"stages":3,"group_m":8}',
        '~ gemm|op=gemm|dt=half|N=768|K=256: validators {"triton":"3.6.0"} -> {"triton":"3.4.0"}',
        '- gemm|op=gemm|dt=half|N=80|K=17: [[null,"torch"]]',
    ]


def test_diff_of_files_that_agree_exits_0(capsys):
    # same entries in another order and layout, with notes and evidence that changes nothing served: they agree
    rc, out, _ = run_cli(capsys, "diff", str(DATA / "a.json"), str(DATA / "a_reformatted.json"))
    assert rc == 0 and "agree" in out


def test_diff_json(capsys):
    rc, out, _ = run_cli(capsys, "diff", "--json", str(DATA / "a.json"), str(DATA / "b.json"))
    data = json.loads(out)
    assert rc == 1 and data["same"] is False
    assert [c["kind"] for c in data["changes"]] == ["added", "changed", "changed", "changed", "removed"]
    assert data["changes"][1]["a"] == [[512, "b32x64x64_w4_s3_g8"], [None, "torch"]]
    rc, out, _ = run_cli(capsys, "diff", "--json", str(DATA / "a.json"), str(DATA / "a.json"))
    assert rc == 0 and json.loads(out) == {"a": str(DATA / "a.json"), "b": str(DATA / "a.json"),
                                           "same": True, "changes": []}


def test_diff_of_file_headers(capsys):
    rc, out, _ = run_cli(capsys, "diff", str(TIER / "sm90" / "gemm.json"), str(TIER / "sm80" / "gemm.json"))
    assert rc == 1
    assert "~ file: arch_family sm90 -> sm80" in out.splitlines()
    assert any(line.startswith("~ file: model present -> absent") for line in out.splitlines())


@pytest.mark.parametrize("bad, message", [
    (TIER / "sm90" / "scaled_mm.json", "not valid JSON"),
    (DATA / "does_not_exist.json", "no such file"),
])
def test_diff_of_an_unreadable_file_exits_2_naming_it(capsys, bad, message):
    for argv in ([str(DATA / "a.json"), str(bad)], [str(bad), str(DATA / "a.json")]):
        rc, out, err = run_cli(capsys, "diff", *argv)
        assert rc == 2 and out == ""
        assert str(bad) in err and message in err


def test_diff_via_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "tunedb", "diff", str(DATA / "a.json"), str(DATA / "b.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stdout.splitlines()) == 5
    proc = subprocess.run([sys.executable, "-m", "tunedb", "diff", str(DATA / "a.json"),
                           str(TIER / "sm90" / "scaled_mm.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "scaled_mm.json" in proc.stderr


def test_status_json_lists_loaded_and_skipped_files_per_tier(capsys, shipped):
    rc, out, _ = run_cli(capsys, "status", "--json", "--arch", "sm90")
    assert rc == 0
    report = json.loads(out)
    system = _files(report, "system")
    assert set(system) == {("sm90", "gemm"), ("sm90", "scaled_mm"), ("sm90", "conv1d")}
    gemm = system[("sm90", "gemm")]
    assert (gemm["state"], gemm["entries"]) == ("loaded", 2)
    assert gemm["path"] == str(TIER / "sm90" / "gemm.json")
    stale = {s["signature"]: s["reasons"] for s in gemm["stale"]}
    assert "triton mixed: measured under 3.4.0, 3.6.0" in stale["gemm|op=gemm|dt=bf16|N=1024|K=1024"]
    corrupt = system[("sm90", "scaled_mm")]
    assert corrupt["state"] == "corrupt" and "scaled_mm.json" in corrupt["problem"]
    assert "not valid JSON" in corrupt["problem"]
    mismatch = system[("sm90", "conv1d")]
    assert mismatch["state"] == "mismatch" and "kernel_family is 'gemm', expected 'conv1d'" in mismatch["problem"]
    user = _files(report, "user")
    assert user[("sm90", "gemm")]["path"] == str(shipped / "sm90" / "gemm.json")
    assert {s["name"]: s["value"] for s in report["settings"]}["TUNEDB_USER_DB"] == str(shipped)


def test_status_without_gpu_shows_every_arch_unless_narrowed(capsys, shipped, monkeypatch):
    monkeypatch.setattr(status_cmd, "_default_arch", lambda: None)
    rc, out, _ = run_cli(capsys, "status", "--json")
    assert rc == 0
    assert ("sm80", "gemm") in _files(json.loads(out), "system")
    rc, out, _ = run_cli(capsys, "status", "--json", "--arch", "sm80")
    assert set(_files(json.loads(out), "system")) == {("sm80", "gemm")}
    monkeypatch.setattr(status_cmd, "_default_arch", lambda: "sm90")  # what a GPU machine does
    rc, out, _ = run_cli(capsys, "status", "--json")
    assert ("sm80", "gemm") not in _files(json.loads(out), "system")


def test_default_arch_is_all_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: status narrows to its arch")
    assert status_cmd._default_arch() is None


def test_status_table_and_disabled_user_tier(capsys, shipped):
    with settings.override(USER_DB="off"):
        rc, out, _ = run_cli(capsys, "status")
    assert rc == 0
    assert "user tier: disabled" in out
    assert "skipped (corrupt)" in out and "skipped (mismatch)" in out
    assert "triton mixed" in out and "TUNEDB_USER_DB" in out
    with settings.override(USER_DB="off"):
        rc, out, _ = run_cli(capsys, "status", "--json")
    assert _files(json.loads(out), "user") == {}
    assert [t["enabled"] for t in json.loads(out)["tiers"]] == [False, True]


def test_diff_of_an_unsupported_schema_or_a_directory_exits_2(capsys, tmp_path):
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"schema": 2, "kernel_family": "gemm", "arch_family": "sm90"}))
    rc, _, err = run_cli(capsys, "diff", str(DATA / "a.json"), str(future))
    assert rc == 2 and "schema 2 is not supported" in err
    rc, _, err = run_cli(capsys, "diff", str(tmp_path), str(DATA / "a.json"))
    assert rc == 2 and str(tmp_path) in err


@pytest.mark.parametrize("bad", ["h200", "sm9", "90", "SM90", "sm90x1"])
def test_status_names_an_arch_that_is_not_an_arch_family(capsys, bad):
    rc, _out, err = run_cli(capsys, "status", "--arch", bad)
    assert rc == 2 and repr(bad) in err and "sm90" in err


def test_status_table_shows_bracketed_text_as_written(capsys, tmp_path, monkeypatch):
    # rich read "[bold]" in a user tier's path as markup and dropped it from the table
    monkeypatch.setenv("COLUMNS", "250")
    user = tmp_path / "[bold]tier"
    (user / "sm90").mkdir(parents=True)
    shutil.copy(TIER / "sm90" / "gemm.json", user / "sm90" / "gemm.json")
    with settings.override(USER_DB=str(user)), tiers.system_root_override(TIER):
        rc, out, _ = run_cli(capsys, "status", "--arch", "sm90")
    assert rc == 0 and "[bold]tier" in out


@pytest.mark.parametrize("which", ["root", "arch"])
def test_status_with_an_unlistable_user_tier_directory_reports_it_and_exits_0(shipped, capsys, monkeypatch, which):
    """A user-tier directory that cannot be listed (chmod 000; faked here: root reads anything):
    status says which directory it skipped and exits 0, as it does for a corrupt file (CLI audit:
    it stopped with "Permission denied; choose a writable place", or showed "no files")."""
    blocked = shipped if which == "root" else shipped / "sm90"
    real = Path.iterdir

    def iterdir(self):
        if self == blocked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    rc, out, err = run_cli(capsys, "status")
    assert rc == 0, err
    assert f"skipping user-tier directory {blocked}: Permission denied" in " ".join((out + err).split())


def test_status_shows_a_user_tier_it_cannot_look_up_as_invalid_and_exits_0(capsys, tmp_path):
    """A path whose lookup raises (a name too long for the file system) is a setting status shows
    INVALID, never an error of status itself."""
    long = tmp_path / ("a" * 300)
    with settings.override(USER_DB=str(long)):
        rc, out, err = run_cli(capsys, "status")
    assert rc == 0, err
    assert "INVALID" in out and "TUNEDB_USER_DB" in out


def test_diff_counts_evidence_that_serves_another_config(tmp_path, capsys):
    # session 55: the same regions, other evidence; the serving rule (a region's config serves near
    # the sizes its evidence measured) makes one file serve torch where the other serves the tile
    raw = json.loads((DATA / "a.json").read_text())
    sig = "gemm|op=gemm|dt=half|N=512|K=256"
    tile = raw["entries"][sig]["regions"][0][1]
    small, large = json.loads(json.dumps(raw)), json.loads(json.dumps(raw))
    small["entries"][sig]["evidence"] = {"M=16": {"torch": [0.02, 0.001, 9], tile: [0.01, 0.001, 9]}}
    large["entries"][sig]["evidence"] = {"M=512": {"torch": [0.02, 0.001, 9], tile: [0.01, 0.001, 9]}}
    (tmp_path / "s.json").write_text(json.dumps(small))
    (tmp_path / "l.json").write_text(json.dumps(large))
    rc, out, _ = run_cli(capsys, "diff", "--json", str(tmp_path / "s.json"), str(tmp_path / "l.json"))
    changes = json.loads(out)["changes"]
    assert rc == 1 and [c["what"] for c in changes] == ["served"]
    assert changes[0]["a"]["M=16"] == tile and changes[0]["b"]["M=16"] == "torch"
