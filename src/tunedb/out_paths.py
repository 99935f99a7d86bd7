"""Whether a file a command will write can be written there, asked before the command's work
(a probe or a census of minutes must not end in "Is a directory"). Looks only: it makes no
directory and no lock file (database.target.unwritable takes the writer's first steps instead)."""
from __future__ import annotations

import os
from pathlib import Path


def why_unwritable(path: str | Path) -> str | None:
    """Why writing the file `path` (a new one beside it, then a rename) would fail, or None."""
    path = Path(path).expanduser()
    if path.is_dir():
        return "is a directory (a file path is wanted)"
    if path.exists() and not os.access(path, os.W_OK):
        return "permission denied"
    parent = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if parent is None or not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable (permission denied or a read-only file system)"
    return None
