"""The family contract: what a kernel family gives the pipeline, and the defaults of its hooks.

A family is one object with a required core (the KernelFamily Protocol below) and optional hooks
that the pipeline looks up with ``hook(family, name)``; a hook the family does not define gets
the default written here. Every default replaces a hard-code the pipeline once had for GEMM:
no cost model (unmeasured keys get the fallback or the family's heuristic), the GEMM pick rule
(a config beats the fallback by 1.05x; within 3% the simpler arm wins), rotated cold input
copies, no census rules, no run-time ops. docs/families.md describes the contract with the GEMM
family as the worked example. The pick rule itself lives in families.pick_rule and is
re-exported here. Pure Python: nothing here imports torch.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from tunedb.buckets import LADDERS
from tunedb.errors import RegistryError, SignatureError
from tunedb.families.pick_rule import PickResult, PickRule, default_simplicity, no_dependency
from tunedb.records import DTYPES, ArchProfile, Config, Signature


@dataclass(frozen=True)
class SignatureSchema:
    """The key fields of a signature besides op and dt, and its size axis.

    key: (name, type) in signature order (GEMM: N int, K int, act str, bias int); `optional`
    names the fields a signature may leave out (GEMM's op=gemm has no act or bias); `choices`
    restricts a field to listed values; `dtypes` the dt values (empty: any of records.DTYPES).
    size: the dynamic axis a database entry's regions run over ("M" for GEMM, "batch" for
    batched small problems). ladder: the bucket ladder that fills sizes ("m": step 8 to 128,
    x sqrt2 to 1024, x2 above; "pow2": powers of two).
    """

    key: tuple[tuple[str, type], ...]
    size: str = "M"
    ladder: str = "m"
    optional: tuple[str, ...] = ()
    choices: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    dtypes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.key]
        if len(set(names)) != len(names):
            raise ValueError(f"schema key repeats a field: {names}")
        for name, typ in self.key:
            if typ not in (int, str):
                raise ValueError(f"schema field {name!r} has type {typ!r}; allowed: int, str")
        unknown = [n for n in self.optional if n not in names]
        unknown += [n for n, _ in self.choices if n not in names]
        if unknown:
            raise ValueError(f"schema names fields {unknown} that are not in its key {names}")
        if self.ladder not in LADDERS:
            raise ValueError(f"schema ladder {self.ladder!r}; allowed: {', '.join(LADDERS)}")
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad:
            raise ValueError(f"schema dtypes {bad} are not dtype names ({', '.join(DTYPES)})")

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.key)

    def check(self, sig: Signature, *, dtype: bool = True) -> Signature:
        """`sig` when it fits the schema; SignatureError naming the bad field and what is allowed.
        dtype=False checks the key's fields only (a census files calls in dtypes a family leaves to torch)."""
        if dtype and self.dtypes and sig.dt not in self.dtypes:
            raise SignatureError(f"{sig}: dt={sig.dt!r} is not served; allowed: {', '.join(self.dtypes)}")
        types = dict(self.key)
        given = [k for k, _ in sig.params]
        for name in given:
            if name not in types:
                raise SignatureError(f"{sig}: unknown field {name!r}; the key fields are "
                                     f"{', '.join(self.names()) or '(none)'}")
        order = [n for n in self.names() if n in given]
        if given != order:
            raise SignatureError(f"{sig}: fields must come in the order {', '.join(self.names())}")
        allowed = dict(self.choices)
        for name, typ in self.key:
            value = sig.get(name)
            if value is None:
                if name not in self.optional:
                    raise SignatureError(f"{sig}: missing field {name!r} ({typ.__name__})")
                continue
            if not isinstance(value, typ):
                raise SignatureError(f"{sig}: field {name}={value!r} must be {typ.__name__}")
            if name in allowed and value not in allowed[name]:
                raise SignatureError(f"{sig}: field {name}={value!r}; allowed: "
                                     f"{', '.join(map(str, allowed[name]))}")
        return sig

    def make(self, family: str, op: str, dt: str, **fields: int | str) -> Signature:
        """A checked signature with the fields in schema order."""
        unknown = sorted(set(fields) - set(self.names()))
        if unknown:
            raise SignatureError(f"unknown field(s) {unknown} for {family}|op={op}; the key fields "
                                 f"are {', '.join(self.names()) or '(none)'}")
        params = tuple((n, fields[n]) for n in self.names() if n in fields)
        return self.check(Signature(family, op, dt, params))


