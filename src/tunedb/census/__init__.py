"""The census: which GEMM shapes a workload runs, how often, and which a captured graph reaches.

    presets.py    workloads: published architecture configs (Whisper, Conformer, Llama) and module:callable
    models.py     mirror modules with the presets' Linear shapes (so no hub or transformers is needed)
    recorder.py   the aten-level shape recorder (TorchDispatchMode; meta tensors or a real device)
    modes.py      service modes: probe keys, traffic replay, captured keys (pure)
    probe.py      take_census(): probes every key under the recorder and weights the points
    censusfile.py the census JSON file: read (validated), write (atomic), merge (pure)
    capture.py    TUNEDB_CAPTURE: record_call() at run time and read_capture() (pure)

Importing this package imports neither torch nor any model code; see docs/census.md.
"""
from __future__ import annotations

from tunedb.census.capture import read_capture, record_call
from tunedb.census.censusfile import merge, read_census, write_census

__all__ = ["merge", "read_capture", "read_census", "record_call", "write_census"]
