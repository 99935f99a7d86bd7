"""The database file format: parse and validate one JSON file, and serialize it back.

One file per (arch family, kernel family); docs/database.md is the format reference. Parsing is
strict: anything a reader could misread (a duplicate key, unsorted regions, a region naming a
config the file does not define) is a CorruptDatabaseError that names the problem. Pure Python.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tunedb import families
from tunedb.errors import ConfigError, CorruptDatabaseError, SignatureError, ValidatorMismatchError
from tunedb.records import SENTINELS, Config, Entry, Region, Signature, Status

SCHEMA_VERSION = 1
TOP_KEYS: tuple[str, ...] = ("schema", "kernel_family", "arch_family", "validators", "configs",
                             "entries", "model")
ENTRY_KEYS: tuple[str, ...] = ("regions", "regions_native", "evidence", "source", "soft", "notes")
SOFT_VALIDATORS: tuple[str, ...] = ("impl_hash", "sku", "triton", "torch", "cuda", "tunedb")
FAILURE_STATUSES: tuple[str, ...] = tuple(s.value for s in Status if s is not Status.OK)

_POINT = re.compile(r"^M=([1-9][0-9]*)$")
_ARCH = re.compile(r"^sm[0-9]+[a-z]?$")


@dataclass(frozen=True)
class DatabaseFile:
    """One parsed database file. `entries` is keyed by Signature; `model` is kept verbatim."""

    kernel_family: str
    arch_family: str
    validators: Mapping[str, str] = field(default_factory=dict, hash=False)
    configs: Mapping[str, Config] = field(default_factory=dict, hash=False)
    entries: Mapping[Signature, Entry] = field(default_factory=dict, hash=False)
    model: Mapping[str, Any] | None = field(default=None, hash=False)
    schema: int = SCHEMA_VERSION

    def referenced_config_ids(self) -> tuple[str, ...]:
        """Non-sentinel config ids that some region names, sorted."""
        ids = {cid for e in self.entries.values() for cid in e.config_ids()}
        return tuple(sorted(ids - set(SENTINELS)))


def _fail(source: str, problem: str) -> CorruptDatabaseError:
    return CorruptDatabaseError(f"{source}: {problem}")


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    # json accepts NaN and Infinity; a time of Infinity is a magic number, not a status.
    raise ValueError(f"non-finite number {name} is not allowed (a failure is a status string)")


def _finite_float(text: str) -> float:
    # 1e400 parses to inf (past NaN and Infinity's check): a cost model's inf served every shape
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is beyond a float (non-finite); a failure is a status string")
    return value


MAX_INT = 2 ** 63 - 1  # every count, size and time in a table fits; a larger one no float holds


def _bounded_int(digits: str) -> int:
    # a huge integer is valid JSON, but math.isfinite() and every float() of it raise
    # OverflowError far from the reader (a crash in selection, status, diff)
    if len(digits.lstrip("-")) > 19 or abs(int(digits)) > MAX_INT:
        shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits.lstrip('-'))} digits)"
        raise ValueError(f"integer {shown} is too large (a table's numbers fit in 64 bits)")
    return int(digits)


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def loads(text: str, source: str = "<string>") -> Any:
    """JSON text -> raw object; CorruptDatabaseError when it is not JSON, repeats a key or
    holds NaN/Infinity, an integer beyond 64 bits or a lone surrogate escape (not text: printing it
    raised UnicodeEncodeError in `tunedb status` and `diff`)."""
    try:
        raw = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constant,
                         parse_int=_bounded_int, parse_float=_finite_float)
        if _SURROGATE.search(text):  # a \udXXX escape: only a pair makes a character
            try:
                json.dumps(raw, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("holds a lone UTF-16 surrogate escape (\\ud800-\\udfff): not text") from None
        return raw
    except json.JSONDecodeError as exc:
        # (json's own message may end in "at": "Invalid control character at")
        raise _fail(source, f"not valid JSON (truncated?): {exc.msg.removesuffix(' at')} at line {exc.lineno} "
                            f"column {exc.colno}") from None
    except ValueError as exc:  # from no_duplicate_keys / _no_constant
        raise _fail(source, str(exc)) from None
    except RecursionError:
        raise _fail(source, "nested too deeply to read") from None


# far above any table (the shipped ones are under a few MB): a path to a huge or endless file
# is refused before it is read
MAX_FILE_BYTES = 1 << 30


def read_raw(path: Path) -> Any:
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise _fail(str(path), "not a regular file")
    if path.exists() and path.stat().st_size > MAX_FILE_BYTES:
        raise _fail(str(path), f"{path.stat().st_size} bytes, over the {MAX_FILE_BYTES >> 20} MiB a table may hold")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (a Windows editor) is not corruption
    except UnicodeDecodeError:
        raise _fail(str(path), "not UTF-8 text") from None
    return loads(text, str(path))


def check_hard(raw: Any, source: str, kernel_family: str | None = None,
               arch_family: str | None = None) -> None:
    """The hard validators: schema version, kernel family, arch family (None: not checked).

    Raises CorruptDatabaseError when they are missing or of the wrong type and
    ValidatorMismatchError when they hold another value than expected.
    """
    if not isinstance(raw, dict):
        raise _fail(source, f"top level must be a JSON object, got {type(raw).__name__}")
    for key in ("schema", "kernel_family", "arch_family"):
        if key not in raw:
            raise _fail(source, f"missing top-level key {key!r}")
    schema = raw["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise _fail(source, f"'schema' must be an integer, got {schema!r}")
    if schema != SCHEMA_VERSION:
        raise ValidatorMismatchError(
            f"{source}: schema {schema} is not supported (this tunedb reads schema {SCHEMA_VERSION})")
    for key, want in (("kernel_family", kernel_family), ("arch_family", arch_family)):
        value = raw[key]
        if not isinstance(value, str) or not value:
            raise _fail(source, f"{key!r} must be a non-empty string, got {value!r}")
        if want is not None and value != want:
            raise ValidatorMismatchError(f"{source}: {key} is {value!r}, expected {want!r}")
    if not _ARCH.match(raw["arch_family"]):
        raise _fail(source, f"arch_family {raw['arch_family']!r} is not of the form sm<digits>")


def _validator_map(value: Any, where: str, source: str, allow_mixed: bool) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(source, f"{where} must be an object, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key not in SOFT_VALIDATORS:
            raise _fail(source, f"{where} has unknown validator {key!r}; known: "
                                f"{', '.join(SOFT_VALIDATORS)}")
        if isinstance(v, str):
            out[key] = v
        elif allow_mixed and isinstance(v, list) and len(v) >= 2 and all(isinstance(x, str) for x in v):
            out[key] = tuple(v)  # a mixed entry: measured under several values
        else:
            allowed = "a string or a list of >= 2 strings" if allow_mixed else "a string"
            raise _fail(source, f"{where}[{key!r}] must be {allowed}, got {v!r}")
    return out


def _parse_configs(value: Any, source: str, kernel_family: str) -> dict[str, Config]:
    if not isinstance(value, dict):
        raise _fail(source, f"'configs' must be an object, got {type(value).__name__}")
    out = {}
    for cid, data in value.items():
        if cid in SENTINELS:
            raise _fail(source, f"config {cid!r} is a sentinel and must not be defined")
        try:
            out[cid] = Config.from_json(cid, data)
        except ConfigError as exc:
            raise _fail(source, f"configs: {exc}") from None
        why = contradicts_id(out[cid], kernel_family)
        if why:
            raise _fail(source, f"config {cid!r}: {why}")
    return out


def contradicts_id(config: Config, kernel_family: str) -> str | None:
    """Why a config's body is not what its id names (an edited block size under the old id: caches,
    compiled kernels and other files know a config by its id, so two bodies under one id served
    the wrong kernel somewhere), or None. A family this process does not know is not checked."""
    try:
        fam = families.get(kernel_family)
    except KeyError:  # RegistryError: the family check of the file names it elsewhere
        return None
    try:
        named = fam.parse_config(config.id)
    except ConfigError as exc:
        return f"the id is not one of {kernel_family}'s configs ({exc})"
    # fields both name (a file written before a field existed leaves it to the launcher's default)
    ids, body = dict(named.params), dict(config.params)
    diff = sorted(k for k in set(ids) & set(body) if ids[k] != body[k])
    if named.lane != config.lane or diff:
        fields = ["lane"] * (named.lane != config.lane) + diff
        return (f"its body contradicts its id in {', '.join(fields)} (the id names "
                f"{named.to_json()}); fix the body or the id")
    return None


def _parse_regions(value: Any, where: str, configs: Mapping[str, Config], source: str) -> tuple[Region, ...]:
    if not isinstance(value, list) or not value:
        raise _fail(source, f"{where}: 'regions' must be a non-empty list")
    regions: list[Region] = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) != 2:
            raise _fail(source, f"{where}: region {i} must be [m_hi, config_id], got {item!r}")
        m_hi, cid = item
        if m_hi is not None and (not isinstance(m_hi, int) or isinstance(m_hi, bool) or m_hi < 1):
            raise _fail(source, f"{where}: region {i} m_hi={m_hi!r} must be a positive int or null")
        if not isinstance(cid, str):
            raise _fail(source, f"{where}: region {i} config id {cid!r} must be a string")
        if cid not in configs and cid not in SENTINELS:
            raise _fail(source, f"{where}: region {i} names config {cid!r}, which the file does not "
                                f"define (sentinels: {', '.join(SENTINELS)})")
        if regions and regions[-1].m_hi is None:
            raise _fail(source, f"{where}: the catch-all [null, ...] must be the last region")
        if m_hi is not None and regions and regions[-1].m_hi is not None and m_hi <= regions[-1].m_hi:
            raise _fail(source, f"{where}: regions must be sorted by m_hi without duplicates "
                                f"({m_hi} follows {regions[-1].m_hi})")
        regions.append(Region(m_hi, cid))
    return tuple(regions)


def _parse_evidence(value: Any, where: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(source, f"{where}: 'evidence' must be an object")
    for point, arms in value.items():
        if not _POINT.match(point):
            raise _fail(source, f"{where}: evidence key {point!r} must be 'M=<positive int>'")
        if not isinstance(arms, dict):
            raise _fail(source, f"{where}: evidence[{point!r}] must be an object")
        for arm, result in arms.items():
            if arm.startswith("_"):
                if not isinstance(result, (str, int, float, bool)) and result is not None:
                    raise _fail(source, f"{where}: evidence[{point!r}][{arm!r}] must be a scalar")
                continue
            if isinstance(result, str):
                if result not in FAILURE_STATUSES:
                    raise _fail(source, f"{where}: evidence[{point!r}][{arm!r}]={result!r} is not a "
                                        f"failure status ({', '.join(FAILURE_STATUSES)})")
                continue
            ok = (isinstance(result, list) and len(result) == 3
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
                          and (isinstance(x, int) or math.isfinite(x)) for x in result)
                  and isinstance(result[2], int))
            if not ok:
                raise _fail(source, f"{where}: evidence[{point!r}][{arm!r}] must be "
                                    f"[median_ms, sigma_ms, n] or a failure status, got {result!r}")
    return value


def _parse_entry(key: Any, value: Any, kernel_family: str, configs: Mapping[str, Config],
                 source: str) -> Entry:
    try:
        sig = Signature.parse(key)
    except SignatureError as exc:
        raise _fail(source, f"entry key: {exc}") from None
    where = f"entry {key!r}"
    if sig.family != kernel_family:
        raise _fail(source, f"{where} belongs to kernel family {sig.family!r}, the file to {kernel_family!r}")
    try:
        families.check_key(sig)
    except SignatureError as exc:
        raise _fail(source, f"entry key: {exc}") from None
    if not isinstance(value, dict):
        raise _fail(source, f"{where} must be an object")
    unknown = sorted(set(value) - set(ENTRY_KEYS))
    if unknown:
        raise _fail(source, f"{where} has unknown keys {unknown}; allowed: {', '.join(ENTRY_KEYS)}")
    if "regions" not in value:
        raise _fail(source, f"{where} has no 'regions'")
    regions = _parse_regions(value["regions"], where, configs, source)
    native = value.get("regions_native")
    if native is not None:
        native = _parse_regions(native, f"{where} (regions_native)", configs, source)
    evidence = _parse_evidence(value.get("evidence", {}), where, source)
    source_tag = value.get("source", "build")
    if not isinstance(source_tag, str):
        raise _fail(source, f"{where}: 'source' must be a string")
    soft = _validator_map(value.get("soft", {}), f"{where}: 'soft'", source, allow_mixed=True)
    notes = value.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _fail(source, f"{where}: 'notes' must be a list of strings")
    return Entry(sig, regions, evidence, source_tag, soft, tuple(notes), native)


def parse(raw: Any, source: str = "<data>", kernel_family: str | None = None,
          arch_family: str | None = None) -> DatabaseFile:
    """A raw JSON object -> DatabaseFile. Hard validators first (ValidatorMismatchError), then
    the full structure (CorruptDatabaseError)."""
    check_hard(raw, source, kernel_family, arch_family)
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise _fail(source, f"unknown top-level keys {unknown}; allowed: {', '.join(TOP_KEYS)}")
    validators = _validator_map(raw.get("validators", {}), "'validators'", source, allow_mixed=False)
    configs = _parse_configs(raw.get("configs", {}), source, raw["kernel_family"])
    entries_raw = raw.get("entries", {})
    if not isinstance(entries_raw, dict):
        raise _fail(source, f"'entries' must be an object, got {type(entries_raw).__name__}")
    entries = {}
    for key, value in entries_raw.items():
        entry = _parse_entry(key, value, raw["kernel_family"], configs, source)
        entries[entry.signature] = entry
    model = raw.get("model")
    if model is not None and not isinstance(model, dict):
        raise _fail(source, f"'model' must be an object or absent, got {type(model).__name__}")
    return DatabaseFile(raw["kernel_family"], raw["arch_family"], validators, configs, entries,
                        model, raw["schema"])


def load(path: Path, kernel_family: str | None = None, arch_family: str | None = None) -> DatabaseFile:
    """Read and parse one file (OSError when unreadable)."""
    return parse(read_raw(path), str(path), kernel_family, arch_family)


def entry_to_json(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"regions": [r.to_json() for r in entry.regions]}
    if entry.regions_native is not None:
        out["regions_native"] = [r.to_json() for r in entry.regions_native]
    if entry.evidence:
        out["evidence"] = {k: entry.evidence[k] for k in sorted(entry.evidence, key=_point_order)}
    out["source"] = entry.source
    if entry.soft:
        out["soft"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(entry.soft.items())}
    if entry.notes:
        out["notes"] = list(entry.notes)
    return out


def _point_order(key: str) -> tuple[int, str]:
    match = _POINT.match(key)
    return (int(match.group(1)) if match else 0, key)


def to_json(db: DatabaseFile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": db.schema, "kernel_family": db.kernel_family, "arch_family": db.arch_family,
        "validators": dict(sorted(db.validators.items())),
        "configs": {cid: db.configs[cid].to_json() for cid in sorted(db.configs)},
        "entries": {sig.format(): entry_to_json(db.entries[sig])
                    for sig in sorted(db.entries, key=lambda s: s.format())},
    }
    if db.model is not None:
        out["model"] = db.model
    return out


def dumps(db: DatabaseFile) -> str:
    """Deterministic text: sorted keys where order carries no meaning, short lists on one line."""
    return _format(to_json(db), 0) + "\n"


def _is_flat(value: Any) -> bool:
    return isinstance(value, list) and all(
        not isinstance(x, (dict, list)) or (isinstance(x, list) and _is_flat(x)) for x in value)


def _format(value: Any, level: int) -> str:
    # Regions, configs and evidence points stay on one line each, so a diff of two files reads
    # per region / per config / per point.
    if isinstance(value, dict) and value and all(
            not isinstance(v, (dict, list)) or _is_flat(v) for v in value.values()):
        line = json.dumps(value, separators=(", ", ": "), allow_nan=False)
        if len(line) + 2 * level <= 100:
            return line
    if isinstance(value, dict) and value:
        pad, inner = "  " * level, "  " * (level + 1)
        items = [f"{inner}{json.dumps(k)}: {_format(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and not _is_flat(value):
        pad, inner = "  " * level, "  " * (level + 1)
        return "[\n" + ",\n".join(inner + _format(v, level + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, separators=(", ", ": "), allow_nan=False)
