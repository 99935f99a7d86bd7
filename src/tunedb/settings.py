"""Every TUNEDB_* environment variable: declared once, typed, documented, read on access.

Nothing here reads the environment at import time. Each setting is read when its
accessor is called, so tests can change ``os.environ`` (or use ``override``) and the
next call sees it.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tunedb.errors import SettingsError, SettingsWarning
from tunedb.setting_values import MAX_COMPILE_JOBS  # noqa: F401 - part of the settings' surface
from tunedb.setting_values import count_value as _count_value
from tunedb.setting_values import directory_value as _directory_value
from tunedb.setting_values import file_value as _file_value
from tunedb.setting_values import microseconds_value as _microseconds_value
from tunedb.setting_values import positive_value as _positive_value
from tunedb.setting_values import rows_value as _rows_value
from tunedb.setting_values import user_db_value as _user_db_value


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    doc: str
    allowed: tuple[str, ...] | None = None  # None: free-form
    # free-form values: why `value` is not usable (None when it is)
    check: Callable[[str], "str | None"] | None = None

    def problem(self) -> str | None:
        """Why the current value is refused (naming the variable, the value and what is
        allowed), or None when it is fine."""
        value = os.environ.get(self.name, self.default)
        if self.allowed is not None and value not in self.allowed:
            return f"{self.name}={value!r} is not allowed; use one of {', '.join(self.allowed)}"
        why = self.check(value) if self.check is not None and value else None
        return f"{self.name}={value!r} {why}" if why else None

    def raw(self) -> str:
        if not getattr(_lenient, "on", False):
            _check_environment_once()
            why = self.problem()
            if why:
                raise SettingsError(why)
        return os.environ.get(self.name, self.default)

    def on(self) -> bool:
        """An on/off setting ('0' or '1') is '1'."""
        return self.raw() == "1"


USER_DB = Setting(
    "TUNEDB_USER_DB", "",
    "User-tier directory; empty means <TUNEDB_CACHE_DIR>/v1 (~/.cache/tunedb/v1 by default); 'off' disables the user tier.",
    check=_user_db_value,
)
MODEL_FALLBACK = Setting(
    "TUNEDB_MODEL_FALLBACK", "auto",
    "'auto': the cost-model tier ranks configs for uncovered shapes; '0': tier off.",
    ("auto", "0", "1"),
)
LEAVE_UNMEASURED = Setting(
    "TUNEDB_LEAVE_UNMEASURED", "1",
    "'1': optimize() leaves as written a module whose key no table measured where the cost model "
    "declines it at every probed size (autotune() and prewarm measure those); '0': swap it.",
    ("0", "1"),
)
COMPILE_SET = Setting(
    "TUNEDB_COMPILE_SET", "tuned",
    "'tuned': configs the DB references + default + coverage basis; 'all': whole space.",
    ("tuned", "all"),
)
HEURISTIC = Setting(
    "TUNEDB_HEURISTIC", "1",
    "'0': every shape uses the family default (tiers are bypassed).",
    ("0", "1"),
)
APPROXIMATE = Setting(
    "TUNEDB_APPROXIMATE", "0",
    "'1': arms that approximate the op (tanh GELU for exact GELU) may serve, gate permitting.",
    ("0", "1"),
)
CAPTURE = Setting(
    "TUNEDB_CAPTURE", "",
    "A file path: record every tuned op's shape at run time, for `tunedb census --capture`.",
    check=_file_value,
)
CACHE_DIR = Setting(
    "TUNEDB_CACHE_DIR", "",
    "Root of tunedb's caches (arch profiles, measurement logs, Triton prebuild); "
    "empty means ~/.cache/tunedb.",
    check=_directory_value,
)

JIT_LAUNCH = Setting(
    "TUNEDB_JIT_LAUNCH", "0",
    "'1': every Triton launch goes through JITFunction.run (no direct launch of the compiled binary).",
    ("0", "1"),
)

EAGER_FALLBACK = Setting(
    "TUNEDB_EAGER_FALLBACK", "1",
    "'1': outside CUDA-graph capture, a shape whose kernel is shorter than the host time its tuned "
    "config's launches cost is served by the fallback (the family's eager_fallback hook), and a "
    "torch.compile'd forward without CUDA graphs gets torch's form for it (TUNEDB_COMPILED_GRAPHS); '0': off.",
    ("0", "1"),
)

EAGER_KERNEL_US = Setting(
    "TUNEDB_EAGER_KERNEL_US", "64",
    "Outside CUDA-graph capture, a matrix-multiply shape whose torch kernel is predicted shorter than this many "
    "microseconds is served by torch eagerly whatever its tuned config (captured calls keep the config), "
    "and a sibling group launches eagerly only if its weights take this long to stream: "
    "an eager decode step is host-bound, where a Triton launch's extra host time costs and its GPU saving "
    "buys nothing (session 45, H100: Llama-3-8B layers at batch 1 eagerly 1.110x slower than plain with "
    "the decode configs served, 0.990x with them as F.linear); a compile without CUDA graphs follows the "
    "same line. '0': only the launch-count rule.",
    check=_microseconds_value,
)

COMPILED_GRAPHS = Setting(
    "TUNEDB_COMPILED_GRAPHS", "auto",
    "Whether a torch.compile'd forward runs inside CUDA graphs, read while a compiler traces: 'auto' "
    "(default) takes Inductor's own setting (mode='reduce-overhead' records graphs), and without graphs a "
    "tuned pick whose eager calls torch serves (TUNEDB_EAGER_KERNEL_US) compiles to torch's form; '1': "
    "every compiled forward is captured (compiled in default mode, then captured by hand as serving "
    "engines do), so the tuned picks stay in the compiled code; '0' is 'auto'.",
    ("auto", "0", "1"),
)

COMPILED_SIBLINGS = Setting(
    "TUNEDB_COMPILED_SIBLINGS", "1",
    "Sibling groups (TUNEDB_SIBLINGS) inside a torch.compile'd forward that runs in CUDA graphs, read "
    "while a compiler traces: '1' (default): a group's members called on one tensor compile to one "
    "launch (session 48, H100: reduce-overhead Llama-3-8B layers 10% / 6% less GPU time than compile "
    "alone at b1 / b16, the same host path: docs/runtime.md); '0': each member compiles alone.",
    ("0", "1"),
)

COMPILE_JOBS = Setting(
    "TUNEDB_COMPILE_JOBS", "",
    "Compile processes a build runs ahead of measuring; empty: sized to the free cores and "
    "memory; '0': no pool (each kernel compiles at its first probe).",
    check=_count_value,
)
COMPILE_MEM_MB = Setting(
    "TUNEDB_COMPILE_MEM_MB", "1024",
    "Memory budget of one compile process in MiB (the pool takes MemAvailable / this at most).",
    check=_positive_value,
)

MEASURE_AHEAD = Setting(
    "TUNEDB_MEASURE_AHEAD", "1",
    "'1' (default): `tunedb tune` of a preset with no cached census also measures the mirror census's "
    "plan while the real census runs (the build reuses only identical requests), and the build measures "
    "its own points in the order their compiles finish; '0': it only compiles ahead. On by default "
    "since the H200 measured it (session 13: cold whisper-base 29.9/32.4 s against 35.6/34.1 s).",
    ("0", "1"),
)

TIMELINE = Setting(
    "TUNEDB_TIMELINE", "0",
    "'1': `tunedb tune` also prints when each stage happened, in seconds since the process started "
    "(pool prestart, mirror plan, first/last compile submitted and done, the pass measuring ahead, "
    "census end, build start/end: build/timeline.py); '0': not.",
    ("0", "1"),
)
CENSUS_BESIDE = Setting(
    "TUNEDB_CENSUS_BESIDE", "0",
    "'1': on a GPU machine, `tunedb tune` of a preset with no cached census takes it in a child "
    "process started first, beside its own imports, CUDA start and compiles ahead, and reads it from the census "
    "cache (census/beside.py); '0': it takes the census itself. Off by default: on the H200 it bought "
    "nothing measurable (session 13 A1).",
    ("0", "1"),
)

MODEL_LOCAL_BAND = Setting(
    "TUNEDB_MODEL_LOCAL_BAND", "0",
    "'1': the cost-model tier of the matrix-multiply family also serves a config on its local band (confidence.py, "
    "rule 3) where the regime rule declines; '0': regime rule only. Off by default: held out by model "
    "on an earlier H200 build log, its inner splits served two points 66-67% slower than the oracle.",
    ("0", "1"),
)

CHECK_INPUTS = Setting(
    "TUNEDB_CHECK_INPUTS", "0",
    "'1': check index inputs' values on CUDA tensors too (group_gemm expert ids), a device sync "
    "per call (CPU tensors are always checked: free there). Read at each database epoch.",
    ("0", "1"),
)
CHAIN_PDL = Setting(
    "TUNEDB_CHAIN_PDL", "0",
    "'1': inside a CUDA-graph capture, a decode-lane kernel (M <= 16) whose call directly follows another "
    "of tunedb's decode-lane launches, with an nn.Parameter weight, is launched as its config's PDL twin "
    "(the family's pdl_pair hook; runtime/capture_chain.pdl_switch). Default '0': every call launches the config "
    "as measured, and a measured `_pdl` config of the matrix-multiply family's decode lane runs without PDL "
    "(it reads the weight before the kernel ahead finishes; scaled_mm's `_pdl` configs are not switched). "
    "Read when a shape is first bound and at each captured call. Off by default: on the H200 it won back to back (bench/gv_prefetch.py) but lost "
    "in Llama-3-8B decode (session 34, bench/chain_pdl_e2e.py: 1.086x plain without it, 1.056x with it).",
    ("0", "1"),
)
SIBLINGS = Setting(
    "TUNEDB_SIBLINGS", "1",
    "'1': projections that optimize() finds called on the same tensor in a module's code (q, k and v "
    "of an attention, gate and up of an MLP; two or three) run as one launch on a GPU with a shipped arch "
    "profile, each writing its own output: in a CUDA-graph capture at 1 to TUNEDB_SIBLING_ROWS rows (and "
    "in a torch.compile'd forward in graphs: TUNEDB_COMPILED_SIBLINGS), eagerly at one row with a "
    "member tunedb serves. "
    "'0': each runs alone. Read when optimize() runs.",
    ("0", "1"),
)


SIBLING_ROWS = Setting(
    "TUNEDB_SIBLING_ROWS", "16",
    "The most rows (batch x tokens) at which a sibling group runs as one launch: 1-16; past one row "
    "the group's tensor-core path (measured: 1.03-3.5x cuBLAS one by one at 2-16 rows over eleven "
    "groups; '1' keeps batch-1 decode only). Read when optimize() runs.",
    check=_rows_value,
)
SIBLING_SPLIT = Setting(
    "TUNEDB_SIBLING_SPLIT", "auto",
    "'auto' (default): at 2-16 rows a sibling group of at most half as many weight slabs as the GPU has "
    "SMs (tensor-parallel shards, MLA down-projections) splits K into runs reduced in the kernel in a "
    "fixed order, up to one program an SM, each run four K tiles at least (measured 1.3-1.7x faster on "
    "such groups, no other group changed); '1': K never split. Read when optimize() runs.",
    ("1", "auto"),
)
ALL: tuple[Setting, ...] = (USER_DB, MODEL_FALLBACK, LEAVE_UNMEASURED, COMPILE_SET, HEURISTIC, APPROXIMATE,
                            CAPTURE, CACHE_DIR, JIT_LAUNCH, COMPILE_JOBS, COMPILE_MEM_MB,
                            EAGER_FALLBACK, EAGER_KERNEL_US, COMPILED_GRAPHS, COMPILED_SIBLINGS, MEASURE_AHEAD, TIMELINE, CENSUS_BESIDE, MODEL_LOCAL_BAND,
                            CHECK_INPUTS, CHAIN_PDL, SIBLINGS, SIBLING_ROWS, SIBLING_SPLIT)


_checked: set[tuple[str | None, ...]] = set()
_check_lock = threading.Lock()
_lenient = threading.local()


def problems() -> dict[str, str]:
    """Every TUNEDB_* variable whose value is refused: name -> why (what `tunedb status` marks)."""
    return {s.name: why for s in ALL if (why := s.problem()) is not None}


def unknown() -> dict[str, str]:
    """Every TUNEDB_* variable set that names no setting: name -> what to do (the closest name)."""
    import difflib

    known = [s.name for s in ALL]
    near = {n: difflib.get_close_matches(n, known, n=1, cutoff=0.75) for n in sorted(os.environ)
            if n.startswith("TUNEDB_") and n not in known}
    return {n: f"{n} is not a tunedb setting (nothing reads it)" + (f"; did you mean {c[0]}?" if c else
                                                                     "; `tunedb status` lists the settings")
            for n, c in near.items()}


def check_all() -> None:
    """Refuse the environment when any TUNEDB_* variable holds a value it does not accept, naming
    every one (the CLI calls this at start; the package on its first read of any setting); warn
    (SettingsWarning) of each TUNEDB_* name that is no setting."""
    bad = problems()
    if bad:
        raise SettingsError("; ".join(bad.values()))
    for why in unknown().values():
        warnings.warn(why, SettingsWarning, stacklevel=2)


def _check_environment_once() -> None:
    # The first read of any setting checks them all (a bad value refused up front, not when and if
    # its code path runs), once per distinct environment
    key = tuple(os.environ.get(s.name) for s in ALL)  # (every setting read: no scan of the environment)
    if key in _checked:
        return
    check_all()
    with _check_lock:
        _checked.add(key)


@contextlib.contextmanager
def lenient() -> Iterator[None]:
    """Read settings without refusing bad values (`tunedb status`, which reports them instead)."""
    saved = getattr(_lenient, "on", False)
    _lenient.on = True
    try:
        yield
    finally:
        _lenient.on = saved


def _expand(raw: str) -> Path:
    """raw with ~ expanded; as written where it cannot be (an unknown ~name: the setting's check
    refuses it, and `tunedb status`, which reads leniently, shows it as written)."""
    try:
        return Path(raw).expanduser()
    except RuntimeError:
        return Path(raw)


def cache_root() -> Path:
    raw = CACHE_DIR.raw()
    return _expand(raw) if raw else Path.home() / ".cache" / "tunedb"


def triton_cache_dir() -> Path:
    """Where Triton's kernel cache lives: TRITON_CACHE_DIR when set (Triton's own variable), else
    <cache_root>/triton, which `tunedb prebuild` fills and the GEMM launcher points Triton at."""
    raw = os.environ.get("TRITON_CACHE_DIR", "")
    return _expand(raw) if raw else cache_root() / "triton"


def user_db_dir() -> Path | None:
    """The user tier's root (holding <arch>/<family>.json), or None when disabled."""
    raw = USER_DB.raw()
    if raw.strip().lower() == "off":
        return None
    if raw:
        return _expand(raw)
    return cache_root() / "v1"


