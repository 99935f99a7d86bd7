"""What `tunedb tune WORKLOAD` says to the commonest mistakes (session 52's probe): a preset's
name mistyped, a Hugging Face checkout directory, a file that does not exist, a module that
calls sys.exit() at import."""
import pytest

from tunedb.census import presets
from tunedb.errors import CensusError


@pytest.mark.parametrize("typo, preset", [("llama3-8b", "llama-3-8b"), ("whisper_base", "whisper-base"),
                                          ("Llama-3-8B", "llama-3-8b"), ("conformr", "conformer")])
def test_a_mistyped_preset_is_suggested(typo, preset):
    with pytest.raises(CensusError, match=f"did you mean '{preset}'"):
        presets.workload(typo)


def test_a_name_like_no_preset_suggests_nothing():
    with pytest.raises(CensusError) as err:
        presets.workload("gpt2")
    assert "did you mean" not in str(err.value)


def test_a_checkout_directory_and_a_missing_file_are_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mistral"}')
    with pytest.raises(CensusError, match="is a directory .a Hugging Face checkout"):
        presets.workload(str(tmp_path))
    with pytest.raises(CensusError, match="no file .*nothere.json exists"):
        presets.workload(str(tmp_path / "nothere.json"))


def test_a_module_that_exits_at_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "exits_s52.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CensusError, match=r"importing exits_s52 called sys.exit\(3\)"):
        presets.workload("exits_s52:make")
