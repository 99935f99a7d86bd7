"""`tunedb linalg tune` refuses flags that would measure nothing useful with a clear error
(TunedbError naming the flag and what is allowed), before any GPU work, instead of a traceback
or a table of torch-only cells."""
from __future__ import annotations

import argparse

import pytest

from tunedb.errors import TunedbError
from tunedb.families.linalg import cli, ladder


def _args(out, **kw) -> argparse.Namespace:
    base = dict(prebuild=False, quick=True, legs="solver", ops=None, dtypes=None, margin=None, rounds=9,
                max_arms=12, build_jobs=None, dry_run=False, out=str(out), seed=0, n=None)
    base.update(kw)
    return argparse.Namespace(**base)


class _NoTimer:
    """A timer the flag checks must refuse before touching."""

    def __getattr__(self, name):
        raise AssertionError(f"the timer was used ({name}) for flags that should have been refused")


@pytest.mark.parametrize("flags, words", [
    (dict(margin=-1.0), "--margin -1.0"),
    (dict(margin=1.5), "--margin 1.5"),
    (dict(max_arms=0), "--max-arms 0"),
    (dict(max_arms=-1), "--max-arms -1"),
    (dict(dtypes="fp16"), "fp16"),
    (dict(dtypes="bf16", ops="potrf"), "bf16"),
    # s22: refused by the ladder only after the compiles, or with a --max-rounds the user never gave
    (dict(rounds=0), "--rounds 0 must be at least 9"),
    (dict(rounds=-3), "--rounds -3 must be at least 9"),
    (dict(rounds=8, max_rounds=40), "--rounds 8 must be at least 9"),
    (dict(build_jobs=0), "--build-jobs 0 must be at least 1"),
    (dict(build_jobs=-2), "--build-jobs -2 must be at least 1"),
])
def test_bad_tune_flags_raise_a_clear_error_and_write_nothing(tmp_path, flags, words):
    out = tmp_path / "t.json"
    with pytest.raises(TunedbError) as err:
        cli.tune(_args(out, **flags), timer=_NoTimer(), arch_family="sm90")
    assert words in str(err.value)
    assert not out.exists()


def test_good_flags_still_measure(tmp_path):
    out = tmp_path / "t.json"
    cost = lambda cell, arm: 50.0 if arm == "torch" else 10.0  # noqa: E731
    assert cli.tune(_args(out, ops="potrf", margin=0.0, max_arms=1), timer=ladder.FakeTimer(cost, seed=1),
                    arch_family="sm90") == 0
    assert out.exists()


def test_a_missing_base_is_refused_before_measuring(tmp_path):
    # s22: it was read as "no table", so the written table held only the cells measured now
    out = tmp_path / "t.json"
    with pytest.raises(TunedbError, match=r"--base .*missing\.json is not a file"):
        cli.tune(_args(out, base=str(tmp_path / "missing.json")), timer=_NoTimer(), arch_family="sm90")
    assert not out.exists()


def test_an_unwritable_out_is_refused_before_measuring(tmp_path):
    # s22: store.write_atomic raised FileExistsError after the whole measurement
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TunedbError, match="afile is a file, not a directory"):
        cli.tune(_args(tmp_path / "afile" / "t.json"), timer=_NoTimer(), arch_family="sm90")
    (tmp_path / "adir.json").mkdir()
    with pytest.raises(TunedbError, match="is a directory"):
        cli.tune(_args(tmp_path / "adir.json"), timer=_NoTimer(), arch_family="sm90")


def test_a_corrupt_base_is_refused_before_measuring(tmp_path):
    from tunedb.errors import CorruptDatabaseError

    out = tmp_path / "t.json"
    out.write_text("{not json")
    with pytest.raises(CorruptDatabaseError, match="not valid JSON"):  # s22: raised after measuring
        cli.tune(_args(out), timer=_NoTimer(), arch_family="sm90")
    assert out.read_text() == "{not json"


def test_an_unwritable_samples_file_is_refused_before_measuring(tmp_path):
    # s22: --samples is written before the table, so its failure after measuring lost both
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TunedbError, match="--samples: cannot write .*afile is a file"):
        cli.tune(_args(tmp_path / "t.json", samples=str(tmp_path / "afile" / "s.jsonl")), timer=_NoTimer(),
                 arch_family="sm90")
