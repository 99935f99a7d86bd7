"""Ahead-of-time compilation of GEMM Triton configs, without a GPU, into Triton's persistent cache.

Each job runs the kernel's own JIT warmup path in a worker process whose Triton driver is
replaced by a stand-in that reports the target (e.g. cuda sm90, warp size 32). The JIT builds
exactly the specialisation, options and cache key a real launch on that target builds, so a GPU
machine that shares the cache directory (and runs the same Triton and ptxas) compiles nothing.
Triton keys its cache by source, options, target and tool versions, never by device.

Needs triton only (no torch), so it also runs in a bare `pip install triton==X` environment.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from tunedb.input_files import read_text
from tunedb.families.gemm import configs
from tunedb.families.gemm.kernel_specs import INTS, POINTERS, specs
from tunedb.database.store import write_atomic
from tunedb.errors import BuildError
from tunedb.records import Config, Signature

DTYPES = ("fp16", "bf16")
_TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "f32": "float32", "i32": "int32"}
_SIG_TEXT = re.compile(r"gemm\|op=[a-z_]+\|dt=[a-z0-9]+(?:\|[A-Za-z]+=[A-Za-z0-9_.\-]+)*")


def triton_cache_dir() -> Path:
    """TRITON_CACHE_DIR when the user set it, else <tunedb cache root>/triton."""
    from tunedb import settings

    return settings.triton_cache_dir()


def point_triton_cache() -> Path:
    """Make Triton (in this process and its children) use triton_cache_dir(); returns it."""
    path = triton_cache_dir()
    os.environ["TRITON_CACHE_DIR"] = str(path)
    return path


@dataclass(frozen=True, order=True)
class Job:
    """One binary to build: a config for one dtype and one N/K divisibility-by-16 class."""

    config_id: str
    dt: str
    n_aligned: bool = True
    k_aligned: bool = True


def job_for(config_id: str, dt: str, sig: Signature) -> Job:
    """The binary `config_id` needs for `sig` in dtype `dt` (its N/K divisibility class)."""
    return Job(config_id, dt, sig.get("N") % 16 == 0, sig.get("K") % 16 == 0)


def jobs_for(configs_: Iterable[Config], dtypes: Sequence[str] = DTYPES) -> list[Job]:
    """Aligned N and K (the common case) for every config and dtype."""
    return sorted({Job(c.id, dt) for c in configs_ if not c.is_sentinel for dt in dtypes})


def signatures_in(path: Path) -> list[Signature]:
    """Every GEMM signature written in a census (or database) file, whatever its layout.
    BuildError for a file that is not JSON (a truncated or corrupt one: its signature text is
    not to be trusted, and "names no signature" would hide what is wrong)."""
    try:
        text = read_text(path)
        json.loads(text)
    except UnicodeDecodeError as exc:
        raise BuildError(f"census file {path} is not a text (UTF-8) file: byte {exc.start} cannot be "
                         f"decoded; give a census or database file (JSON)") from exc
    except json.JSONDecodeError as exc:
        what = "is empty" if not text.strip() else f"is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise BuildError(f"census file {path} {what}; give a census (`tunedb census ... --out FILE`) "
                         f"or database file (JSON)") from exc
    except RecursionError:
        raise BuildError(f"census file {path} is nested too deeply to read; give a census or database "
                         f"file (JSON)") from None
    except ValueError as exc:  # valid JSON Python will not read (an integer of over 4300 digits)
        raise BuildError(f"census file {path} cannot be read: {exc}; give a census or database "
                         f"file (JSON)") from None
    out = {}
    for found in _SIG_TEXT.findall(text):
        try:
            sig = Signature.parse(found)
        except ValueError:
            continue
        if configs.sig_reason(sig) is None:
            out[sig.format()] = sig
    return list(out.values())


def jobs_for_census(sigs: Iterable[Signature], arch_family: str) -> list[Job]:
    """The binaries a build of these signatures could load: every valid config per signature,
    for each concrete dtype and the signature's own N/K alignment class."""
    arch = _planning_profile(arch_family)
    jobs: set[Job] = set()
    for sig in sigs:
        dts = DTYPES if sig.dt == "half" else (sig.dt,)
        # every-M candidates, and the decode lane's (valid at M <= 16 only)
        for cfg in {*configs.candidates(sig, None, arch), *configs.candidates(sig, 1, arch, ["triton_decode"])}:
            for dt in dts:
                jobs.add(job_for(cfg.id, dt, sig))
    return sorted(jobs)


