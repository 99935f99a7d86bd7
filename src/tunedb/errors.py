"""The tunedb exception hierarchy: every error class the package raises lives here.

    TunedbError
    ├── SignatureError        a malformed or unsupported signature string/value
    ├── ConfigError           a malformed config id or parameter dict
    ├── DatabaseError         a database file cannot be used
    │   ├── CorruptDatabaseError   not JSON, truncated, wrong types, bad regions
    │   └── ValidatorMismatchError hard validator (schema, family, arch) differs
    ├── RegistryError         unknown kernel family or op name
    ├── SettingsError         a TUNEDB_* variable holds a value it does not accept
    ├── MeasurementError      the protocol refused or failed to measure
    │   ├── CaptureActiveError     asked to measure inside a CUDA-graph capture
    │   └── BusyGPUError           another compute process is on the GPU
    ├── WorkerError           the benchmark worker subprocess misbehaved
    ├── CensusError           a workload or manifest cannot be censused
    ├── InputFileError        a named input file is a FIFO, device or directory, or too large (also OSError)
    ├── BuildError            a build cannot proceed (bad flags, refused target)
    ├── UncoveredShapeError   strict mode met a must-tune point no tier covers
    └── CutoffError           a solver-cutoff call, trace or decision file is malformed

    TunedbWarning (UserWarning)
    ├── SettingsWarning       a TUNEDB_* variable tunedb does not know (a misspelled name is ignored)
    ├── DatabaseWarning       a database file or entry was skipped (corrupt, mismatched, unusable config)
    └── AutotuneWarning       an autotune cache was refused or differs in environment, or a shape fell back
        └── NoGPUWarning      confirm()/autotune() on a machine without a CUDA GPU: nothing measured
"""
from __future__ import annotations


class TunedbError(Exception):
    """Base class of every error tunedb raises."""


class SignatureError(TunedbError, ValueError):
    """A signature string or value is malformed or not supported."""


class OperandMismatchError(SignatureError, RuntimeError):
    """Operands that do not fit together (a K, dtype or bias that differs): also the RuntimeError
    torch's own op raises for the same call, so code written against nn.Linear still catches it."""


class ArgumentTypeError(SignatureError, TypeError):
    """An argument of the wrong Python type (a number, a list or None where a tensor belongs; a
    non-string mode): also the TypeError torch's own function raises for the same call."""


class ConfigError(TunedbError, ValueError):
    """A config id or parameter dict is malformed."""


class DatabaseError(TunedbError):
    """A database file cannot be used."""


class CorruptDatabaseError(DatabaseError):
    """A database file is not JSON, truncated, holds wrong types or invalid regions."""


class ValidatorMismatchError(DatabaseError):
    """A hard validator (schema, kernel family, arch family) does not match."""


class RegistryError(TunedbError, KeyError):
    """An unknown kernel family, op or lane name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0]) if self.args else ""


class SettingsError(TunedbError, ValueError):
    """A TUNEDB_* environment variable holds a value it does not accept."""


class MeasurementError(TunedbError):
    """The measurement protocol refused or failed to measure."""


class CaptureActiveError(MeasurementError):
    """Measurement was requested while a CUDA graph is being captured."""


class BusyGPUError(MeasurementError):
    """Another compute process is using the GPU and contention was not allowed."""


class WorkerError(TunedbError):
    """The benchmark worker subprocess failed outside a single request."""


class CensusError(TunedbError):
    """A workload, preset or manifest cannot be censused."""


class BuildError(TunedbError):
    """A build cannot proceed with the given inputs or flags."""


class EvaluationError(TunedbError, ValueError):
    """An evaluation or a figure cannot be produced from the given inputs (e.g. a figure path
    whose suffix names no format the plotter writes)."""


class UncoveredShapeError(TunedbError):
    """Strict mode met a must-tune point that no tier covers."""


class TunedbWarning(UserWarning):
    """Base class of every warning tunedb emits."""


class SettingsWarning(TunedbWarning):
    """A TUNEDB_* environment variable that names no setting (misspelled: nothing reads it)."""


class DatabaseWarning(TunedbWarning):
    """A database file or one of its entries was skipped; the next file or tier serves."""


class AutotuneWarning(TunedbWarning):
    """autotune(): a cache file was refused or tuned elsewhere, or a shape took the fallback."""


class NoGPUWarning(AutotuneWarning):
    """confirm() or autotune() ran without a CUDA GPU: nothing was measured (warned once per process)."""


class CutoffError(TunedbError, ValueError):
    """A block-tridiagonal system, a cutoff trace, fit or decision file is malformed."""


class InputFileError(TunedbError, OSError):
    """A file named as input (a census, manifest, capture, decision or probe file) that is not a
    regular file, or larger than any such file: a FIFO blocks a reader forever and /dev/zero never
    ends. Also an OSError, so every reader's `except OSError` names the file as for a missing one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not a readable input file"



class OutputFileError(TunedbError, ValueError):
    """A file named as output that tunedb cannot write as asked (a figure's suffix naming a format
    it does not write)."""
