"""ArchProfile: device ceilings, queried and micro-benchmarked, cached per SKU; shipped per arch family.

Queried: SMs, shared memory per SM and per block (the opt-in maximum), L2, registers per SM
(torch's device properties, the rest from the CUDA driver's attribute queries). Measured once
per SKU and cached in settings.cache_root()/arch/<sku-slug>.json: DRAM copy bandwidth (bytes
read + written), dense fp16/bf16 tensor throughput (a large matmul on random data), and the
per-kernel launch cost inside a CUDA graph and eagerly on the host. The shipped profiles
(package data) let a CPU-only machine plan for an architecture.

    python -m tunedb.arch --measure [--json] [--out PATH]   measure this GPU (refreshes the cache)
    python -m tunedb.arch [--json]                          the current profile (cached or queried)
    python -m tunedb.arch --shipped sm90 [--json]           a shipped profile
torch is imported only inside the functions that query or measure the device.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import json
import re
import sys
import time
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from tunedb import settings
from tunedb.errors import ConfigError, MeasurementError, TunedbError
from tunedb.records import ArchProfile

SHIPPED_ARCHES: tuple[str, ...] = ("sm90",)
# Vendor figures (dense, no sparsity) to put measured ceilings in perspective.
PUBLISHED: dict[str, dict[str, float]] = {
    "NVIDIA H200": {"dram_bw_gbs": 4800.0, "bf16_tflops": 989.0, "fp16_tflops": 989.0},
    "NVIDIA H100 80GB HBM3": {"dram_bw_gbs": 3350.0, "bf16_tflops": 989.0, "fp16_tflops": 989.0},
}
# CUdevice_attribute values (cuda.h) for what torch's properties may lack.
_CU_MAX_SHARED_PER_SM = 81
_CU_MAX_REGS_PER_SM = 82
_CU_MAX_SHARED_PER_BLOCK_OPTIN = 97

_MEMO: dict[str, ArchProfile] = {}


@functools.lru_cache(maxsize=None)  # package data: read once (ArchProfile is frozen)
def shipped_profile(arch_family: str) -> ArchProfile:
    """The profile shipped as package data for `arch_family` (so a CPU machine can plan for it)."""
    if arch_family not in SHIPPED_ARCHES:
        raise TunedbError(
            f"no shipped arch profile for {arch_family!r}; shipped: {', '.join(SHIPPED_ARCHES)}"
        )
    text = resources.files("tunedb.data").joinpath(f"arch_{arch_family}.json").read_text()
    return ArchProfile.from_json(json.loads(text))


# Per compute capability, what the CUDA programming guide's table of technical specifications
# gives (bytes): shared memory per SM and the opt-in maximum per block; 64 K registers per SM
# on all of them. A CPU machine plans and compiles for an arch it has no measured profile of
# with these (validity predicates need only the limits; speed ceilings stay 0: unmeasured).
PLANNING_LIMITS: dict[str, tuple[int, int]] = {
    "sm80": (167936, 166912), "sm86": (102400, 101376), "sm87": (167936, 166912),
    "sm89": (102400, 101376), "sm90": (233472, 232448), "sm100": (233472, 232448),
    "sm103": (233472, 232448), "sm120": (102400, 101376),
}



def planning_smem_per_block(arch_family: str) -> int:
    """The opt-in shared memory per block a config space plans for at `arch_family`: its
    PLANNING_LIMITS entry, else 101376 (the smallest of them); ConfigError for a name that is
    not sm<digits>."""
    if not re.match(r"^sm\d+a?$", arch_family or ""):
        raise ConfigError(f"bad arch family {arch_family!r}: expected sm<digits> such as sm90")
    return PLANNING_LIMITS.get(arch_family, (0, 101376))[1]

def planning_profile(arch_family: str) -> ArchProfile:
    """The shipped profile of `arch_family` when there is one, else its limits from
    PLANNING_LIMITS with no measured ceilings (source says so): enough for validity predicates
    and `tunedb prebuild --arch`, not for a cost model's predictions."""
    if arch_family in SHIPPED_ARCHES:
        return shipped_profile(arch_family)
    if arch_family not in PLANNING_LIMITS:
        raise TunedbError(f"no shipped profile or planning limits for {arch_family!r}; known: "
                          f"{', '.join(sorted(set(SHIPPED_ARCHES) | set(PLANNING_LIMITS)))}")
    per_sm, per_block = PLANNING_LIMITS[arch_family]
    return ArchProfile(arch_family, f"any {arch_family} GPU", 0, per_sm, per_block, 0, 65536,
                       0.0, 0.0, 0.0, 0.0, 0.0,
                       "planning: CUDA's shared-memory limits for the compute capability; nothing measured")


