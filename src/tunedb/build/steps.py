"""The build's per-signature steps: rank and price arms with the family's cost model (when it has
one), measure them through the protocol (fake timer, worker subprocess or in-process),
cross-evaluate, partition under the family's pick rule (chained per signature in
signature_steps.py), and turn the result into an Entry with its evidence. No concrete family here: a
family reaches this module through the registry and its contract hooks.
"""
from __future__ import annotations

import dataclasses
import os
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tunedb import database, families
from tunedb.build import checkpoint, timeline
from tunedb.build import plan as buildplan
from tunedb.errors import BuildError
from tunedb.families.contract import PickRule, hook
from tunedb.records import ArchProfile, Config, Entry, Measurement, MeasureRequest, Point, Signature, Status


def pick_rule(family: Any, min_speedup: float | None = None, gate_noise: float | None = None,
              tie_band: float | None = None) -> PickRule:
    """The family's pick rule, with --min-speedup and --gate-noise (when given) in its gate and
    --tie-band (when given) as its tie band."""
    rule = hook(family, "pick_rule")()
    over = {k: v for k, v in (("min_speedup", min_speedup), ("gate_noise", gate_noise), ("tie_band", tie_band))
            if v is not None}
    return dataclasses.replace(rule, **over) if over else rule


def model_params(raw: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A database file's `model` object as the cost-model hook takes it (None when empty)."""
    return raw or None


def cost_model(family: Any, arch: ArchProfile, params: Mapping[str, Any] | None = None) -> Any:
    """The family's cost model on `arch` (None: the family has none)."""
    return hook(family, "cost_model")(arch, params)


def rankers(family: Any, arch: ArchProfile, calibrated: Mapping[str, Any] | None) -> list[buildplan.Ranker]:
    """The uncalibrated model's top-k, plus a calibrated one's when the target file has a model;
    none when the family has no cost model (the plan then measures every valid config)."""
    models = [cost_model(family, arch, None)]
    if calibrated:
        models.append(cost_model(family, arch, calibrated))
    return [m.rank for m in models if m is not None]


def predictor(family: Any, arch: ArchProfile, params: Mapping[str, Any] | None = None) -> buildplan.Predictor:
    model = cost_model(family, arch, params)
    if model is None:
        return lambda sig, m, cid: None
    return model.predict


def roofline(family: Any, arch: ArchProfile) -> Callable[[Signature, int, str], float]:
    """A stand-in truth for --simulate where the family has no cost model: the op's roofline
    time from family.work() and the arch's peaks, times a fixed per-arm factor (1.0-1.4, from a
    hash of its id) so that arms differ reproducibly. Simulated tables are labelled as such."""
    def cost(sig: Signature, m: int, cid: str) -> float:
        flops, moved = family.work(sig, m)
        floor_s = max(flops / (arch.peak_tflops(sig.dt) * 1e12), moved / (arch.dram_bw_gbs * 1e9))
        factor = 1.0 + (zlib.crc32(cid.encode()) % 400) / 1000.0
        return (floor_s * 1e3 + arch.launch_us_graph / 1e3) * factor
    return cost


def simulated_timer(family: Any, arch: ArchProfile, seed: int, noise: float) -> Any:
    """FakeTimer whose truth is the cost model's prediction (the roofline stand-in without one):
    what --simulate measures with."""
    from tunedb.measure.timers import FakeTimer

    model = cost_model(family, arch, None)
    predict = model.predict if model is not None else roofline(family, arch)

    def cost(sig: Signature, m: int, cid: str) -> float | Status:
        ms = predict(sig, m, cid)
        return Status.INFEASIBLE if ms is None else ms
    return FakeTimer(cost, noise_sigma=noise, seed=seed)


def working_sets(censuses: Sequence[tuple[str, Any]], family: Any) -> dict[Signature, int]:
    """The weight bytes each signature is measured behind (the protocol's L2 state): per census --
    one served model -- every weight one forward reads, i.e. each signature's weight bytes (the
    family's `weight_bytes` hook) times the calls it makes per forward (its points' calls over the
    census's `forwards`; 1 when the census does not say); a signature in several censuses takes
    the largest. Not the sum over censuses (different models never share an L2), nor one copy per
    signature (a 32-layer model reads 32 weights of each shape per forward)."""
    weight_bytes = hook(family, "weight_bytes")
    out: dict[Signature, int] = {}
    for _name, shapes in censuses:
        try:
            forwards = int(dict(shapes.meta).get("forwards") or 0)
        except ValueError:
            forwards = 0
        calls: dict[Signature, int] = {}
        sizes: dict[Signature, int] = {}
        for p in shapes.points:
            if not families.serves(family, p.signature):
                continue
            size = sizes.get(p.signature)
            if size is None:
                size = sizes[p.signature] = int(weight_bytes(p.signature) or 0)
            if size > 0:
                calls[p.signature] = calls.get(p.signature, 0) + p.calls
        total = 0
        for sig, c in calls.items():
            per_forward = max(1, round(c / forwards)) if forwards > 0 and c > 0 else 1
            total += per_forward * sizes[sig]
        for sig in calls:
            out[sig] = max(out.get(sig, 0), total)
    return out


def start_worker(opts: Any, gpu: bool) -> Any:
    """A measuring worker prestarted for a build that will measure on this GPU (`gpu`: the
    caller found one and is not dry-running): its imports and CUDA start overlap the caller's
    census or plan, and build(worker=) then owns it. None otherwise."""
    if not gpu or not opts.isolate or opts.simulate or opts.dry_run:
        return None
    from tunedb.measure.isolated import StartRequest
    from tunedb.measure.worker import Worker

    worker = Worker()
    worker.prestart(StartRequest(opts.family))
    timeline.mark("worker prestart")
    from tunedb.build import compile_pool

    compile_pool.prestart(families.get(opts.family))  # its processes start beside the worker's
    return worker


# Where the NVIDIA driver shows its GPUs (module attributes so tests can point them elsewhere)
NVIDIA_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
DEVICE_DIR = Path("/dev")


def gpu_likely() -> bool:
    """Whether a CUDA GPU is probably usable here, answered without importing torch (2-4 s on a
    GPU host): the NVIDIA driver lists a GPU (/proc/driver/nvidia/gpus or /dev/nvidiaN) and
    CUDA_VISIBLE_DEVICES does not hide them all. A guess only: pipeline.has_gpu() decides, and
    confirm_worker() settles a worker started on the guess."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return False  # CUDA stops at the first invalid entry: "" or "-1..." hides every GPU
    try:
        if NVIDIA_PROC_GPUS.is_dir() and any(NVIDIA_PROC_GPUS.iterdir()):
            return True
        return any(p.name[len("nvidia"):].isdigit() for p in DEVICE_DIR.glob("nvidia*"))
    except OSError:
        return False


def confirm_worker(worker: Any, opts: Any, gpu: bool) -> Any:
    """Settle a worker started on gpu_likely()'s guess once has_gpu() has answered (`gpu`): kept
    when there is a GPU; closed, with the prestarted compile pool, when there is none; started
    now when the guess missed a GPU. Returns the worker the build should take (or None)."""
    if worker is not None and not gpu:
        worker.close()
        from tunedb.build import compile_pool

        compile_pool.release(families.get(opts.family))
        return None
    if worker is None and gpu:
        return start_worker(opts, gpu=True)
    return worker


class Measurer:
    """Measures (signature, M, config ids) through the protocol: fake timer, worker or in-process.
    working_set: the served weight bytes per signature (see working_sets)."""

    def __init__(self, family: Any, opts: Any, arch: ArchProfile, log: Any,
                 working_set: Mapping[Signature, int], timer: Any = None, worker: Any = None,
                 replayed: Any = None) -> None:
        self.family, self.opts, self.log, self.working_set = family, opts, log, working_set
        self.replayed = replayed  # a replay.LoggedRun answers every request (no timer, no worker)
        self.rule = pick_rule(family, opts.min_speedup, getattr(opts, "gate_noise", None), getattr(opts, "tie_band", None))
        self.arch = arch
        self.timer = timer
        if timer is None and opts.simulate:
            self.timer = simulated_timer(family, arch, opts.seed, opts.noise)
        self.worker = None
        # where the measuring wall time went (seconds): worker start, probes, prepare (inputs,
        # gate, captures, host timing), rounds, requests (the worker's pipe and pickling)
        self.phases: dict[str, float] = {}
        measures = replayed is None and self.timer is None  # a replay measures nothing
        if measures and opts.isolate:
            from tunedb.measure.worker import Worker

            # its process starts with the first point (a resumed build may need none), unless
            # the caller prestarted one (start_worker)
            self.worker = worker if worker is not None else Worker()
        elif measures:  # --in-process: one CUDA-graph timer for the whole build
            from tunedb.measure.protocol import default_timer

            self.timer = default_timer()
        self.arms = 0
        self.compiles: Any = None  # a compile_pool.CompilePool filling the cache ahead (run.py sets it)
        self.ahead: Any = None  # a speculative.Measured: requests measured during the census (run.py sets it)
        self._impl: tuple[str | None] | None = None

    def valid(self, sig: Signature, m: int, config_id: str) -> bool:
        """Whether the validity predicate lets `config_id` run `sig` at M (cross-evaluation
        carries a config to other sizes; a lane such as triton_decode serves only some)."""
        return self.family.invalid_reason(self.family.parse_config(config_id), sig, m, self.arch) is None

    def request(self, sig: Signature, m: int, ids: Sequence[str], alpha: float,
                decides: bool = False) -> tuple[MeasureRequest, dict[str, Any]]:
        """The whole request __call__ makes, and the protocol keywords it passes."""
        kw: dict[str, Any] = dict(alpha=alpha, seed=self.opts.seed, allow_busy=self.opts.allow_busy,
                                  working_set_bytes=self.working_set.get(sig))
        if decides and self.rule.min_speedup > 1.0:
            kw["fallback_gate"] = (self.rule.fallback, self.rule.required(1))
        refs = tuple(c for c in (self.rule.fallback, *self.rule.peers) if c in ids)
        if refs:  # never halved away: every arm pairs with them over all its rounds (objective_table)
            kw["keep"] = refs
        if self._impl is None:
            self._impl = (database.validators.family_impl_hash(self.family),)
        return MeasureRequest(sig, m, tuple(ids), tuple(sorted(kw.items())), self._impl[0]), kw

    def __call__(self, sig: Signature, m: int, ids: Sequence[str], alpha: float,
                 decides: bool = False) -> tuple[Measurement, ...]:
        """decides: this point is its signature's only one, so the partition's gate applied to
        it alone is what the signature serves, and its rounds may stop once no arm can pass it.
        (Across several points a region's gate is a weighted geomean over them, and an arm
        behind torch here can still win a region; those points sample on.)"""
        from tunedb.measure import isolated, protocol

        if self.replayed is not None:  # the recorded build's own measurements (build/replay.py)
            out = self.replayed.measured(sig, m, ids)
            if self.log is not None:
                self.log.append(out)
            self.arms += len(out)
            return out
        req, kw = self.request(sig, m, ids, alpha, decides)
        out = self.ahead.take(req) if self.ahead is not None else None
        if out is not None:  # measured during the census (build/speculative.py): the same request
            if self.log is not None:
                self.log.append(out)
            self.arms += len(out)
            return out
        if self.compiles is not None:  # this point's binaries first: compiling is never timed
            waited = self.compiles.wait(sig, ids)
            self.phases["compile wait"] = self.phases.get("compile wait", 0.0) + waited
        if self.worker is not None:
            out = isolated.measure_point_isolated(self.worker, self.family.name, sig, m, ids, log=self.log,
                                                  phases=self.phases, **kw)
        else:
            out = protocol.measure_point(self.family, sig, m, list(ids), timer=self.timer, log=self.log,
                                         phases=self.phases, **kw)
        self.arms += len(out)
        return out

    def close(self) -> None:
        if self.compiles is not None:
            self.compiles.close()
        if self.worker is not None:  # the results are in: its exit overlaps the build's write
            self.worker.close(wait=False)


def run_meta(opts: Any, arch: ArchProfile, points: Mapping[Signature, list[Point]]) -> dict[str, Any]:
    import hashlib

    text = "\n".join(f"{p.signature}|{p.m}|{p.weight!r}|{p.calls}|{int(p.must_tune)}|{p.eager_share!r}"
                     for sig in sorted(points) for p in sorted(points[sig], key=lambda p: p.m))
    return {"family": opts.family, "arch": arch.arch_family, "census": hashlib.sha256(text.encode()).hexdigest()[:20],
            "thin": opts.thin, "max_points": opts.max_points, "fill": opts.fill, "min_speedup": opts.min_speedup,
            "gate_noise": getattr(opts, "gate_noise", None), "tie_band": getattr(opts, "tie_band", None),
            "exhaustive": opts.exhaustive, "simulate": opts.simulate, "top_k": opts.top_k,
            "seed": opts.seed if opts.simulate else None, "noise": opts.noise if opts.simulate else None}


def check_options(opts: Any, gpu: bool) -> None:
    families.get(opts.family)  # RegistryError naming the registered ones, before any census
    if getattr(opts, "run_id", None):
        checkpoint.check_run_id(opts.run_id)  # before a census, a lock or the --out directory exist
    out = getattr(opts, "out", None)
    if isinstance(out, str) and not out.strip():
        raise BuildError("--out '' names no directory; use 'user', 'system' or a directory path")
    arch_family = getattr(opts, "arch_family", None)
    if arch_family is not None and not re.match(r"^sm\d+a?$", arch_family):
        from tunedb.arch import PLANNING_LIMITS, SHIPPED_ARCHES

        raise BuildError(f"--arch {arch_family!r} is not an arch family: expected sm<digits> (shipped tables: "
                         f"{', '.join(SHIPPED_ARCHES)}; planning limits known for {', '.join(PLANNING_LIMITS)})")
    if getattr(opts, "gate_noise", None) is not None and not 0.0 <= opts.gate_noise < 1.0:
        raise BuildError(f"--gate-noise={opts.gate_noise} must be in [0, 1) (0.06: a one-point region must "
                         f"beat the fallback by the gate x 1.06, a four-point one by x 1.03)")
    if getattr(opts, "tie_band", None) is not None and not 0.0 <= opts.tie_band < 1.0:
        raise BuildError(f"--tie-band={opts.tie_band} must be in [0, 1) (0.03: an arm within 3% of a point's "
                         f"fastest counts as fast as it; default: the family's pick rule)")
    if opts.min_speedup is not None and not 1.0 <= opts.min_speedup < float("inf"):  # NaN included
        raise BuildError(f"--min-speedup={opts.min_speedup} must be a finite number >= 1.0 (1.05: a config must beat the "
                         f"family's fallback by 5%; default: the family's pick rule)")
    if opts.max_points is not None and not opts.thin:
        raise BuildError("--max-points needs --thin (without it every census point is measured)")
    if opts.thin and (opts.max_points is None or opts.max_points < 2):
        raise BuildError(f"--thin needs --max-points N with N >= 2, got {opts.max_points}")
    if opts.top_k < 1:
        raise BuildError(f"top-k={opts.top_k} must be >= 1")
    if opts.simulate:
        check_simulated_out(opts, "--simulate")
    if getattr(opts, "replay", None) and (opts.simulate or opts.workers or opts.ray):
        raise BuildError("--replay rebuilds from a log's numbers: it takes no --simulate, --workers or --ray")
    if getattr(opts, "replay", None):  # what only shapes a measurement: a replay's plan is the log's
        given = [flag for flag, on in (("--top-k", opts.top_k != buildplan.TOP_K), ("--exhaustive", opts.exhaustive),
                                       ("--allow-busy", opts.allow_busy),
                                       ("--in-process", not getattr(opts, "isolate", True))) if on]
        if given:
            raise BuildError(f"--replay rebuilds from the log's plan and numbers: {', '.join(given)} would change "
                             f"nothing; drop {'it' if len(given) == 1 else 'them'}")
    if not (opts.simulate or opts.dry_run or gpu or getattr(opts, "replay", None)):
        raise BuildError("no CUDA GPU here: a build measures on a GPU; use --simulate (cost-model "
                         "timer) or --dry-run (the plan) on this machine")


def prebuilt_configs(family: str, arch_family: str) -> set[str]:
    """Configs `tunedb prebuild` compiled for this build's compiler (the family's
    `prebuilt_configs` hook, which may point the compiler at that cache as a side effect)."""
    return set(hook(families.get(family), "prebuilt_configs")(arch_family) or ())


def check_simulated_out(opts: Any, what: str) -> None:
    """BuildError when simulated entries (a --simulate build, or a replay of its log) would go to
    a tier, by name or by a path inside its directory."""
    if opts.out in ("system", "user"):
        raise BuildError(f"{what} refuses --out {opts.out}: a tier serves measured results only and "
                         f"simulated ones are the cost model plus noise; write them to --out DIR")
    if not getattr(opts, "dry_run", False):
        _refuse_tier_path(opts.out, what)


def _refuse_tier_path(out: str, what: str = "--simulate") -> None:
    """BuildError when a --simulate build's --out lies inside a tier's directory (the user tier's
    or the shipped one's): written by path, simulated entries would merge into a file that serves
    measured ones, and the file's validators would become this machine's."""
    try:
        out_path = Path(out).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise BuildError(f"--out {out} cannot be resolved: {exc}") from None
    for tier in database.TIERS:
        base = database.system_root() if tier == "system" else database.user_root()
        if base is None:
            continue
        base = Path(base).expanduser().resolve()
        if out_path == base or base in out_path.parents:
            raise BuildError(f"{what} refuses --out {out}: it lies in the {tier} tier ({base}), which serves "
                             f"measured results only; write simulated ones to a directory outside it")


def refuse_simulated_merge(target: Path, existing: database.DatabaseFile) -> None:
    """BuildError before measuring when a --simulate build would merge into a file holding
    measured entries (a simulated result never sits beside or replaces a measured one)."""
    measured = sorted(s.format() for s, e in existing.entries.items() if e.source != "simulated")
    if measured:
        raise BuildError(f"--simulate refuses to merge into {target}: it holds {len(measured)} measured "
                         f"entr{'y' if len(measured) == 1 else 'ies'} ({measured[0]}{', ...' if len(measured) > 1 else ''}); "
                         f"write simulated results to another --out, or pass --fresh to replace the file; "
                         f"nothing was measured")


def target_file(out: str, arch_family: str, family: str) -> Path:
    """'user' / 'system' -> that tier's file; a path ending in .json -> itself; else DIR/<arch>/<family>.json
    (the user tier's layout, so TUNEDB_USER_DB=DIR serves what the build wrote)."""
    if out in database.TIERS:
        return database.target_path(out, arch_family, family)
    path = Path(out).expanduser()
    return path if path.suffix == ".json" else path / arch_family / f"{family}.json"


def log_file(out: str, target: Path, run: checkpoint.RunDir) -> Path:
    """--out DIR: DIR/measurements.jsonl (beside the file); user/system: the run directory's log."""
    if out in database.TIERS:
        return run.log_path
    base = Path(out).expanduser()
    return (base.parent if base.suffix == ".json" else base) / checkpoint.LOG_FILE


def check_log_writable(out: str) -> None:
    """BuildError before measuring when --out DIR cannot take the log (--no-write still appends it)."""
    from tunedb.out_paths import why_unwritable

    log = log_file(out, Path(out), None)  # type: ignore[arg-type]  (a directory's log: no run needed)
    why = why_unwritable(log)
    if why is not None:
        raise BuildError(f"--no-write still appends the measurement log {log}: {why}; choose a writable --out "
                         "DIR; nothing was measured")


def existing_file(path: Path | None, family: str, arch_family: str) -> database.DatabaseFile | None:
    if path is None or not path.exists():
        return None
    try:
        return database.load(path, family, arch_family)
    except Exception:  # unreadable: the write will say why (and only --fresh replaces it)
        return None


def entry_config_ids(entry: Entry) -> tuple[str, ...]:
    """Every arm an entry names: its regions' configs and its evidence's arms (sorted)."""
    ids = set(entry.config_ids())
    ids |= {c for row in entry.evidence.values() for c in row if not c.startswith("_")}
    return tuple(sorted(ids))


def configs_of(family: Any, entries: Sequence[Entry], meas: Sequence[Measurement]) -> dict[str, Config]:
    ids = {c for e in entries for c in entry_config_ids(e)}
    ids |= {m.config_id for m in meas}
    out = {}
    for cid in sorted(ids):
        cfg = family.parse_config(cid)
        if not cfg.is_sentinel:
            out[cid] = cfg
    return out


def would_change(existing: database.DatabaseFile | None, opts: Any, arch: ArchProfile,
                  entries: Sequence[Entry], configs: Mapping[str, Config], model: Mapping[str, Any]) -> tuple[Any, ...]:
    """--no-write: the diff from the current file to what this build would write."""
    from tunedb.database import validators

    family = families.get(opts.family)
    before = None if opts.fresh else existing
    after = database.merge(before, opts.family, arch.arch_family, entries, configs,
                           validators.current(validators.family_impl_hash(family)), model)
    empty = database.DatabaseFile(opts.family, arch.arch_family)
    return database.diff(existing or empty, after)


def dropped_points(existing: database.DatabaseFile | None, entries: Sequence[Entry]) -> dict[Signature, tuple[int, ...]]:
    """Per signature this build replaces: the sizes the file's entry was measured at that this
    build did not measure (they lose their evidence, and their regions follow the new points)."""
    if existing is None:
        return {}
    out = {}
    for entry in entries:
        old = existing.entries.get(entry.signature)
        if old is None:
            continue
        def ms(e: Entry) -> set[int]:
            return {int(k[2:]) for k in e.evidence if k.startswith("M=") and k[2:].isdigit()}
        lost = tuple(sorted(ms(old) - ms(entry)))
        if lost:
            out[entry.signature] = lost
    return out
