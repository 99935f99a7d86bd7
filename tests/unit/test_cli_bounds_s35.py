"""`tunedb tune` / `tunedb census` arguments a CLI audit found unchecked (session 35): batch, chunk
and length bounds (a batch of 10**12 overflowed a storage size in a traceback; a million decode
batches probed for days), --impl's choices, --length-step past --max-length (a census of
nothing), and the GPU advice keeping --no-write."""
from __future__ import annotations

import pytest

from tunedb import pipeline, settings
from tunedb.census import modes
from tunedb.cli import main

TINY = """
import torch

def make(device):
    with torch.device(device):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64)).to(torch.bfloat16)
    return model, lambda batch, length: (torch.zeros(batch, length, 64, device=device, dtype=torch.bfloat16),)
"""


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    (tmp_path / "tiny_s35_workload.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


@pytest.mark.parametrize("argv, named", [
    (["tune", "whisper-base", "--max-batch-size", "1000000000000"], "--max-batch-size=1000000000000"),
    (["tune", "llama-3-8b", "--mode", "decode", "--max-batch-size", "1000000"], "from 1 to 4096"),
    (["tune", "conformer", "--mode", "streaming", "--chunk-size", "1000000000"], "--chunk-size=1000000000"),
    (["tune", "tiny_s35_workload:make", "--unit", "tokens", "--length-step", "5000"], "--length-step=5000"),
    (["tune", "tiny_s35_workload:make", "--unit", "tokens", "--max-length", "4294967296"], "--max-length=4294967296"),
])
def test_out_of_range_sizes_are_one_line_errors(cpu, capsys, argv, named):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_impl_takes_only_its_choices(cpu, capsys):
    with pytest.raises(SystemExit):
        main(["tune", "tiny_s35_workload:make", "--unit", "tokens", "--impl", "bogus"])
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_the_gpu_advice_keeps_no_write(cpu, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["tune", "whisper-base", "--no-write"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tunedb tune whisper-base --no-write" in out


def test_max_batch_bound_is_the_modes_bound():
    with pytest.raises(Exception, match="from 1 to 4096"):
        modes.batch_buckets(modes.MAX_BATCH + 1)
    assert modes.batch_buckets(modes.MAX_BATCH)[-1] == modes.MAX_BATCH
