"""The linalg ladder: every arm of every cell (op, dtype, n, batch) on one ns-per-problem axis.

Per cell: each arm passes the numerical gate first (its worst residual within the verify
factor of torch's on the same inputs; a failing arm is recorded with its status and never
wins); then at least nine paired rounds, the surviving arms in a freshly shuffled order each
round, every raw sample kept, and (with a cap) more rounds while the cell is ambiguous (paired)
or a burst took much of it (low). The cell's decision is pick.decide on the medians,
pick.decide_paired on the paired rounds, or pick.decide_low on the lower quartiles with the
launch-jitter band. The eager-only library arm (`torch_checked`) is measured and reported beside
the others but never decides a cell; it is timed in rounds of its own after the cell's paired
rounds, since a sample right after it came out slow 2-4x more often than others (s15 B, D).
Each round keeps when it ran, its order and (from a timer that has them) the GPU's clock and
throttle readings, for telling a slow stretch's cause. Timers are pluggable: gputimer.GraphTimer on a GPU (CUDA graphs over a ring of fresh
inputs), FakeTimer here (a cost function plus seeded noise), so the whole regeneration is tested
without a GPU. A timer may say why an arm failed (`failure(cell, arm)`); the reason is kept
beside the status (the log line, the table's evidence). The GPU must be quiet: a foreign compute process at the start refuses the run
(BusyGPUError); one that appears during a leg invalidates that leg.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from tunedb.errors import BusyGPUError, MeasurementError, TunedbError
from tunedb.families.linalg import configs, keep, pick, signatures
from tunedb.measure.stats import median
from tunedb.records import Signature, Status

GRID_N: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
GRID_BATCH: tuple[int, ...] = (256, 4096, 65536)
GRID_DTYPES: tuple[str, ...] = ("fp32", "fp64")
QUICK_N: tuple[int, ...] = (4, 8, 16, 32)
QUICK_BATCH: tuple[int, ...] = (4096,)
LEGS: dict[str, tuple[str, ...]] = {"ladder": ("dot", "gemv", "gemm"), "solver": ("potrf", "trsv", "posv")}
MIN_ROUNDS = 9


@dataclass(frozen=True, order=True)
class Cell:
    op: str
    dt: str
    n: int
    batch: int

    @property
    def signature(self) -> Signature:
        return signatures.make_signature(self.op, self.dt, self.n)

    def __str__(self) -> str:
        return f"{self.op} {self.dt} n={self.n} batch={self.batch}"


def parse_legs(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """'ladder,solver' -> ('ladder', 'solver'); TunedbError naming a bad leg and the legs."""
    if text is None:
        return tuple(LEGS)
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    bad = [t for t in names if t not in LEGS]
    if bad or not names:
        raise TunedbError(f"unknown leg(s) {bad or names!r}; legs: {', '.join(LEGS)} "
                          f"(ladder: {', '.join(LEGS['ladder'])}; solver: {', '.join(LEGS['solver'])})")
    return tuple(dict.fromkeys(names))


def cells(legs: Sequence[str], quick: bool = False, dtypes: Sequence[str] = GRID_DTYPES,
          ops: Sequence[str] | None = None, ns: Sequence[int] | None = None) -> list[Cell]:
    """The grid of the chosen legs (and ops, and n): n x batch x dtype per op (quick: one
    throughput point)."""
    grid_n, batches = (QUICK_N, QUICK_BATCH) if quick else (GRID_N, GRID_BATCH)
    ns = grid_n if ns is None else tuple(n for n in grid_n if n in ns)
    out = []
    for leg in legs:
        for op in LEGS[leg]:
            if ops is not None and op not in ops:
                continue
            for dt in dtypes:
                if dt in signatures.dtypes_for(op):
                    out += [Cell(op, dt, n, b) for n in ns for b in batches]
    return out


def arms(cell: Cell, arch: Any, max_arms: int | None = None) -> tuple[str, ...]:
    """The cell's arms: the library arm, the valid Triton configs (at most `max_arms`, by the
    kernels' own prior, round-robin over packings), the dependency tier's valid arms (outside
    the cap), the eager-only library arm for the factor and solve ops (reported, never served)."""
    sig = cell.signature
    triton = [c.id for c in configs.config_space(arch.arch_family if arch is not None else "sm90")
              if configs.invalid_reason(c, sig, cell.batch, arch) is None]
    space = configs.space()
    if max_arms is not None and len(triton) > max_arms and space is not None:
        # the prior sees the batch: a config that cannot fill the GPU at this batch ranks lower
        # (the s9 table, capped without it, never timed block_w1 at n=32, the quick ladder's winner)
        from tunedb.families.linalg import kernels_prior as prior  # (kernels_space is there: space)

        sms = getattr(arch, "sms", None) or 132
        keep = {c.id for c in prior.candidates(cell.op, cell.n, cell.dt, max_arms, batch=cell.batch, sms=sms)}
        # the cap ranks Triton configs; the dependency tiers' arms (nvmath one a cell, the CUDA tier up to
        # eight, where each can run) are always timed
        triton = [a for a in triton if a in keep or configs.dependency(a)]
    eager = (configs.EAGER_ONLY,) if cell.op in ("potrf", "posv") and configs.kernels() is not None else ()
    return (configs.LIBRARY, *triton, *eager)


class Ring:
    """A bounded ring of R input sets for one cell: `pristine` ones no arm ever sees, and the
    `working` copies timed launches consume (call k on set k). `restore()` copies pristine over
    working (outside any timed region), so a launch that overwrites its input (input policy
    RING) is always timed on a fresh valid system, never on its own output. Device-agnostic:
    only tensor methods are used."""

    def __init__(self, make: Callable[[int], tuple[Any, ...]], size: int) -> None:
        if size < 1:
            raise ValueError(f"ring size={size} must be at least 1")
        self.pristine = [tuple(make(k)) for k in range(size)]
        self.working = [tuple(t.clone() for t in args) for args in self.pristine]

    def __len__(self) -> int:
        return len(self.working)

    def restore(self) -> None:
        for src, dst in zip(self.pristine, self.working):
            for s, d in zip(src, dst):
                d.copy_(s)


class CellTimer(Protocol):
    def gate(self, cell: Cell, arm: str) -> tuple[Status, float | None]:
        """(status, residual / torch's) of one arm on fresh inputs; not ok: it cannot win."""

    def sample(self, cell: Cell, order: Sequence[str]) -> Mapping[str, float | Status]:
        """One round: each arm's ns per problem (or a failure status), timed in `order`."""

    def foreign_pids(self) -> frozenset[int]:
        """Compute processes on the GPU that are not ours."""


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    samples: Mapping[str, tuple[float, ...]]  # arm -> ns per problem, every round
    statuses: Mapping[str, str]  # arm -> "ok" or a failure status
    residuals: Mapping[str, float | None]  # arm -> worst residual / torch's (the gate)
    pick: pick.CellPick
    errors: Mapping[str, str] = field(default_factory=dict)  # failed arm -> why (when the timer says)
    rounds: tuple[Mapping[str, Any], ...] = ()  # per paired round: t_s, order, the timer's readings

    def failed(self) -> list[str]:
        """'arm status (why)' for every failed arm, for the log."""
        return [f"{a} {s}" + (f" ({self.errors[a]})" if a in self.errors else "")
                for a, s in sorted(self.statuses.items()) if s != Status.OK.value]

    def median(self, arm: str) -> float | None:
        return _median(self.samples.get(arm, ()))


DECIDERS = ("median", "paired", "low")
# decide="low" measures more rounds while a burst took more than this share of an arm's samples
DISTURBED_SHARE = 0.4


def measure_cell(timer: CellTimer, cell: Cell, arm_ids: Sequence[str], rounds: int = MIN_ROUNDS,
                 seed: int = 0, rule: Any = pick.LINALG_RULE, *, decide: str = "median",
                 max_rounds: int | None = None, jitter_ns: float = pick.LAUNCH_JITTER_NS,
                 incumbent: tuple[str, str] | None = None) -> CellResult:
    """Gate every arm, then `rounds` paired rounds of the servable arms; while the cell is open
    and `rounds` more fit in `max_rounds`, another `rounds` (paired, median: pick.ambiguous, an
    arm's paired interval straddles the band edge so that it moves the pick; low: a burst took
    more than DISTURBED_SHARE of an arm's samples, or the pick sits within the noise of its
    band's edge, pick.near_edge; each further block on fresh graphs and buffers where the timer
    can, `refresh(cell)`). Then the eager-only arm's rounds, as many. Each round records its block.
    decide="median": pick.decide on the medians (spec 003 as session 9 shipped it); "paired":
    pick.decide_paired (an arm ties when its paired interval is within the band); "low":
    pick.decide_low (lower quartiles, the median over blocks of each block's; the band widened
    to `jitter_ns` a call), then under low the `incumbent` (the table's (winner, native) of this
    cell) keeps the cell while it still ties (keep.keep_incumbent)."""
    if rounds < MIN_ROUNDS:
        raise TunedbError(f"rounds={rounds} is below the {MIN_ROUNDS} paired rounds spec 003 requires")
    if decide not in DECIDERS:
        raise TunedbError(f"decide={decide!r}; allowed: {', '.join(DECIDERS)}")
    if max_rounds is not None and max_rounds < rounds:
        raise TunedbError(f"max_rounds={max_rounds} is below rounds={rounds}")
    statuses: dict[str, str] = {}
    residuals: dict[str, float | None] = {}
    for arm in arm_ids:
        status, ratio = timer.gate(cell, arm)
        statuses[arm], residuals[arm] = status.value, ratio
    live = [a for a in arm_ids if statuses[a] == Status.OK.value and a != configs.EAGER_ONLY]
    eager = [a for a in arm_ids if statuses[a] == Status.OK.value and a == configs.EAGER_ONLY]
    samples: dict[str, list[float]] = {a: [] for a in (*live, *eager)}
    rng = random.Random(f"{seed}:{cell}")
    log: list[dict[str, Any]] = []
    t0 = time.monotonic()
    done = 0
    block = 0
    while live:
        for _ in range(rounds):
            log.append({**_round(timer, cell, rng, live, samples, statuses, t0), "block": block})
        done += rounds
        if max_rounds is None or done + rounds > max_rounds or not _open(samples, rule, decide, cell, rounds,
                                                                          jitter_ns):
            break
        block += 1
        refresh = getattr(timer, "refresh", None)
        if refresh is not None and decide == "low":
            refresh(cell)  # the next block on fresh graphs and buffers: a new capture to average over
    for _ in range(done if eager else 0):  # never inside a paired round: see the module docstring
        _round(timer, cell, rng, eager, samples, statuses, t0)
    frozen = {a: tuple(v) for a, v in samples.items()}
    why = getattr(timer, "failure", None)
    errors = {a: text for a, s in statuses.items() if s != Status.OK.value and why is not None
              for text in (why(cell, a),) if text}
    servable = {a: list(v) for a, v in frozen.items() if a != configs.EAGER_ONLY}
    if decide == "paired":
        chosen = pick.decide_paired(servable, rule)
    elif decide == "low":
        chosen = pick.decide_low(servable, cell.batch, rule, jitter_ns, block=rounds)
        chosen = keep.keep_incumbent(chosen, pick.block_times(servable, rounds), cell.batch, incumbent, rule,
                                     jitter_ns)
    else:
        chosen = pick.decide({a: _median(v) for a, v in servable.items()}, rule)
    return CellResult(cell, frozen, statuses, residuals, chosen, errors, tuple(log))


def _open(samples: Mapping[str, list[float]], rule: Any, decide: str, cell: Cell, block: int,
          jitter_ns: float) -> bool:
    """Whether the cell wants more rounds (see measure_cell)."""
    servable = {a: v for a, v in samples.items() if a != configs.EAGER_ONLY and v}
    if decide == "low":
        return (pick.disturbed(servable) > DISTURBED_SHARE
                or bool(pick.near_edge(servable, cell.batch, block, rule, jitter_ns)))
    return pick.ambiguous(servable, rule)


def _median(values: Sequence[float]) -> float | None:
    return median(values) if values else None


def _round(timer: CellTimer, cell: Cell, rng: random.Random, live: list[str], samples: dict[str, list[float]],
           statuses: dict[str, str], t0: float = 0.0) -> dict[str, Any]:
    """One paired round: every live arm once, in a fresh shuffled order; an arm that fails
    leaves the cell (its samples with it). Returns the round's record: seconds since the cell's
    first round, the order, and the timer's readings after it (`snapshot()`, when it has one)."""
    order = list(live)
    rng.shuffle(order)
    record: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 6), "order": list(order)}
    got = timer.sample(cell, order)
    for arm in order:
        value = got.get(arm)
        if isinstance(value, Status) or value is None:
            statuses[arm] = value.value if isinstance(value, Status) else Status.LAUNCH_ERROR.value
            samples.pop(arm, None)
            live.remove(arm)
        else:
            samples[arm].append(float(value))
    snap = getattr(timer, "snapshot", None)
    if snap is not None:
        record.update(snap() or {})
    return record


