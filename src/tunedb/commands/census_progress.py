"""The census's progress display: a rich bar on standard error over the probe's steps (building
the model, tunedb.optimize(), each probe forward), shown only on a terminal and cleared when the
census ends, so that piped output and logs stay as they were. A large model's census takes
minutes on the CPU (Mamba: 313 s), which was silent before."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

Tell = Callable[[int, int, str], None]


@contextlib.contextmanager
def census_progress(stream: object = None) -> Iterator[Tell | None]:
    """The callback for probe.take_census(progress=...), or None off a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("census: {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(file=stream), transient=True)
    task: list[int] = []

    def tell(done: int, total: int, what: str) -> None:
        if not task:
            task.append(bar.add_task(what, total=total))
        bar.update(task[0], completed=done, total=total, description=what)

    with bar:
        yield tell
