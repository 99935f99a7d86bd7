"""Service modes: which probe keys a serving engine runs, how often, and which it captures (pure).

A key is (batch, length) of one forward. Traffic (a NeMo-style manifest or a seeded synthetic
distribution) is replayed to count how many forwards each key gets:

- offline: utterances sorted by length, batched max_batch_size at a time; a batch runs at
  (batch bucket, length bucket), batch buckets being powers of two up to max_batch_size (and it).
  The captured grid is every (batch bucket, length bucket) up to the workload's max length; a
  batch longer than that runs eagerly at its exact (batch, length). A fixed-window encoder
  (Whisper) has one length, its window, keyed exactly; longer audio is cut into windows.
- prefill: the same batching for a language model's prompts, run eagerly (nothing captured).
- streaming: every cohort width 1..max_batch_size at one chunk is a captured key; the counts are a
  concurrency histogram of streams (durations replayed as Poisson arrivals).
- decode: every batch size 1..max_batch_size is a captured key; the counts are a concurrency
  histogram of requests whose lengths are output tokens.

Synthetic traffic (no --manifest), seeded, 2000 items, log-normal: audio durations median 6 s,
sigma 0.7, clipped to [0.5, 40] s; prompt tokens median 512, sigma 1.0, clipped to [8, 8192];
output tokens median 256, sigma 0.8, clipped to [1, 4096]. The concurrency replay offers half of
max_batch_size concurrent jobs on average (arrival rate = 0.5 * max_batch_size / mean job length).
"""
from __future__ import annotations

import json
import math
import random
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tunedb.input_files import read_text
from tunedb.buckets import bucket_of, edges_upto
from tunedb.errors import CensusError

FRAMES_PER_SECOND = 100  # 10 ms log-mel hop
MODES = ("offline", "prefill", "streaming", "decode")
SYNTHETIC_N = 2000
_SYNTHETIC = {  # field -> (median, sigma, lo, hi)
    "duration": (6.0, 0.7, 0.5, 40.0),
    "tokens": (512.0, 1.0, 8.0, 8192.0),
    "output_tokens": (256.0, 0.8, 1.0, 4096.0),
}


# The largest manifest value taken as real traffic. Past it the value is a unit mistake (samples
# or ms in `duration`) or a corrupt line, and it is refused: clamped, it would weight the census
# toward a shape no request has, and unbounded it overflows torch's size arithmetic in the probe
# (1e9 s: a [16, 2.5e10, 2.5e10] attention) or replays for hours (decode steps are simulated).
MANIFEST_MAX = {"duration": (24 * 3600, "s (24 h)"), "tokens": (1 << 24, "tokens"),
                "output_tokens": (1 << 20, "tokens")}


@dataclass(frozen=True, order=True)
class Key:
    """One probe: a forward at (batch, length); length 0 marks a decode step."""

    batch: int
    length: int
    captured: bool


def read_manifest(path: str | Path, field: str) -> list[float]:
    """The `field` values of a JSONL manifest (one JSON object per line; NeMo: "duration" in s)."""
    path = Path(path)
    try:
        text = read_text(path)
    except OSError as exc:
        raise CensusError(f"cannot read manifest {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CensusError(f"manifest {path} is not UTF-8 text (byte {exc.start}): a manifest is JSONL, "
                          f"one JSON object a line") from exc
    values = []
    # lines end at \n only: str.splitlines also splits inside a JSON string at U+2028 / U+0085, which
    # a writer with ensure_ascii=False leaves raw in a text field
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not JSON, a 4300-digit integer, brackets nested past the stack
            what = "nested too deeply" if isinstance(exc, RecursionError) else str(getattr(exc, "msg", exc))[:120]
            raise CensusError(f"manifest {path} line {lineno} is not JSON: {what}") from None
        if not isinstance(row, dict):
            raise CensusError(f"manifest {path} line {lineno} is a JSON {type(row).__name__}, not an object; "
                              f"a manifest is JSONL, one object a line with a {field!r} field")
        if field not in row:
            raise CensusError(f"manifest {path} line {lineno} has no {field!r} field (this workload reads "
                              f"{field!r}; the line has {', '.join(map(repr, list(row)[:6])) or 'no fields'})")
        value = row[field]
        top, unit = MANIFEST_MAX.get(field, (math.inf, ""))
        whole = field != "duration"  # token counts: whole numbers (0.5 tokens became 0, a crash later)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= top
                or (whole and value != int(value))):
            allowed = ("a whole number >= 1" if whole else "a positive number") + (
                f" at most {top} {unit}" if top < math.inf else "")
            raise CensusError(f"manifest {path} line {lineno}: {field!r} must be {allowed}, got {value!r}")
        values.append(float(value))
    if not values:
        raise CensusError(f"manifest {path} has no entries")
    return values


def synthetic(field: str, n: int = SYNTHETIC_N, seed: int = 0) -> list[float]:
    """The documented synthetic distribution of `field` (duration, tokens, output_tokens)."""
    if field not in _SYNTHETIC:
        raise CensusError(f"no synthetic distribution for {field!r}; known: {', '.join(_SYNTHETIC)}")
    median, sigma, lo, hi = _SYNTHETIC[field]
    rng = random.Random(seed)
    return [min(hi, max(lo, rng.lognormvariate(math.log(median), sigma))) for _ in range(n)]


