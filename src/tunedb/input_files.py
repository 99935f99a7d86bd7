"""Reading a file a user names as input (a census, manifest, capture, cutoff decision or probe
file): a regular file or a pipe, of bounded size, read as text; else InputFileError naming the
path and what it is. The database's own reader (database/schema.read_raw) refuses pipes too."""
from __future__ import annotations

import stat
from pathlib import Path

from tunedb.errors import InputFileError

# far above any census, manifest or table tunedb reads (the largest are a few MB)
MAX_INPUT_BYTES = 1 << 30
STDIN = "/dev/stdin"  # what `-` names, as for `cat -`


def read_text(path: str | Path, encoding: str = "utf-8-sig") -> str:
    """The text of `path`. A path that does not exist raises what Path.read_text raises (the
    callers name a missing file already); a directory or a device (/dev/zero would never end)
    raises InputFileError (an OSError) before anything is read, and so does a file, or a pipe's
    stream, of more than MAX_INPUT_BYTES. A pipe is read (`--census <(...)`, /dev/stdin); a named
    FIFO waits for its writer, as `cat` would. UTF-8, with or without the byte-order mark Windows
    editors write (Notepad, PowerShell 5's `Out-File -Encoding utf8`). `-` is standard input."""
    path = Path(STDIN if str(path) == "-" else path)
    try:
        st = path.stat()
    except OSError:
        return path.read_text(encoding=encoding)
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(f"{path} is a directory; give a file")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise InputFileError(f"{path} is not a regular file or a pipe (a device would never end); give a file")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputFileError(f"{path} holds {st.st_size} bytes, over the {MAX_INPUT_BYTES >> 20} MiB an input file may")
    with path.open("rb") as f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise InputFileError(f"{path} streams more than the {MAX_INPUT_BYTES >> 20} MiB an input file may")
    return data.decode(encoding)
