"""Input files that are not regular files (a FIFO, a device, a directory): every reader of a file a
user names refuses them at once with a clear error, where a FIFO hung the reader and /dev/zero
read without bound."""
from __future__ import annotations

import os
import sys

import pytest

from tunedb.errors import BuildError, CensusError, CutoffError, InputFileError
from tunedb.input_files import read_text

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


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
def test_every_reader_refuses_a_fifo_and_a_device_at_once(fifo, index):
    reader, error = _readers()[index]
    for path in (fifo, "/dev/zero"):
        with pytest.raises(error, match="not a regular file"):
            reader(path)


def test_read_text_names_a_directory_and_passes_a_missing_file_through(tmp_path):
    with pytest.raises(InputFileError, match="is a directory; give a file"):
        read_text(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.json")
    (tmp_path / "ok.json").write_text("{}")
    assert read_text(tmp_path / "ok.json") == "{}"
    assert isinstance(InputFileError("x"), OSError)
