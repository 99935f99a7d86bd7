"""Why a free-form TUNEDB_* value is refused: the checks settings.py's declarations name (a path,
a directory, a file to write, a count), each returning a reason that completes "NAME='value' ..."
or None. Pure functions of the value (and of the file system for paths); they read no setting."""
from __future__ import annotations

import os
from pathlib import Path


def path_problem(value: str) -> str | None:
    """Why a path value cannot be used as a path at all (blank, an unknown '~user', a name the
    file system refuses to look up: too long, say), or None."""
    if not value.strip():
        return "is blank; use a path (or unset the variable for the default)"
    try:
        os.stat(Path(value).expanduser())
    except RuntimeError:  # '~name' of a user this machine does not know
        return f"starts with {value.split('/')[0]!r}, whose home directory is unknown here; use a full path"
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:  # else Path.exists() raises it from deep inside a setting's check
        return f"cannot be used as a path ({exc.strerror or exc}); use another path"
    return None


def directory_value(value: str) -> str | None:
    why = path_problem(value)
    if why:
        return why
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        return "is not a directory (it names an existing file); use a directory path"
    # a directory to be made under an existing file can never be: every read of it failed
    # "Not a directory" (each tier file reported corrupt) and a write raised it bare
    above = next((p for p in path.parents if os.path.lexists(p)), None)
    if above is not None and not above.is_dir():
        return f"lies under {above}, which is a file, not a directory; use a directory path"
    return None


def user_db_value(value: str) -> str | None:
    return None if value.strip().lower() == "off" else directory_value(value)


def file_value(value: str) -> str | None:
    why = path_problem(value)
    if why:
        return why
    path = Path(value).expanduser()
    if path.is_dir():
        return "is a directory; use a file path (the recording is written there)"
    if not path.parent.is_dir():  # else the first recorded call fails inside the model's forward
        return f"names a file in {str(path.parent)!r}, which is not a directory; create it or use another path"
    return None


MAX_COMPILE_JOBS = 1024  # processes; far above any machine's cores (each compile takes ~1 GiB)


def _digits(value: str, most: int = 18) -> bool:
    """A whole number written in at most `most` digits (int() of 4300 digits or more raises)."""
    return value.isascii() and value.isdigit() and len(value.lstrip("0") or "0") <= most


def count_value(value: str) -> str | None:
    ok = _digits(value) and int(value) <= MAX_COMPILE_JOBS
    return None if ok else f"is not a whole number from 0 to {MAX_COMPILE_JOBS}"


def positive_value(value: str) -> str | None:
    return None if _digits(value) and int(value) > 0 else "is not a whole number > 0 (at most 18 digits)"


def rows_value(value: str) -> str | None:
    ok = _digits(value) and 1 <= int(value) <= 16
    return None if ok else "is not a whole number from 1 to 16"


def microseconds_value(value: str) -> str | None:
    return None if _digits(value, 12) else "is not a whole number of microseconds >= 0 (at most 12 digits)"
