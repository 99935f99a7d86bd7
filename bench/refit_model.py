"""Refit a database file's cost model on every measurement of a log, and rewrite only its "model".

    python bench/refit_model.py --log bench/results/2026-11-29_system_sm90_measurements.jsonl.gz \
        --db src/tunedb/db/sm90/gemm.json [--dry-run]

`tunedb build` fits the model on its own invocation's measurements, so a file built by several
invocations (one per census) ships a model that saw only the last one. This script fits
calibration.fit on all the log's ok measurements of the file's kernel family (the latest per
signature, M and config) and writes the result through tunedb.database.write_entries with no
entries and the file's own validators: entries, configs and validators stay as they are.
Runs on the CPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from tunedb import database, evaluate, families

from tunedb.families.gemm import calibration

from tunedb.families.gemm import costmodel
from tunedb.arch import shipped_profile

from tunedb.measure.log import read_measurements


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, required=True, action="append",
                    help="measurement log (.jsonl or .jsonl.gz); repeat for several")
    ap.add_argument("--db", type=Path, required=True, help="the database file whose model to replace")
    ap.add_argument("--family", default="gemm")
    ap.add_argument("--dry-run", action="store_true", help="print the fitted model, write nothing")
    args = ap.parse_args(argv)
    for path in [*args.log, args.db]:
        if not path.is_file():
            ap.error(f"{path} is not a file")
    family = families.get(args.family)
    db = database.load(args.db, args.family)
    arch = shipped_profile(db.arch_family)
    meas = read_measurements(*args.log)
    meas = [m for m in evaluate.latest(meas).values() if m.signature.family == args.family and m.status.ok]
    if not meas:
        print(f"no ok {args.family} measurements in {', '.join(map(str, args.log))}", file=sys.stderr)
        return 1
    configs = {}
    for m in meas:
        cfg = family.parse_config(m.config_id)
        if not cfg.is_sentinel:
            configs[cfg.id] = cfg
    params = calibration.fit(meas, configs, arch)
    before = db.model
    print(f"fitted on {params.fitted_on} measurements of {len({m.signature for m in meas})} signatures: "
          f"scale {params.scale:.4f}, {len(params.per_config)} config lines, vendor arms "
          f"{ {k: tuple(round(x, 4) for x in v) for k, v in params.sentinel.items()} }")
    err_before = calibration.geomean_error(database_params(before), meas, configs, arch)
    err_after = calibration.geomean_error(params, meas, configs, arch)
    print(f"prediction error over the log (geomean |log pred/meas|): file's model {100 * err_before:.1f}%, "
          f"refit {100 * err_after:.1f}%")
    if args.dry_run:
        print(json.dumps(params.to_json(), indent=1)[:2000])
        return 0
    lock = database.lock_path(args.db)
    stray = not lock.exists()
    path = database.write_entries(args.db, args.family, db.arch_family, (), {},
                                  validators=db.validators, model=params.to_json())
    if stray:  # the writer's lock file would otherwise sit in the package data beside the file
        lock.unlink(missing_ok=True)
    after = database.load(path, args.family)
    if after.entries != db.entries or after.configs != db.configs or after.validators != db.validators:
        print(f"{path}: entries, configs or validators changed; inspect with git diff", file=sys.stderr)
        return 1
    print(f"wrote the model of {path}")
    return 0


def database_params(raw: object) -> costmodel.ModelParams | None:
    try:
        return costmodel.ModelParams.from_json(raw) if raw else None
    except Exception:  # a model written by another version: compare with the uncalibrated structure
        return None


if __name__ == "__main__":
    sys.exit(main())