def source_hash(folder: Any, names: Sequence[str]) -> str:
    """A family's impl_hash: sha256 over the files (relative to `folder`, in the given order) that
    decide its compiled kernels and launch grids, each name then its bytes; first 12 hex
    characters. A name whose file is absent is skipped (an optional kernel source)."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    for name in names:
        path = Path(folder) / name
        if path.exists():
            h.update(name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


class VerifyKind(str, enum.Enum):
    TOLERANCE = "tolerance"  # relative error within factor x the baseline arm's own (or a bound)
    EXACT = "exact"  # bitwise equal to the reference (integer outputs)
    RESIDUAL = "residual"  # the family's residual hook within bound (or factor x the baseline's)


@dataclass(frozen=True)
class VerifyRule:
    """The numerical gate's rule for one family (or one op of it)."""

    kind: str = "tolerance"
    factor: float = 4.0
    bound: float | None = None  # an absolute bound; None: factor x the baseline arm's error

    def __post_init__(self) -> None:
        kinds = tuple(k.value for k in VerifyKind)
        if self.kind not in kinds:
            raise ValueError(f"verify kind {self.kind!r}; allowed: {', '.join(kinds)}")
        if not self.factor >= 1.0:
            raise ValueError(f"verify factor={self.factor} must be >= 1.0")
        if self.bound is not None and not self.bound >= 0:
            raise ValueError(f"verify bound={self.bound} must be >= 0")


@dataclass(frozen=True)
class CensusRule:
    """Which aten calls become which signatures (a family's census_rules hook returns these).

    aten: aten op names (overload packets, e.g. "mm", "reciprocal_"); record(recorder, packet,
    args, kwargs) -> [(Signature, size)] for one dispatched call (an empty list: not this
    family's). recorder.is_weight(tensor) says whether an operand is a model weight."""

    aten: tuple[str, ...]
    record: Callable[..., Any]


class InputPolicy(str, enum.Enum):
    """How the measuring code feeds an arm's timed launches.

    ROTATE: cold copies of the weights rotate (the working set decides how many); arguments that
    are not weights are shared. RING: a bounded ring of fresh valid inputs made by the family's
    problem factory, refreshed outside the timed region, so that a timed launch never sees its
    own output (ops that overwrite their input). NONE: one set of inputs, reused.
    """

    ROTATE = "rotate"
    RING = "ring"
    NONE = "none"


