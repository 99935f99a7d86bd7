"""GEMM's prebuild hook: `tunedb prebuild --family gemm` compiles Triton configs for a target,
without a GPU, into the persistent Triton cache (commands/prebuild.py parses the arguments).

Needs only Triton (no torch). The cache is TRITON_CACHE_DIR, else <cache root>/triton.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tunedb.input_files import read_text
from tunedb.errors import BuildError
from tunedb.records import SENTINELS


_READ: dict[str, str] = {}  # --referenced's text, by the path given, for one run


def _referenced_ids(path: Path | None) -> list[str]:
    """The config ids a GEMM database file defines or its regions name. The file is read as every
    reader reads a table (database/schema.py): a corrupt one, or another family's, is refused by
    name rather than crashing here or silently adding nothing."""
    if path is None:
        return []
    text = _READ.get(str(path))
    if text is None:  # read once a run: `-` (standard input) is read per target arch, and empty after the first
        try:
            text = _READ[str(path)] = read_text(path)
        except UnicodeDecodeError as exc:
            raise BuildError(f"cannot read database file {path}: not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise BuildError(f"cannot read database file {path}: {exc}") from None
    from tunedb.database import schema
    from tunedb.errors import DatabaseError

    try:
        db = schema.parse(schema.loads(text, str(path)), str(path), kernel_family="gemm")
    except (OSError, DatabaseError) as exc:
        raise BuildError(f"cannot read database file {path}: {exc}") from None
    return [*db.configs, *db.referenced_config_ids()]


def _planned_jobs(args: argparse.Namespace) -> list:
    """The binaries a `tunedb build` of this census loads: its plan's configs (cost-model top-k
    union forced arms, per point), in the dtype the build measures and each N/K alignment class."""
    from tunedb import arch, pipeline
    from tunedb.families.gemm import configs, prebuild

    opts = pipeline.BuildOptions(arch_family=args.arch, thin=args.thin, max_points=args.max_points,
                                 dry_run=True)
    pipeline.buildsteps.check_options(opts, gpu=False)  # --thin / --max-points as build names them
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


def _jobs_for_arch(args: argparse.Namespace, arch_family: str) -> tuple[list, str]:
    """(jobs, what they are) for one target arch."""
    from tunedb import arch as _arch
    from tunedb import settings
    from tunedb.families.gemm import configs, prebuild

    if args.census is not None:
        sigs = prebuild.signatures_in(args.census)
        if not sigs:
            raise BuildError(f"census file {args.census} names no GEMM signature (gemm|op=...|dt=...|N=..|K=..)")
        what = f"{len(sigs)} signatures from {args.census}"
        # --referenced's configs join whatever the census asks for (they were dropped here)
        referenced = _referenced_ids(args.referenced) if args.referenced is not None else []
        extra = set(prebuild.jobs_for(configs.compile_set(arch_family, referenced)))
        if referenced:
            what += f" + {args.referenced}'s configs"
        if settings.compile_set() == "all":
            return prebuild.jobs_for(configs.config_space(arch_family)), what
        if args.every_valid or arch_family not in _arch.SHIPPED_ARCHES:
            # the build plan ranks with a measured profile's cost model; without one, every valid config
            note = "" if args.every_valid or not args.thin else "; --thin plans need a shipped arch's cost model"
            return (sorted(set(prebuild.jobs_for_census(sigs, arch_family)) | (extra if referenced else set())),
                    what + f" (every valid config{note})")
        planned = _planned_jobs(argparse.Namespace(**{**vars(args), "arch": arch_family}))
        return sorted(set(planned) | extra), what
    chosen = configs.compile_set(arch_family, _referenced_ids(args.referenced))
    return prebuild.jobs_for(chosen), f"compile set ({settings.compile_set()}: {len(chosen)} configs)"


def _invalid(arch_family: str, candidates: set[str]) -> int:
    """Configs chosen for another target that this arch's validity predicate refuses."""
    from tunedb import arch as _arch
    from tunedb.families.gemm import configs

    smem = _arch.planning_profile(arch_family).smem_per_block if arch_family in _arch.PLANNING_LIMITS else None
    return sum(1 for cid in candidates if configs.arch_reason(configs.parse(cid), arch_family, smem) is not None)


def arches_of(args: argparse.Namespace) -> list[str]:
    """--arch given once or more, each possibly comma-separated; sm90 when absent."""
    raw = args.arch if isinstance(args.arch, list) else [args.arch or "sm90"]
    out: list[str] = []
    for item in raw or ["sm90"]:
        for a in str(item).split(","):
            if a.strip() and a.strip() not in out:
                out.append(a.strip())
    return out or ["sm90"]


