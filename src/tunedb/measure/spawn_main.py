"""Spawned children (the measuring worker, the compile pool) and a __main__ that names no file.

multiprocessing's spawn start method re-runs the parent's __main__ in each child from its
__file__. A script piped to Python (`python - < run.py`) has __file__ '<stdin>': every child
died with FileNotFoundError before tunedb's code ran, printing one traceback per process, and
the parent saw a broken pool. Such a __file__ cannot be reopened by anything, so it is removed
before a child starts; the child then runs without the parent's __main__, which tunedb's
children never need (their targets live in tunedb's own modules).
"""
from __future__ import annotations

import os
import sys


def importable_main() -> None:
    """Drop __main__.__file__ when it names no file on disk ('<stdin>'); else leave it."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or getattr(main, "__spec__", None) is not None:
        return  # no path, or run with -m: the child imports the module by name
    if os.path.isfile(path):
        return
    from multiprocessing import process

    # a relative __file__ after a chdir: spawn reopens it from the directory Python started in
    if not os.path.isabs(path) and os.path.isfile(os.path.join(process.ORIGINAL_DIR or "", path)):
        return
    del main.__file__