@runtime_checkable
class KernelFamily(Protocol):
    """The required core of a family. Tensor-touching methods import torch lazily."""

    name: str  # "gemm": also the database file's stem
    ops: tuple[str, ...]
    lanes: tuple[str, ...]
    schema: SignatureSchema
    verify: Any  # a VerifyRule, or a callable sig -> VerifyRule (see verify_rule())

    def signature_of(self, op: str, *args: Any, **kwargs: Any) -> tuple[Signature, int]:
        """The static signature and the size (along schema.size) of one call."""

    def config_space(self, arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
        """Every non-sentinel config of the given lanes (all lanes when None) on this arch."""

    def parse_config(self, config_id: str) -> Config:
        """A config from its stable id (sentinels included); ConfigError when malformed."""

    def invalid_reason(self, config: Config, sig: Signature, m: int | None,
                       arch: ArchProfile) -> str | None:
        """THE validity predicate: None when `config` may run `sig` at size m on `arch`, else why
        not. m is None when the question is about every size (resolve and compile time)."""

    def sentinels(self, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
        """The sentinel arms that apply to `sig` (always 'default' and the pick rule's fallback)."""

    def default_config(self, sig: Signature, arch: ArchProfile | None = None) -> Config:
        """The family's untuned choice for `sig` (what the sentinel 'default' runs)."""

    def compile_set(self, arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
        """The production compile set: referenced configs + default + a coverage basis."""

    def launch(self, config: Config, sig: Signature, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        """Run `sig`'s op with `config`; writes into `out` when given."""

    def reference(self, sig: Signature, *args: Any, **kwargs: Any) -> Any:
        """The op in higher precision on upcast inputs: what the numerical gate compares with."""

    def make_inputs(self, sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The problem factory: fresh valid random inputs (never zeros) for `sig` at size m."""

    def work(self, sig: Signature, m: int) -> tuple[float, float]:
        """(FLOPs, fewest bytes moved) of one call."""

    # impl_hash: a str, or a callable returning one, over what decides the compiled kernels
    # and their launch grid (the database's soft validator); nothing else.


REQUIRED: tuple[str, ...] = (
    "name", "ops", "lanes", "schema", "verify", "signature_of", "config_space", "parse_config",
    "invalid_reason", "sentinels", "default_config", "compile_set", "launch", "reference",
    "make_inputs", "work", "impl_hash")


def missing_members(family: Any) -> tuple[str, ...]:
    """The required members `family` lacks (empty: it implements the contract's core)."""
    return tuple(name for name in REQUIRED if not hasattr(family, name))


# --- optional hooks and their defaults --------------------------------------------------------


def _call_key(family: Any, op: str, *args: Any, **kwargs: Any) -> tuple[Signature, int]:
    return family.signature_of(op, *args, **kwargs)


def _none(family: Any, *args: Any, **kwargs: Any) -> None:
    return None


# name -> default(family, *args); the comment gives the hook's own signature and what it answers.
DEFAULTS: Mapping[str, Callable[..., Any]] = {
    "pick_rule": lambda family: PickRule(),  # () -> PickRule
    "input_policy": lambda family, sig: InputPolicy.ROTATE,  # (sig) -> InputPolicy
    # (sig) -> positions of the positional args ROTATE copies (None: every one but the first)
    "weight_args": _none,
    # (profile, params) -> a model with rank/predict/pick, or None: unmeasured keys get the
    # family's heuristic, else the pick rule's fallback (runtime/untuned.py); a build measures
    # every valid config
    "cost_model": _none,
    # (sig, m, arch) -> Config or None: the untuned answer before the pick rule's fallback; the
    # selector passes m=None (one answer per signature) unless the family class sets
    # HEURISTIC_PER_SIZE = True (then the call's size: group_gemm)
    "heuristic": _none,
    # (sig) -> whether a config that beat the fallback by the gate at the measured size nearest m
    # keeps serving beyond the measured range (runtime/serving.unsupported): only for independent
    # per-item work whose every arm costs at most its edge time below it and scales alike above
    "extrapolates": lambda family, sig: False,
    # (config_id) -> whether the arm's optional dependency (spec 003's tier) is installed here:
    # where it is not, an entry's dependency-free regions serve (runtime/serving.walk)
    "dependency_available": lambda family, config_id: True,
    # (sig, args, kwargs, out) -> float: the residual rule's measure on the inputs the arm started
    # from (without the hook a residual rule cannot pass: the gate says so)
    "residual": _none,
    "make_out": _none,  # (sig, args, kwargs, reference) -> output buffer (None: like the reference)
    "census_rules": lambda family: (),  # () -> CensusRules (which aten calls become signatures)
    # (model) -> names of the model's modules whose calls only the fused census keys (the aten
    # level sees none of them: transformers' MoE expert blocks), for the census to say so
    "aten_unkeyed": lambda family, model: (),
    "serving_keys": lambda family, sig: sig.lookup_keys(),  # (sig) -> keys that may serve sig, most specific first
    "warm_start": _none,  # () -> None: one-time compiler state for a measuring worker
    "prebuild": _none,  # (args) -> exit status of `tunedb prebuild --family NAME`
    "register_ops": _none,  # () -> None: the family's torch.library ops
    "call_key": _call_key,  # (op, *args, **kwargs) -> (Signature, size) at run time
    "patch_rules": lambda family: (),  # () -> optimize()'s module patch rules (descriptive)
    "optimize": lambda family, model, approximate=False: model,  # (model, approximate) -> patched model
    "calibrate": _none,  # (profile, measurements, configs, old) -> the database file's `model` object
    # (raw) -> why a database file's `model` object cannot calibrate the cost model, or None: the
    # selector then takes the next tier's (a user file's bad object never hides the shipped one)
    "model_problem": _none,
    "weight_bytes": lambda family, sig: 0,  # (sig) -> weight bytes one call reads (the L2 working set)
    "prebuilt_configs": lambda family, arch_family: frozenset(),  # (arch_family) -> ids `tunedb prebuild` compiled
    "compiler_cache": _none,  # () -> where the family's compiled kernels are cached (for reports)
    # (sig, m, config, profile, params) -> the sentinel id that serves this shape's calls made
    # outside CUDA-graph capture (where the host issues every launch), or None: the config serves
    # every call (runtime/host_bound.py)
    "eager_fallback": _none,
    # (config) -> whether the first eager call of a shape eager_fallback moved runs the config once
    # too (its outputs dropped), so that a capture finds its binary loaded and its workspace made
    # outside the graph; only for launchers that write nothing but their output
    "eager_prime": lambda family, config: False,
    # (config) -> (plain_config, pdl_config, admits) or None: a config with a programmatic-dependent-
    # launch twin; inside a capture the twin serves the calls that directly follow one of ours and
    # that admits(*launch_args) allows, the plain config every other call (runtime/capture_chain.py)
    "pdl_pair": _none,
    # (arch_family, sig, config_ids) -> picklable jobs, each with run() -> {"ok", "error", "seconds"},
    # that compile those configs into compiler_cache() as a launch would (build/compile_pool.py)
    "compile_jobs": lambda family, arch_family, sig, config_ids: [],
    "compile_warm": _none,  # () -> None: one-time compiler state for a compile-pool process
    # (scheme) -> an object with require(), quantize(model, device) and recorder() that `tunedb
    # census --quantization SCHEME` applies, or None when the family has no such scheme
    "census_quantizer": _none,
    "report_lines": lambda family: [],  # () -> tuning_report() lines of the family's own (per model)
}


def hook(family: Any, name: str) -> Callable[..., Any]:
    """The family's hook `name` (a method, or a plain value such as `pick_rule = PickRule(...)`),
    else the default for it."""
    if name not in DEFAULTS:
        raise RegistryError(f"unknown family hook {name!r}; hooks: {', '.join(DEFAULTS)}")
    own = getattr(family, name, None)
    if own is None:
        return functools.partial(DEFAULTS[name], family)
    if callable(own):
        return own
    return lambda *args, **kwargs: own  # a plain value (pick_rule = PickRule(...)) answers every call


def has_hook(family: Any, name: str) -> bool:
    """Whether the family defines `name` itself (not the default)."""
    if name not in DEFAULTS:
        raise RegistryError(f"unknown family hook {name!r}; hooks: {', '.join(DEFAULTS)}")
    return getattr(family, name, None) is not None


def verify_rule(family: Any, sig: Signature) -> VerifyRule:
    """The family's verify rule for `sig` (its `verify` attribute or verify(sig))."""
    rule = getattr(family, "verify", None)
    if rule is None:
        return VerifyRule()
    if isinstance(rule, VerifyRule):
        return rule
    if callable(rule):
        out = rule(sig)
        if isinstance(out, VerifyRule):
            return out
    raise RegistryError(f"kernel family {getattr(family, 'name', family)!r}: verify must be a VerifyRule "
                        f"or a callable sig -> VerifyRule, got {rule!r}")


__all__ = ["CensusRule", "DEFAULTS", "InputPolicy", "KernelFamily", "LADDERS", "PickResult", "PickRule",
           "REQUIRED", "SignatureSchema", "VerifyKind", "VerifyRule", "default_simplicity", "has_hook", "hook",
           "missing_members", "no_dependency", "verify_rule"]