def _planning_profile(arch_family: str):
    from tunedb import arch as _arch
    from tunedb.records import ArchProfile

    if arch_family in _arch.SHIPPED_ARCHES or arch_family in _arch.PLANNING_LIMITS:
        return _arch.planning_profile(arch_family)
    return ArchProfile(arch_family, "planning", 0, 0, configs.smem_per_block(arch_family), 0, 0,
                       0.0, 0.0, 0.0, 0.0, 0.0, "planning")


def ptxas_problem(capability: int) -> str | None:
    """Why the installed Triton cannot assemble for `capability` (its bundled ptxas is missing
    or refuses to run), or None when it can."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, get_ptxas_version

        tool = get_ptxas(capability)
        path = getattr(tool, "path", None)
        if not path or not os.path.exists(path):
            return f"no ptxas for sm{capability} in triton {triton_version()} (looked for {path})"
        get_ptxas_version(capability)
    except Exception as exc:  # noqa: BLE001 - any failure to find or run it is the reason
        return f"ptxas for sm{capability} unusable in triton {triton_version()}: {type(exc).__name__}: {exc}"
    return None


# ---------------------------------------------------------------- the worker side

class _Dtype:
    """Stands in for torch.<name>: Triton reads a pointer argument's dtype through str()."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


# One instance per dtype for the life of the process: Triton's specialiser caches by dtype object,
# and a freed object's id may be reused by the next one.
_DTYPES = {dt: _Dtype(name) for dt, name in _TORCH_DTYPE.items()}


class _Pointer:
    """Stands in for a 16-byte-aligned tensor (what the caching allocator hands out)."""

    def __init__(self, dt: str) -> None:
        self.dtype = _DTYPES[dt]

    @staticmethod
    def data_ptr() -> int:
        return 1 << 20


class _TargetDriver:
    """A Triton driver stand-in: reports the target, never touches a device."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def is_active(self) -> bool:
        return True


def _init_worker(capability: int, cache_dir: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(_TargetDriver(GPUTarget("cuda", capability, 32)))


def _sample_ints(job: Job) -> dict[str, int]:
    # Values only matter through Triton's specialisation (divisible by 16 or not); M is never specialised.
    return {"M": 64, "N": 4096 if job.n_aligned else 4104, "K": 4096 if job.k_aligned else 4104,
            "HAS_BIAS": 0, "ACT": 0}


def compile_job(job: Job) -> dict:
    """Compile one job's kernels (in a worker whose driver reports the target)."""
    start = time.perf_counter()
    try:
        cfg = configs.parse(job.config_id)
        ints = _sample_ints(job)
        if cfg.param("kernel") == "gemv":  # one binary per padded row count it launches
            from tunedb.families.gemm import prebuild_gemv

            for mp in prebuild_gemv.configs_gemv.launch_rows(cfg):
                prebuild_gemv.warm(cfg, mp, job.dt, job.n_aligned, job.k_aligned)
        elif cfg.lane == "triton_decode":
            from tunedb.families.gemm import kernels_decode as dec

            args = [_Pointer(job.dt if p == "io" else p) for p in dec.POINTERS]
            args += [min(ints[name], dec.BM_PAD) if name == "M" else ints[name] for name in dec.INTS]
            dec.spec(cfg).kernel.warmup(*args, grid=(1,), **dec.spec(cfg).kwargs())
        for spec in (() if cfg.lane == "triton_decode" else specs(cfg)):
            args = [_Pointer(job.dt if p == "io" else "f32") for p in POINTERS[spec.name]]
            args += [ints[name] for name in INTS[spec.name]]
            spec.kernel.warmup(*args, grid=(1,), **spec.kwargs())
    except Exception as exc:  # a config that fails to compile is reported, not fatal
        return {"job": asdict(job), "ok": False, "seconds": time.perf_counter() - start,
                "error": f"{type(exc).__name__}: {_last_lines(str(exc))}"}
    return {"job": asdict(job), "ok": True, "seconds": time.perf_counter() - start, "error": ""}


