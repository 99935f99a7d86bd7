"""The census tells its progress (probe.take_census(progress=...)): every step in order, the
total known from the start and reached at the end, and the same census with or without a
display; the display itself shows only on a terminal (piped output and logs stay clean)."""
from __future__ import annotations

import io

from tunedb.census import presets, probe
from tunedb.commands.census_progress import census_progress


def test_the_census_tells_each_step_and_is_the_same_census():
    w = presets.workload("whisper-base")
    seen = []
    told = probe.take_census(w, max_batch=2, progress=lambda done, total, what: seen.append((done, total, what)))
    assert told == probe.take_census(w, max_batch=2)
    totals = {t for _, t, _ in seen}
    assert len(totals) == 1 and seen[0][0] == 0 and seen[-1][0] == seen[-1][1] == totals.pop()
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    assert "building the model" in seen[0][2] and any("batch=2" in what for _, _, what in seen)
    assert len(seen) == seen[-1][1] + 1  # build, optimize, each forward, done


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_display_shows_on_a_terminal_only_and_clears_itself():
    with census_progress(io.StringIO()) as tell:
        assert tell is None
    out = Tty()
    with census_progress(out) as tell:
        tell(0, 3, "whisper-base: building the model")
        tell(3, 3, "whisper-base: done")
    assert "census" in out.getvalue()