def model_fallback_enabled() -> bool:
    return MODEL_FALLBACK.raw() != "0"


def compile_set() -> str:
    return COMPILE_SET.raw()


def heuristic_enabled() -> bool:
    return HEURISTIC.on()


def approximate_allowed() -> bool:
    return APPROXIMATE.on()


def capture_path() -> Path | None:
    raw = CAPTURE.raw()
    return _expand(raw) if raw else None


def jit_launch() -> bool:
    return JIT_LAUNCH.on()


def leave_unmeasured() -> bool:
    return LEAVE_UNMEASURED.on()


def eager_fallback_enabled() -> bool:
    return EAGER_FALLBACK.on()


def eager_kernel_us() -> int:
    """TUNEDB_EAGER_KERNEL_US: below this predicted torch kernel time, torch serves eager calls."""
    return int(EAGER_KERNEL_US.raw().strip() or EAGER_KERNEL_US.default)  # empty: the default, as every numeric setting


def chain_pdl_enabled() -> bool:
    return CHAIN_PDL.on()


def siblings_enabled() -> bool:
    return SIBLINGS.on()


def sibling_rows() -> int:
    return int(SIBLING_ROWS.raw() or SIBLING_ROWS.default)  # set but empty: the default


def compiled_graphs_forced() -> bool:
    return COMPILED_GRAPHS.raw() == "1"