def frames(durations: Iterable[float], fixed_length: int | None = None) -> list[int]:
    """Input frames per utterance; a fixed-window encoder gets one exact window per started window."""
    out = []
    for d in durations:
        n = math.ceil(d * FRAMES_PER_SECOND - 1e-9)
        if fixed_length:
            out.extend([fixed_length] * max(1, math.ceil(n / fixed_length)))
        else:
            out.append(max(1, n))
    return out


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    _check_batch(max_batch)
    out = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    return tuple(out) if out[-1] == max_batch else tuple(out + [max_batch])


# a census probes its model at each batch it keys (decode: every batch from 1, about 0.25 s each on
# a CPU at Llama-3-8B widths), and M = batch x length must stay a 32-bit size: bounds a serving
# setting never needs to pass
MAX_BATCH = 4096
MAX_CHUNK = 1 << 20


def _check_batch(max_batch: int) -> None:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH:
        raise CensusError(f"--max-batch-size={max_batch!r} must be an int from 1 to {MAX_BATCH}")


def length_bucket(length: int, step: int, fixed_length: int | None = None) -> int:
    if fixed_length:
        return fixed_length
    return -(-length // step) * step if step else bucket_of(length)


def length_grid(max_length: int, step: int, fixed_length: int | None = None) -> tuple[int, ...]:
    if fixed_length:
        return (fixed_length,)
    grid = tuple(range(step, max_length + 1, step)) if step else tuple(e for e in edges_upto(max_length) if e <= max_length)
    # the limit itself is a capture length: a batch up to --max-length is captured (docs/census.md),
    # where the grid stopped at the last step or edge below it and longer batches ran eagerly
    return grid if grid and grid[-1] == max_length else (*grid, max_length)


def offline(lengths: Sequence[int], max_batch: int, max_length: int, step: int,
            fixed_length: int | None = None, captured: bool = True) -> Counter[Key]:
    """Length-sorted batching replay; with captured=False (prefill) nothing is captured."""
    _check_batch(max_batch)
    counts: Counter[Key] = Counter()
    buckets = batch_buckets(max_batch)
    grid = length_grid(max_length, step, fixed_length)
    if captured:
        for b in buckets:
            for length in grid:
                counts[Key(b, length, True)] += 0
    ordered = sorted(lengths)
    for i in range(0, len(ordered), max_batch):
        batch = ordered[i:i + max_batch]
        longest = batch[-1]
        # A captured key is a grid length (never above the capture limit); a batch no grid
        # length holds runs eagerly at its own length.
        padded = next((g for g in grid if g >= longest), None) if captured else None
        if padded is not None:
            b = next(x for x in buckets if x >= len(batch))
            counts[Key(b, padded, True)] += 1
        elif captured:
            counts[Key(len(batch), longest, False)] += 1
        else:
            counts[Key(len(batch), length_bucket(longest, step, fixed_length), False)] += 1
    return counts


def concurrency(job_steps: Sequence[int], max_batch: int, load: float = 0.5, seed: int = 0) -> Counter[int]:
    """Steps run at each cohort width when jobs of job_steps steps arrive as a Poisson process
    (load * max_batch jobs in flight on average) and at most max_batch run per step (FIFO queue)."""
    _check_batch(max_batch)
    if not job_steps:
        return Counter()
    rng = random.Random(seed)
    rate = load * max_batch / (sum(job_steps) / len(job_steps))
    arrivals, t = [], 0.0
    for steps in job_steps:
        t += rng.expovariate(rate)
        arrivals.append((t, max(1, int(steps))))
    hist: Counter[int] = Counter()
    queue: deque[int] = deque()
    active: list[int] = []
    step, i = 0, 0
    while i < len(arrivals) or queue or active:
        if not queue and not active:
            step = max(step, math.ceil(arrivals[i][0]))
        while i < len(arrivals) and arrivals[i][0] <= step:
            queue.append(arrivals[i][1])
            i += 1
        while queue and len(active) < max_batch:
            active.append(queue.popleft())
        if active:
            hist[len(active)] += 1
            active = [s - 1 for s in active if s > 1]
        step += 1
    return hist


def streaming(lengths: Sequence[int], max_batch: int, chunk: int, seed: int = 0) -> Counter[Key]:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise CensusError(f"--chunk-size={chunk!r} must be an int from 1 to {MAX_CHUNK} (input frames per chunk)")
    _check_batch(max_batch)
    hist = concurrency([math.ceil(n / chunk) for n in lengths], max_batch, seed=seed)
    counts: Counter[Key] = Counter({Key(w, chunk, True): 0 for w in range(1, max_batch + 1)})
    for width, steps in hist.items():
        counts[Key(width, chunk, True)] += steps
    return counts


def decode(output_tokens: Sequence[int], max_batch: int, seed: int = 0) -> Counter[Key]:
    hist = concurrency([int(n) for n in output_tokens], max_batch, seed=seed)
    counts: Counter[Key] = Counter({Key(b, 0, True): 0 for b in range(1, max_batch + 1)})
    for width, steps in hist.items():
        counts[Key(width, 0, True)] += steps
    return counts
