"""`tunedb cutoff probe|fit|show`: the solver cutoff recipe (probe, fit, persist) from the shell.

    tunedb cutoff probe --workload MOD:FN --problem NAME [--policies direct,iterative] [--device cuda]
                        [--out traces.json] [--persist] [--stat p99] [--tol 0.02] [--config PATH]
                        [--max-iter 100] [--check-every 2] [--solve-tol T] [--allow-busy]
    tunedb cutoff fit TRACES.json [--stat p99|max|mean] [--tol 0.02] [--persist] [--config PATH] [--json]
    tunedb cutoff show [--config PATH] [--json]

The workload is `FN(solver)` in module MOD (or a file path.py:FN): the caller's loop, calling
`solver(strip, b, x0, signal=s)` per solve. `probe --persist` is the one-command re-measure of a
problem class on this GPU: probe, fit, and write the decision into the configuration.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from tunedb.errors import CutoffError


def _fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stat", default="p99", choices=("mean", "p99", "max"),
                   help="the statistic the deployment bounds (default p99)")
    p.add_argument("--tol", type=float, default=0.02, help="band: within this fraction of the optimum")
    p.add_argument("--scale", default="linear", choices=("linear", "log"), help="signal scale of the band center")
    p.add_argument("--persist", action="store_true", help="write the decision into the configuration")
    p.add_argument("--config", default=None, help="decision file (default <cache root>/cutoff/decisions.json)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cutoff_cmd", metavar="{probe,fit,show}", required=True)
    pr = sub.add_parser("probe", help="run a workload once per policy and keep every solve's time")
    pr.add_argument("--workload", required=True, help="MOD:FN or path/to/file.py:FN, called as FN(solver)")
    pr.add_argument("--problem", required=True, help="problem class name the decision is filed under")
    pr.add_argument("--policies", default="direct,iterative")
    pr.add_argument("--device", default="cuda")
    pr.add_argument("--out", default=None, help="write the traces here (JSON)")
    pr.add_argument("--max-iter", type=int, default=100)
    pr.add_argument("--check-every", type=int, default=2, help="PCG: host check of convergence every k iterations (0: none)")
    pr.add_argument("--solve-tol", type=float, default=None)
    pr.add_argument("--discard", type=int, default=3, help="drop each run's first solves (compiles)")
    pr.add_argument("--allow-busy", action="store_true")
    _fit_args(pr)
    ft = sub.add_parser("fit", help="fit the cutoff on recorded traces")
    ft.add_argument("traces", help="a probe's JSON")
    _fit_args(ft)
    sh = sub.add_parser("show", help="print the persisted decisions")
    sh.add_argument("--config", default=None)
    sh.add_argument("--json", action="store_true")


def load_workload(spec: str):
    mod, sep, fn = spec.rpartition(":")
    if not sep or not mod or not fn:
        raise CutoffError(f"--workload {spec!r}: expected MOD:FN or path/to/file.py:FN")
    if mod.endswith(".py"):
        path = Path(mod)
        if not path.exists():
            raise CutoffError(f"--workload: no such file {mod}")
        loader = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules.setdefault(path.stem, module)
        loader.loader.exec_module(module)
    else:
        from tunedb.census.presets import import_user_module

        try:  # a module beside the working directory imports, as `tunedb tune MOD:FN` finds it
            module = import_user_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (mod == exc.name or mod.startswith(exc.name + ".")):
                raise  # the workload's own import failed: its traceback says where
            raise CutoffError(f"--workload {spec!r}: no module named {exc.name!r} (MOD:FN names an importable "
                              f"module, or give path/to/file.py:FN)") from None
    target = getattr(module, fn, None)
    if not callable(target):
        raise CutoffError(f"--workload: {mod} has no callable {fn!r}")
    return target


def _fit_and_report(probe, args) -> int:
    from tunedb.cutoff import fitting as fitmod
    from tunedb.cutoff import store

    f = fitmod.fit(probe, statistic=args.stat, tolerance=args.tol, scale=args.scale)
    decision = store.persist(f, probe, path=args.config) if args.persist else None
    if args.json:
        print(json.dumps({"fit": f.to_json(), "persisted": decision is not None}, indent=1))
    else:
        print(f"{probe.problem} on {probe.device}: {f.statistic} cutoff {f.cutoff:.6g} "
              f"(band [{f.band[0]:.6g}, {f.band[1]:.6g}] within {f.tolerance:.0%}; optimum {f.optimum:.6g}); "
              f"{f.below} at or under it, {f.above} above")
        fixed = ", ".join(f"{k} {v:.4f}" for k, v in f.fixed.items())
        print(f"  {f.statistic} ms: auto {f.value_at_cutoff:.4f} (optimum {f.value_at_optimum:.4f}); fixed: {fixed}; "
              f"{f.solves} solves, {f.pairing} pairing")
        if decision is not None:
            print(f"  persisted to {args.config or store.config_path()}")
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """What the probe writes after it ran (--out's traces, --persist's decision file), checked
    before; and the name the decision is filed under."""
    if not args.problem.strip():
        raise CutoffError("--problem '' names no problem class: the decision is filed as PROBLEM@DEVICE "
                          "(e.g. --problem mpc)")
    from tunedb.cutoff import store
    from tunedb.out_paths import why_unwritable

    places = [("--out", args.out)] if args.out else []
    if args.out:
        _check_traces_target(Path(args.out).expanduser(), args)
    if args.persist:
        store.load(args.config)  # an existing file that is not a decision file: refused now, as persist would
        places.append(("--config" if args.config else "the decision file", args.config or store.config_path()))
    for option, path in places:
        why = why_unwritable(path)
        if why is not None:
            raise CutoffError(f"{option} {path}: {why}; nothing was probed (choose a writable file path)")


def _check_traces_target(out: Path, args: argparse.Namespace) -> None:
    """--out overwrites only a probe's traces file: not the decision file --persist writes, nor
    any other file (a tuning database, a census, a decisions file: replaced, it was lost)."""
    from tunedb.cutoff import store
    from tunedb.cutoff.probing import Probe

    decisions = Path(args.config).expanduser() if args.config else store.config_path()
    same = os.path.samefile(out, decisions) if out.exists() and decisions.exists() else out.resolve() == decisions.resolve()
    if same:
        raise CutoffError(f"--out {out} is the decision file; write the traces elsewhere")
    if out.is_file() and out.stat().st_size:
        try:
            Probe.load(out)
        except CutoffError:
            raise CutoffError(f"--out {out} exists and is not a probe's traces file; tunedb cutoff probe "
                              f"overwrites only its own traces: write them elsewhere or remove that file first") from None


def run(args: argparse.Namespace) -> int:
    from tunedb.cutoff import probing as probemod
    from tunedb.cutoff import store

    if args.cutoff_cmd == "show":
        if args.config and not Path(args.config).expanduser().exists():  # a typo read as an empty file
            raise CutoffError(f"--config {args.config}: no such file (without --config: the default decision "
                              f"file {store.config_path()})")
        table = store.load(args.config)
        if args.json:
            print(json.dumps({k: d.to_json() for k, d in table.items()}, indent=1))
            return 0
        if not table:
            print(f"no cutoff decisions in {args.config or store.config_path()}")
        for k, d in sorted(table.items()):
            prov = d.provenance
            print(f"{k}: cutoff {d.cutoff:.6g} ({d.below} <= cutoff < {d.above}), {d.statistic} within "
                  f"{d.tolerance:.0%} over [{d.band[0]:.6g}, {d.band[1]:.6g}]; measured {prov.get('utc', '?')} "
                  f"commit {prov.get('git_commit', '')[:12] or '?'} gpu {prov.get('gpu_name', '') or d.device} "
                  f"torch {prov.get('torch', '?')}")
        return 0
    if args.cutoff_cmd == "fit":
        return _fit_and_report(probemod.Probe.load(args.traces), args)
    from tunedb.cutoff import fitting as fitmod

    policies = tuple(p for p in args.policies.split(",") if p)
    # what the fit after the probe refuses, refused before a probe that may run for minutes
    fitmod.check_arguments(statistic=args.stat, tolerance=args.tol, scale=args.scale)
    unknown = [p for p in policies if p not in ("direct", "iterative", "auto")]
    if unknown:
        raise CutoffError(f"--policies {args.policies!r}: {', '.join(map(repr, unknown))} not supported; "
                          "allowed: direct, iterative, auto")
    missing = [p for p in ("iterative", "direct") if p not in policies]
    if missing:
        raise CutoffError(f"--policies {args.policies!r}: the fit after the probe compares 'iterative' with "
                          f"'direct'; add {', '.join(map(repr, missing))}")
    if args.out:
        args.out = os.path.expanduser(args.out)  # the file checked is the file written
    _check_outputs(args)
    workload = load_workload(args.workload)
    probe = probemod.probe(workload, problem=args.problem, policies=policies, device=args.device,
                           discard=args.discard, allow_busy=args.allow_busy, tol=args.solve_tol,
                           max_iter=args.max_iter, check_every=args.check_every or None)
    if args.out:
        probe.save(args.out)
        if not args.json:  # --json: stdout is the one JSON document
            print(f"traces written to {args.out}")
    return _fit_and_report(probe, args)
