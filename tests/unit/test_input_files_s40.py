"""Input files that are not regular files: every reader of a file a user names refuses a device
(/dev/zero read without bound) and a directory at once with a clear error, and reads a pipe
(`--census <(...)`) to its end."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from tunedb.errors import BuildError, CensusError, CutoffError, InputFileError
from tunedb.input_files import read_text

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")


def _readers():
    from tunedb.census.capture import read_capture
    from tunedb.census.censusfile import read_census
    from tunedb.census.modes import read_manifest
    from tunedb.cutoff import store
    from tunedb.cutoff.probing import Probe
    from tunedb.families.gemm.prebuild import signatures_in

    return [(read_census, CensusError), (lambda p: read_manifest(p, "duration"), CensusError),
            (read_capture, CensusError), (store.load, CutoffError), (Probe.load, CutoffError),
            (signatures_in, (BuildError, InputFileError))]


@pytest.mark.parametrize("index", range(6))
def test_every_reader_refuses_a_device_and_a_directory_at_once(tmp_path, index):
    reader, error = _readers()[index]
    with pytest.raises(error, match="not a regular file or a pipe"):
        reader("/dev/zero")
    with pytest.raises(error, match="is a directory"):
        reader(tmp_path)


def test_a_pipe_is_read_to_its_end(tmp_path):
    from tunedb.census.modes import read_manifest

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text('{"duration": 1.5}\n{"duration": 2.0}\n'))
    writer.start()
    assert read_manifest(fifo, "duration") == [1.5, 2.0]  # `--manifest <(...)` works
    writer.join(timeout=10)


def test_read_text_passes_a_missing_file_through_and_bounds_what_it_reads(tmp_path, monkeypatch):
    from tunedb import input_files

    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.json")
    (tmp_path / "ok.json").write_text("{}")
    assert read_text(tmp_path / "ok.json") == "{}"
    monkeypatch.setattr(input_files, "MAX_INPUT_BYTES", 1)
    with pytest.raises(InputFileError, match="over the 0 MiB"):
        read_text(tmp_path / "ok.json")
    assert isinstance(InputFileError("x"), OSError)
