"""GEMM's prebuild hook: `tunedb prebuild --family gemm` compiles Triton configs for a target,
without a GPU, into the persistent Triton cache (commands/prebuild.py parses the arguments).

Needs only Triton (no torch). The cache is TRITON_CACHE_DIR, else <cache root>/triton.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunedb.errors import BuildError
from tunedb.records import SENTINELS


def _referenced_ids(path: Path | None) -> list[str]:
    if path is None:
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BuildError(f"cannot read database file {path}: {exc}") from exc
    ids = list((data.get("configs") or {}).keys()) if isinstance(data, dict) else []
    for entry in (data.get("entries") or {}).values() if isinstance(data, dict) else ():
        for region in entry.get("regions", []) if isinstance(entry, dict) else ():
            if isinstance(region, list) and len(region) == 2 and isinstance(region[1], str):
                ids.append(region[1])
    return ids


def _planned_jobs(args: argparse.Namespace) -> list:
    """The binaries a `tunedb build` of this census loads: its plan's configs (cost-model top-k
    union forced arms, per point), in the dtype the build measures and each N/K alignment class."""
    from tunedb import arch, pipeline
    from tunedb.families.gemm import configs, prebuild

    opts = pipeline.BuildOptions(arch_family=args.arch, thin=args.thin, max_points=args.max_points,
                                 dry_run=True)
    plans, _ = pipeline.plan_build([(str(args.census), pipeline.read_census(args.census))], opts,
                                   arch.shipped_profile(args.arch))
    jobs = []
    for plan in plans:
        sig = plan.signature
        dt = "fp16" if sig.dt == "fp16" else "bf16"  # a dt=half signature is measured in bf16
        for cid in plan.config_ids():
            if cid in SENTINELS:
                cfg = configs.default_config(sig) if cid == "default" else None
            else:
                cfg = configs.parse(cid)
            if cfg is not None:
                jobs.append(prebuild.job_for(cfg.id, dt, sig))
    return jobs


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise BuildError(f"--jobs must be >= 1, got {args.jobs}")
    from tunedb import settings
    from tunedb.families.gemm import configs, prebuild

    try:
        configs.capability(args.arch)
    except ValueError as exc:
        raise BuildError(str(exc)) from exc
    if args.census is not None:
        if not args.census.is_file():
            raise BuildError(f"census file {args.census} does not exist")
        sigs = prebuild.signatures_in(args.census)
        if not sigs:
            raise BuildError(f"census file {args.census} names no GEMM signature (gemm|op=...|dt=...|N=..|K=..)")
        if settings.compile_set() == "all":
            jobs = prebuild.jobs_for(configs.config_space(args.arch))
        elif args.every_valid:
            jobs = prebuild.jobs_for_census(sigs, args.arch)
        else:
            jobs = sorted(set(_planned_jobs(args)) | set(prebuild.jobs_for(configs.compile_set(args.arch, []))))
        what = f"{len(sigs)} signatures from {args.census}"
    else:
        chosen = configs.compile_set(args.arch, _referenced_ids(args.referenced))
        jobs = prebuild.jobs_for(chosen)
        what = f"compile set ({settings.compile_set()}: {len(chosen)} configs)"
    cache = prebuild.point_triton_cache()
    print(f"tunedb prebuild: triton {prebuild.triton_version()}, target {args.arch}, cache {cache}", flush=True)
    print(f"tunedb prebuild: {what} -> {len(jobs)} binaries, {args.jobs} jobs", flush=True)

    def progress(res: dict, done: int, total: int) -> None:
        if not res["ok"]:
            print(f"  FAILED {res['job']['config_id']} {res['job']['dt']}: {res['error']}", file=sys.stderr)
        elif done == total or done % 25 == 0:
            print(f"  {done}/{total} compiled", flush=True)

    summary = prebuild.run_jobs(jobs, args.arch, args.jobs, progress)
    if args.json:
        print(json.dumps(summary, indent=1))
    print(f"tunedb prebuild: {summary['ok']}/{summary['jobs']} ok in {summary['seconds']} s "
          f"(triton {summary['triton']}, cache {summary['cache_dir']})")
    key = summary["key"]
    print(f"tunedb prebuild: a GPU machine hits this cache only with the same Triton build "
          f"(key {key['triton_key']}, Python {key['python']}), ptxas ({key['ptxas']}) and env {key['env']}")
    return 0 if not summary["failed"] else 1
