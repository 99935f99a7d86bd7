"""autotune()'s and prewarm()'s argument checks: a bad value, or a keyword neither takes, named
with what is allowed when the call is made, not at the first shape measured (inside a forward,
on a GPU only)."""
from __future__ import annotations

import os
from typing import Any


def check_arch(arch_family: Any) -> None:
    """ValueError unless arch_family is None (this GPU's) or an arch family name (sm90)."""
    import re

    if arch_family is not None and (not isinstance(arch_family, str) or not re.fullmatch(r"sm\d+a?", arch_family)):
        raise ValueError(f"arch_family={arch_family!r} must be None (this GPU's) or an arch family like 'sm90'")


def check_args(cache: Any, publish: Any, enabled: Any, top_k: Any, working_set_bytes: Any,
               approximate: Any = None, measurer: Any = None, publisher: Any = None) -> None:
    """TypeError / ValueError naming a bad argument and what is allowed, when autotune() is
    entered, not at the first shape it measures (inside the model's forward, on a GPU only)."""
    if approximate is not None and not isinstance(approximate, bool):  # "no" is truthy: it opted in
        raise TypeError(f"autotune approximate={approximate!r} must be True, False or None "
                        f"(None: TUNEDB_APPROXIMATE decides)")
    for name, value in (("measurer", measurer), ("publisher", publisher)):
        if value is not None and not callable(value):  # found only at the first shape, or at exit
            raise TypeError(f"autotune {name}={value!r} must be a callable or None (the default)")
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"autotune cache={cache!r} must be a file path (str or os.PathLike) or None")
    if cache is not None and (not os.fspath(cache).strip() or os.path.basename(os.fspath(cache).rstrip("/")) in ("", ".", "..")
                              or os.fspath(cache).endswith(("/", os.sep))):
        raise ValueError(f"autotune cache={cache!r} names no file; pass a file path (e.g. 'tune.json') or None")
    for name, value in (("publish", publish), ("enabled", enabled)):
        if not isinstance(value, bool):
            raise TypeError(f"autotune {name}={value!r} must be True or False")
    for name, value, low in (("top_k", top_k, 1), ("working_set_bytes", working_set_bytes, 0)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise ValueError(f"autotune {name}={value!r} must be None or an int >= {low}")


def check_keywords(caller: str, kwargs: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """TypeError naming an unknown keyword of `caller` and the ones `allowed` (Python's own named
    Autotuner.__init__, a class the user never called)."""
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}; its keywords beyond "
                        f"the positional ones: {', '.join(allowed)}")