def _last_lines(text: str, limit: int = 600) -> str:
    # Triton's CompilationError leads with the kernel source; the cause is at the end.
    return text if len(text) <= limit else "..." + text[-limit:]


# ---------------------------------------------------------------- the driver side

def triton_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "absent"


def key_components(capability: int) -> dict:
    """What Triton folds into every cache key besides the kernel itself: its own build (Python
    sources and libtriton, which differs per Python version's wheel), ptxas, and the env vars it
    treats as cache-invalidating. The GPU machine must match all of them for a cache hit."""
    import platform

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import triton_key

    return {"triton_key": hashlib.sha256(triton_key().encode()).hexdigest()[:16],
            "ptxas": get_ptxas_version(capability).strip().splitlines()[-1],
            "env": dict(sorted(get_cache_invalidating_env_vars().items())),
            "python": platform.python_version()}


def run_jobs(jobs: Sequence[Job], arch_family: str, n_jobs: int, progress=None) -> dict:
    """Compile `jobs` for `arch_family` with n_jobs worker processes; returns a summary record,
    also written (atomically) as tunedb-prebuild-<arch>.json in the cache directory."""
    cache = point_triton_cache()
    cache.mkdir(parents=True, exist_ok=True)
    cap = configs.capability(arch_family)
    start = time.perf_counter()
    results = []
    # spawn: the parent may have CUDA or a real Triton driver loaded; workers must start clean.
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, n_jobs), mp_context=ctx,
                                initializer=_init_worker, initargs=(cap, str(cache))) as pool:
        futures = [pool.submit(compile_job, job) for job in jobs]
        for fut in cf.as_completed(futures):
            res = fut.result()
            results.append(res)
            if progress is not None:
                progress(res, len(results), len(jobs))
    summary = {
        "arch_family": arch_family, "target": f"cuda:{cap}:32", "triton": triton_version(),
        "cache_dir": str(cache), "jobs": len(jobs), "ok": sum(r["ok"] for r in results),
        "failed": [r for r in results if not r["ok"]], "seconds": round(time.perf_counter() - start, 2),
        "configs": sorted({r["job"]["config_id"] for r in results if r["ok"]}),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "key": key_components(cap),
    }
    write_atomic(cache / f"tunedb-prebuild-{arch_family}.json", json.dumps(summary, indent=1))
    return summary


def relocate_cache(cache: Path, old_root: str) -> int:
    """Rewrite Triton's group files after the cache moved from `old_root` to `cache`.

    Triton records each binary's files by absolute path (__grp__*.json "child_paths"); a cache
    carried to another machine under another path would miss on every kernel. Returns the
    number of group files rewritten. Sharing the cache at the same path needs none of this.
    """
    old_root, new_root, fixed = str(old_root).rstrip("/"), str(cache).rstrip("/"), 0
    if old_root == new_root:
        return 0
    for grp in Path(cache).glob("*/__grp__*.json"):
        data = json.loads(grp.read_text())
        paths = data.get("child_paths") or {}
        moved = {k: new_root + v[len(old_root):] if v.startswith(old_root + "/") else v for k, v in paths.items()}
        if moved != paths:
            data["child_paths"] = moved
            write_atomic(grp, json.dumps(data))
            fixed += 1
    return fixed


def prebuilt_configs(arch_family: str) -> set[str]:
    """Configs `tunedb prebuild` compiled into the Triton cache this process uses, for this
    Triton (pointing Triton at that cache as a side effect, so workers started later find it)."""
    cache = point_triton_cache()
    try:
        summary = json.loads((cache / f"tunedb-prebuild-{arch_family}.json").read_text())
    except (OSError, ValueError):
        return set()
    if summary.get("triton") != triton_version():
        return set()
    return set(summary.get("configs") or ())
