"""Fill Triton's on-disk cache before `tunedb build` of a family that has no `compile_jobs` hook
(bmm, group_gemm): every (signature, M, config) the build will measure is launched once, in
parallel processes, on inputs from the family's own `make_inputs`, so each binary is compiled
under exactly the specialisation (dtype, strides, divisibility) the build's measuring worker
asks for. Without it that worker compiles every tile in turn while the GPU idles (about 1-2 s
each: 108 bmm binaries for the whisper census, about 110 group_gemm binaries plus the routing
programs). Nothing here is timed; a launch that fails is counted and the build measures (and
reports) that arm as it would anyway.

    PYTHONPATH=src python bench/prewarm.py --family bmm --census F [--census F2] [--no-fill] [--jobs N]

Prints the work, the processes and the wall time. The plan is `tunedb build`'s own
(`build.run.plan_build`: the same points and arms a build with these flags measures).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import sys
import time
from typing import Any, Sequence

Work = tuple[str, int, str]  # (signature text, M, config id)


def planned_work(family_name: str, census_paths: Sequence[str], fill: bool, arch_family: str = "sm90") -> list[Work]:
    """Every (signature, M, config) a `tunedb build --family F --census ... [--no-fill]` measures
    (sentinels that run torch are left out; the family's default tile is launched as 'default')."""
    from tunedb import pipeline
    from tunedb.arch import shipped_profile
    from tunedb.build.run import BuildOptions, plan_build

    censuses = [(p, pipeline.read_census(p)) for p in census_paths]
    opts = BuildOptions(out="user", family=family_name, arch_family=arch_family, fill=fill)
    plans, _ = plan_build(censuses, opts, shipped_profile(arch_family), compiled=set())
    return [(plan.signature.format(), m, cid) for plan in plans for m, ids in plan.arms.items()
            for cid in ids if cid != "torch"]


def _launch_share(family_name: str, items: Sequence[Work], device: str = "cuda") -> tuple[int, list[str]]:
    """In a worker process: launch each item once (inputs made once per (signature, M))."""
    import torch

    from tunedb import families
    from tunedb.records import Config, Signature

    fam = families.get(family_name)
    done, errors = 0, []
    by_point: dict[tuple[str, int], list[str]] = {}
    for sig_text, m, cid in items:
        by_point.setdefault((sig_text, m), []).append(cid)
    for (sig_text, m), cids in by_point.items():
        sig = Signature.parse(sig_text)
        args, kwargs = fam.make_inputs(sig, m, device, seed=0)
        for cid in cids:
            cfg = Config.sentinel(cid) if cid in ("default", "torch") else fam.parse_config(cid)
            try:
                fam.launcher(cfg, sig)(*args, **kwargs)
                done += 1
            except Exception as exc:  # noqa: BLE001 -- the build reports this arm's failure itself
                errors.append(f"{cid} at {sig_text} M={m}: {type(exc).__name__}: {str(exc)[:160]}")
        if device == "cuda":
            torch.cuda.synchronize()
        del args, kwargs
    return done, errors


def prewarm(family_name: str, work: Sequence[Work], jobs: int, log=print, device: str = "cuda") -> dict[str, Any]:
    """Launch `work` in `jobs` spawned processes, each owning a share of the config ids (one
    compile per binary, no two processes racing for it)."""
    t0 = time.time()
    cids = sorted({cid for _, _, cid in work})
    shares = [set(cids[i::jobs]) for i in range(jobs) if cids[i::jobs]]
    parts = [[w for w in work if w[2] in share] for share in shares]
    done, errors = 0, []
    with cf.ProcessPoolExecutor(len(parts), mp_context=mp.get_context("spawn")) as pool:
        for n, errs in pool.map(_launch_share, [family_name] * len(parts), parts, [device] * len(parts)):
            done += n
            errors += errs
    out = {"launches": done, "configs": len(cids), "processes": len(parts), "errors": errors,
           "seconds": round(time.time() - t0, 1)}
    log(f"prewarm {family_name}: {done} launches of {len(cids)} configs in {len(parts)} processes, "
        f"{out['seconds']} s; {len(errors)} failed")
    for line in errors[:20]:
        log("  " + line)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", required=True)
    p.add_argument("--census", action="append", required=True)
    p.add_argument("--no-fill", dest="fill", action="store_false")
    p.add_argument("--arch", default="sm90")
    p.add_argument("--jobs", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)))
    p.add_argument("--dry-run", action="store_true", help="print the work only")
    args = p.parse_args(argv)
    work = planned_work(args.family, args.census, args.fill, args.arch)
    print(f"{len(work)} launches over {len({w[0] for w in work})} signatures, "
          f"{len({w[2] for w in work})} configs", flush=True)
    if args.dry_run:
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench/prewarm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if not os.environ.get("TRITON_CACHE_DIR"):  # the build's worker may point Triton elsewhere (gemm's launcher does)
        print("warning: TRITON_CACHE_DIR is not set; export it for this and the build so both use one cache",
              flush=True)
    print(f"Triton cache: {os.environ.get('TRITON_CACHE_DIR') or '~/.triton/cache'}", flush=True)
    res = prewarm(args.family, work, args.jobs, log=lambda s: print(s, flush=True))
    return 0 if res["launches"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