@dataclass
class LegReport:
    leg: str
    results: list[CellResult] = field(default_factory=list)
    invalid: str = ""  # why the leg is invalid (a foreign process appeared), else ""
    contended: list[int] = field(default_factory=list)  # foreign pids seen under allow_busy


def run(timer: CellTimer, legs: Sequence[str], arch: Any, *, quick: bool = False, rounds: int = MIN_ROUNDS,
        seed: int = 0, rule: Any = pick.LINALG_RULE, dtypes: Sequence[str] = GRID_DTYPES,
        ops: Sequence[str] | None = None, max_arms: int | None = None, allow_busy: bool = False,
        progress: Callable[[str], None] | None = None, decide: str = "median",
        max_rounds: int | None = None, ns: Sequence[int] | None = None,
        jitter_ns: float = pick.LAUNCH_JITTER_NS,
        incumbents: Mapping[tuple[str, str, int, int], tuple[str, str]] | None = None) -> list[LegReport]:
    """Measure every cell of the chosen legs; refuses a busy GPU, invalidates a disturbed leg
    (allow_busy: measures anyway and marks each leg contended). `incumbents`: (op, dt, n, batch)
    -> the table's (winner, native), kept under decide="low" while they tie (keep.py)."""
    busy = timer.foreign_pids()
    if busy and not allow_busy:
        raise BusyGPUError(f"the GPU is busy: foreign compute process(es) {sorted(busy)}; "
                           f"tune on a quiet GPU (or run --prebuild, which times nothing)")
    reports = []
    for leg in legs:
        report = LegReport(leg)
        for cell in cells((leg,), quick, dtypes, ops, ns):
            result = measure_cell(timer, cell, arms(cell, arch, max_arms), rounds, seed, rule,
                                  decide=decide, max_rounds=max_rounds, jitter_ns=jitter_ns,
                                  incumbent=(incumbents or {}).get((cell.op, cell.dt, cell.n, cell.batch)))
            report.results.append(result)
            if progress is not None:
                failed = result.failed()
                progress(f"{cell}: {result.pick.winner} ({result.pick.reason})"
                         + (f"; failed: {'; '.join(failed)}" if failed else ""))
            intruders = timer.foreign_pids()
            if intruders and allow_busy:
                report.contended = sorted(set(report.contended) | set(intruders))
            elif intruders:
                report.invalid = (f"foreign compute process(es) {sorted(intruders)} appeared during "
                                  f"the {leg} leg (at {cell}); its cells are not written")
                break
        reports.append(report)
    return reports