def arch_family_of(major: int, minor: int) -> str:
    return f"sm{major}{minor}"


def sku_slug(sku: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the cache file's stem."""
    slug = re.sub(r"[^a-z0-9]+", "-", sku.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU name {sku!r} has no characters to name a cache file by")
    return slug


def cache_path(sku: str) -> Path:
    return settings.cache_root() / "arch" / f"{sku_slug(sku)}.json"


def write_profile(profile: ArchProfile, path: str | Path) -> Path:
    """Write `profile` as JSON (the shipped format), atomically."""
    from tunedb.database import write_atomic

    path = Path(path)
    write_atomic(path, json.dumps(profile.to_json(), indent=2) + "\n")
    return path


def load_profile(path: str | Path) -> ArchProfile:
    """A profile from a JSON file in the shipped format; ValueError naming the file when unusable."""
    path = Path(path)
    try:
        return ArchProfile.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"arch profile {path} is unusable: {exc}") from exc


def _driver_attr(index: int, attr: int) -> int | None:
    """cuDeviceGetAttribute through libcuda (None when the driver cannot be reached)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        dev, value = ctypes.c_int(), ctypes.c_int()
        if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), index):
            return None
        if lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev):
            return None
        return int(value.value)
    except (OSError, AttributeError):
        return None


def _device_index(device: Any = None) -> int:
    import torch

    if not torch.cuda.is_available():
        raise MeasurementError(
            "no CUDA device: querying or measuring an arch profile needs one; on a CPU machine "
            "use shipped_profile(arch_family) (shipped: " + ", ".join(SHIPPED_ARCHES) + ")"
        )
    if device is None:
        return torch.cuda.current_device()
    return torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index or 0


def queried(device: Any = None) -> dict[str, Any]:
    """The queried fields of the profile (no micro-benchmark)."""
    import torch

    index = _device_index(device)
    props = torch.cuda.get_device_properties(index)

    def first(*values: Any) -> int:
        for v in values:
            if v:
                return int(v)
        raise MeasurementError(f"cannot query a device attribute of {props.name}")

    return {
        "arch_family": arch_family_of(props.major, props.minor),
        "sku": props.name,
        "sms": int(props.multi_processor_count),
        "smem_per_sm": first(getattr(props, "shared_memory_per_multiprocessor", 0),
                             _driver_attr(index, _CU_MAX_SHARED_PER_SM)),
        "smem_per_block": first(getattr(props, "shared_memory_per_block_optin", 0),
                                _driver_attr(index, _CU_MAX_SHARED_PER_BLOCK_OPTIN),
                                getattr(props, "shared_memory_per_block", 0)),
        "l2_bytes": int(props.L2_cache_size),
        "regs_per_sm": first(getattr(props, "regs_per_multiprocessor", 0),
                             _driver_attr(index, _CU_MAX_REGS_PER_SM)),
    }


def _time_ms(fn: Any, reps: int, inner: int = 1) -> float:
    """Median milliseconds of `inner` back-to-back calls of fn, over `reps` event-timed runs."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    times.sort()
    return times[len(times) // 2]


def measure_copy_bandwidth(index: int, nbytes: int = 2**30) -> float:
    """GB/s of a device-to-device copy far larger than L2, counting bytes read + written."""
    import torch

    free = torch.cuda.mem_get_info(index)[0]
    nbytes = max(2**24, min(nbytes, free // 4))
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{index}").uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = _time_ms(lambda: dst.copy_(src), reps=7, inner=5)
    return round(2 * nbytes / (ms * 1e-3) / 1e9, 1)


def measure_matmul_tflops(index: int, dtype_name: str, n: int = 8192) -> float:
    """Dense tensor-core TFLOP/s of an n x n x n matmul on random normal data."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    a = torch.randn(n, n, device=f"cuda:{index}", dtype=dtype)
    b = torch.randn(n, n, device=f"cuda:{index}", dtype=dtype)
    c = torch.empty(n, n, device=f"cuda:{index}", dtype=dtype)
    # Warm up for about half a second: on a machine just started the SM clock sits at idle
    # (345 MHz on the H200) and the first timed products read ~9% low.
    until = time.perf_counter() + 0.5
    while time.perf_counter() < until:
        for _ in range(10):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize(index)
    ms = _time_ms(lambda: torch.mm(a, b, out=c), reps=7, inner=5)
    return round(2 * n**3 / (ms * 1e-3) / 1e12, 1)


def measure_launch_us(index: int, kernels: int = 200) -> tuple[float, float]:
    """(per-kernel cost inside a CUDA graph, eager host issue cost per launch), microseconds."""
    import torch

    buf = torch.ones(1, device=f"cuda:{index}")
    for _ in range(3):
        buf.add_(1.0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            buf.add_(1.0)
    graph.replay()
    graph_us = _time_ms(graph.replay, reps=9) * 1000.0 / kernels
    host = []
    for _ in range(7):
        torch.cuda.synchronize(index)
        t0 = time.perf_counter()
        for _ in range(kernels):
            buf.add_(1.0)
        host.append((time.perf_counter() - t0) * 1e6 / kernels)
    torch.cuda.synchronize(index)
    host.sort()
    return round(graph_us, 3), round(host[len(host) // 2], 3)


def measure_profile(device: Any = None) -> ArchProfile:
    """Query and micro-benchmark the device now (about ten seconds on an H200)."""
    import torch

    index = _device_index(device)
    with torch.cuda.device(index):
        fields = queried(index)
        bw = measure_copy_bandwidth(index)
        bf16 = measure_matmul_tflops(index, "bf16")
        fp16 = measure_matmul_tflops(index, "fp16")
        graph_us, eager_us = measure_launch_us(index)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = (f"measured by `python -m tunedb.arch --measure` on {when} "
              f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    return ArchProfile(**fields, dram_bw_gbs=bw, bf16_tflops=bf16, fp16_tflops=fp16,
                       launch_us_graph=graph_us, launch_us_eager=eager_us, source=source)


def current_profile(measure: bool = True, *, refresh: bool = False, device: Any = None) -> ArchProfile:
    """This GPU's profile: from the per-SKU cache, else measured once and cached (measure=True),
    else the queried fields with the shipped ceilings of its arch family (source 'queried')."""
    fields = queried(device)
    sku = fields["sku"]
    if not refresh and sku in _MEMO:
        return _MEMO[sku]
    path = cache_path(sku)
    if not refresh and path.exists():
        try:
            profile = load_profile(path)
            if profile.sku == sku:
                _MEMO[sku] = profile
                return profile
            warnings.warn(f"arch cache {path} is for {profile.sku!r}, not {sku!r}; re-measuring",
                          RuntimeWarning, stacklevel=2)
        except ValueError as exc:
            warnings.warn(f"{exc}; re-measuring", RuntimeWarning, stacklevel=2)
    if measure:
        profile = measure_profile(device)
        write_profile(profile, path)
        _MEMO[sku] = profile
        return profile
    family = fields["arch_family"]
    if family not in SHIPPED_ARCHES:
        raise MeasurementError(
            f"{sku} ({family}) has no cached or shipped profile; measure it with "
            "current_profile(measure=True) or `python -m tunedb.arch --measure`"
        )
    ceilings = shipped_profile(family).to_json()
    keep = ("dram_bw_gbs", "bf16_tflops", "fp16_tflops", "launch_us_graph", "launch_us_eager")
    return ArchProfile(**fields, **{k: ceilings[k] for k in keep},
                       source=f"queried; ceilings from the shipped {family} profile")


def format_profile(profile: ArchProfile) -> str:
    published = PUBLISHED.get(profile.sku, {})
    lines = [f"{profile.sku} ({profile.arch_family})"]
    for key, value in profile.to_json().items():
        if key in ("sku", "arch_family", "source"):
            continue
        note = ""
        if key in published:
            note = f"   ({100.0 * value / published[key]:.0f}% of the published {published[key]:g})"
        lines.append(f"  {key:<16} {value}{note}")
    lines.append(f"  source           {profile.source}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tunedb.arch", description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true",
                        help="micro-benchmark this GPU now and refresh the per-SKU cache")
    parser.add_argument("--shipped", metavar="ARCH", help=f"show a shipped profile ({', '.join(SHIPPED_ARCHES)})")
    parser.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", type=Path, help="also write the profile to this file (the shipped format)")
    args = parser.parse_args(argv)
    try:
        if args.shipped:
            profile = shipped_profile(args.shipped)
        else:
            profile = current_profile(measure=args.measure, refresh=args.measure, device=args.device)
    except TunedbError as exc:
        print(f"tunedb.arch: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(profile.to_json(), indent=2) if args.json else format_profile(profile))
    if args.out:
        write_profile(profile, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