def run(args: argparse.Namespace) -> int:
    _READ.clear()  # a run reads --referenced afresh (once)
    if args.jobs < 1:
        raise BuildError(f"--jobs must be >= 1, got {args.jobs}")
    from tunedb.families.gemm import configs, prebuild

    arches = arches_of(args)
    for a in arches:  # before any compiler runs (it would assert)
        if a not in configs.known_arches():
            raise BuildError(f"unknown --arch {a!r}: prebuild compiles for {', '.join(configs.known_arches())}")
    if args.census is None and (args.thin or args.max_points is not None or args.every_valid):
        given = [f for f, on in (("--thin", args.thin), ("--max-points", args.max_points is not None),
                                 ("--every-valid", args.every_valid)) if on]
        raise BuildError(f"{', '.join(given)} shape(s) the plan of a census: give --census FILE (without one "
                         f"prebuild compiles the compile set, TUNEDB_COMPILE_SET)")
    if args.census is not None and not args.census.is_file():
        what = ("is a directory" if args.census.is_dir() else "is not a regular file" if args.census.exists()
                else "does not exist")
        raise BuildError(f"census file {args.census} {what}; give a census or database file (JSON)")
    planned = {a: _jobs_for_arch(args, a) for a in arches}
    reference = {j.config_id for jobs, _ in planned.values() for j in jobs}
    if "sm90" not in planned:
        reference |= {j.config_id for j in _jobs_for_arch(args, "sm90")[0]}
    cache = prebuild.point_triton_cache()
    # --json: stdout is one JSON document (per arch: the plan, or the compile summary); the rest on stderr
    say = sys.stderr if args.json else sys.stdout
    print(f"tunedb prebuild: triton {prebuild.triton_version()}, target(s) {', '.join(arches)}, cache {cache}",
          file=say, flush=True)
    if getattr(args, "dry_run", False):
        if args.json:
            print(json.dumps({a: {"what": what, "binaries": len(jobs), "configs": len({j.config_id for j in jobs}),
                                  "invalid": _invalid(a, reference), "compiled": 0}
                              for a, (jobs, what) in planned.items()}, indent=1))
            return 0
        return _print_plan(args, planned, reference)
    rows, failed, summaries = [], False, {}
    for a in arches:
        jobs, what = planned[a]
        invalid = _invalid(a, reference)
        skip = prebuild.ptxas_problem(configs.capability(a))
        if skip:
            print(f"tunedb prebuild: {a}: skipped: {skip}", file=sys.stderr)
            rows.append((a, len(jobs), 0, invalid, 0, 0.0, f"skipped: {skip}"))
            summaries[a] = {"skipped": skip, "jobs": len(jobs), "ok": 0}
            continue
        print(f"tunedb prebuild: {a}: {what} -> {len(jobs)} binaries, {args.jobs} jobs", file=say, flush=True)

        def progress(res: dict, done: int, total: int) -> None:
            if not res["ok"]:
                print(f"  FAILED {res['job']['config_id']} {res['job']['dt']}: {res['error']}", file=sys.stderr)
            elif done == total or done % 25 == 0:
                print(f"  {done}/{total} compiled", file=say, flush=True)

        summary = prebuild.run_jobs(jobs, a, args.jobs, progress)
        failed = failed or bool(summary["failed"])
        summaries[a] = summary
        key = summary["key"]
        rows.append((a, summary["jobs"], summary["ok"], invalid, len(summary["failed"]), summary["seconds"],
                     f"ptxas {key['ptxas']}"))
        print(f"tunedb prebuild: {a}: a GPU machine hits this cache only with the same Triton build "
              f"(key {key['triton_key']}, Python {key['python']}), ptxas ({key['ptxas']}) and env {key['env']}",
              file=say)
    if args.json:
        print(json.dumps(summaries, indent=1))
    _print_table(rows, say)
    return 1 if failed or any(r[6].startswith("skipped") for r in rows) else 0


def _print_table(rows: list[tuple], out=None) -> None:
    print(f"{'arch':<7}{'binaries':>9}{'compiled':>9}{'invalid':>8}{'failed':>7}{'seconds':>9}  note", file=out)
    for a, n, ok, inv, bad, secs, note in rows:
        print(f"{a:<7}{n:>9}{ok:>9}{inv:>8}{bad:>7}{secs:>9.1f}  {note}", file=out)


def _print_plan(args: argparse.Namespace, planned: dict, reference: set[str]) -> int:
    """--dry-run: per arch, what would compile here and how to measure that arch's tier on its GPU."""
    from tunedb.families.gemm import configs, prebuild

    census = f" --census {args.census}" if args.census is not None else ""
    # step 1 repeats every option that shaped the plan shown (it is run elsewhere, later)
    shaped = census + (" --every-valid" if args.every_valid else "") + (
        f" --thin --max-points {args.max_points}" if args.thin else "") + (
        f" --referenced {args.referenced}" if args.referenced is not None else "")
    for a, (jobs, what) in planned.items():
        skip = prebuild.ptxas_problem(configs.capability(a))
        print(f"{a}: {what} -> {len(jobs)} binaries ({len({j.config_id for j in jobs})} configs); "
              f"{_invalid(a, reference)} chosen config(s) invalid on {a}"
              + (f"; cannot compile here: {skip}" if skip else ""))
        print(f"  1. here (CPU):  tunedb prebuild --arch {a}{shaped} --jobs {args.jobs}")
        print(f"  2. carry the cache ({prebuild.triton_cache_dir()}) to an {a} GPU machine with the same Triton "
              f"{prebuild.triton_version()} and Python; set TRITON_CACHE_DIR to it "
              f"(prebuild.relocate_cache fixes the paths when it moved)")
        print(f"  3. on that GPU: python -m tunedb.arch --measure   (its profile: the cost model's ceilings)")
        print(f"  4. on that GPU: tunedb build{census or ' --census CENSUS'} --arch {a} --out system "
              f"(writes db/{a}/gemm.json; compiles nothing that step 1 built)")
    print("--dry-run: nothing was compiled.")
    return 0