class FakeTimer:
    """A cost function (cell, arm) -> ns per problem, times seeded multiplicative noise (per arm,
    and with round_noise one factor per round all its arms share); arms in
    `failing` fail the gate (status incorrect). For tests and dry reasoning without a GPU."""

    def __init__(self, cost: Callable[[Cell, str], float], *, noise: float = 0.005, seed: int = 0,
                 failing: frozenset[str] = frozenset(),
                 intruder_after: int | None = None, round_noise: float = 0.0, capture_noise: float = 0.0) -> None:
        self.cost, self.noise, self.failing = cost, noise, failing
        self.round_noise = round_noise  # one factor per round, shared by its arms (a clock's drift)
        # one factor per arm and capture (a process's or a graph's own offset), drawn at first use;
        # refresh() starts a new capture (the GPU timer: new graphs and buffers)
        self.capture_noise, self.capture, self._offsets = capture_noise, 0, {}
        self.offset_rng = random.Random(f"capture:{seed}")
        self.rng = random.Random(seed)
        self.samples = 0
        self.intruder_after = intruder_after  # a foreign process appears after this many samples

    def gate(self, cell: Cell, arm: str) -> tuple[Status, float | None]:
        if arm in self.failing:
            return Status.INCORRECT, 1e3
        return Status.OK, 1.0

    def sample(self, cell: Cell, order: Sequence[str]) -> dict[str, float | Status]:
        self.samples += 1
        shared = 1.0 + self.rng.uniform(-self.round_noise, self.round_noise)
        return {a: self.cost(cell, a) * shared * self._offset(cell, a) * (1.0 + self.rng.uniform(-self.noise, self.noise))
                for a in order}

    def _offset(self, cell: Cell, arm: str) -> float:
        if not self.capture_noise:
            return 1.0
        key = (cell, arm, self.capture)
        if key not in self._offsets:
            self._offsets[key] = 1.0 + self.offset_rng.gauss(0.0, self.capture_noise)
        return self._offsets[key]

    def refresh(self, cell: Cell) -> None:
        self.capture += 1

    def foreign_pids(self) -> frozenset[int]:
        if self.intruder_after is not None and self.samples > self.intruder_after:
            return frozenset({4242})
        return frozenset()


def check_complete(reports: Sequence[LegReport], quick: bool, dtypes: Sequence[str] = GRID_DTYPES,
                   ops: Sequence[str] | None = None, ns: Sequence[int] | None = None) -> None:
    """Fail closed: every cell of every valid leg must have a measured decision."""
    for report in reports:
        if report.invalid:
            continue
        want = set(cells((report.leg,), quick, dtypes, ops, ns))
        got = {r.cell for r in report.results}
        if want - got:
            raise MeasurementError(f"the {report.leg} leg is missing cells {sorted(map(str, want - got))[:5]}")