def compiled_siblings_on() -> bool:
    return COMPILED_SIBLINGS.raw() == "1"


def sibling_split_auto() -> bool:
    return SIBLING_SPLIT.raw() == "auto"


def measure_ahead_enabled() -> bool:
    return MEASURE_AHEAD.on()


def timeline_enabled() -> bool:
    return TIMELINE.on()


def census_beside_enabled() -> bool:
    return CENSUS_BESIDE.on()


def check_inputs() -> bool:
    return CHECK_INPUTS.on()


def model_local_band_enabled() -> bool:
    return MODEL_LOCAL_BAND.on()


def compile_jobs() -> int | None:
    """TUNEDB_COMPILE_JOBS as a number, None when unset (the pool sizes itself)."""
    raw = COMPILE_JOBS.raw()
    return int(raw) if raw else None


def compile_mem_mb() -> int:
    return int(COMPILE_MEM_MB.raw() or COMPILE_MEM_MB.default)  # set but empty: the default


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily set TUNEDB_* variables by short name: override(USER_DB="off")."""
    by_short: dict[str, Setting] = {s.name.removeprefix("TUNEDB_"): s for s in ALL}
    saved: dict[str, str | None] = {}
    for short, value in values.items():
        if short not in by_short:
            raise SettingsError(f"unknown setting {short!r}; known: {', '.join(by_short)}")
        name = by_short[short].name
        saved[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def describe() -> list[tuple[str, str, str]]:
    """(name, current raw value or default, doc) for every setting: for `tunedb status`."""
    out = []
    for s in ALL:
        out.append((s.name, os.environ.get(s.name, s.default), s.doc))
    return out


