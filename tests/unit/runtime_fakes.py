"""Test helpers for the runtime: the real GEMM family with a recording launcher and a fake
measurer (no GPU anywhere); the temp tiers fixture `tiers_dirs` is the root conftest's."""
from __future__ import annotations

from typing import Any

import pytest

from tunedb import families
from tunedb.records import Measurement, Signature, Status


class RecordingGemm:
    """The real GEMM family (signatures, configs, validity, selection), but launching on CPU:
    each launcher records its config and computes F.linear + activation."""

    def __init__(self) -> None:
        self.real = families.get("gemm")
        self.built: list[tuple[str, str]] = []  # (config id, signature) per launcher built
        self.ran: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def launcher(self, config, sig):
        import torch.nn.functional as F

        from tunedb.families.gemm.ops import ACTS

        self.built.append((config.id, sig.format()))
        act = ACTS[sig.get("act", "none")]

        def run(x, weight, bias, out):
            self.ran.append(config.id)
            return act(F.linear(x, weight, bias))

        return run


class FakeMeasurer:
    """Times every arm from a table: winner(m) gets 1.0 ms, others 2.0; 'broken' arms fail."""

    def __init__(self, winner=lambda sig, m, ids: ids[0], fail: bool = False) -> None:
        self.winner = winner
        self.fail = fail
        self.calls: list[tuple[Signature, int, tuple[str, ...], str | None]] = []

    def __call__(self, family, sig, m, config_ids, incumbent):
        self.calls.append((sig, m, tuple(config_ids), incumbent))
        if self.fail:
            raise RuntimeError("the GPU caught fire")
        best = self.winner(sig, m, config_ids)
        out = []
        for cid in config_ids:
            if cid == "torch" and best != "torch":
                out.append(Measurement(sig, m, cid, Status.INCORRECT, detail="poisoned output"))
                continue
            ms = 1.0 if cid == best else 2.0
            out.append(Measurement(sig, m, cid, Status.OK, ms, 0.01, 9, (ms,) * 9))
        return out


@pytest.fixture
def gemm(monkeypatch, tiers_dirs):
    """The recording GEMM family behind the launch table (and the registry). The cost-model tier
    is off: these tests pin which of user/system/autotune/default answers an uncovered shape."""
    monkeypatch.setenv("TUNEDB_MODEL_FALLBACK", "0")
    fam = RecordingGemm()
    monkeypatch.setitem(families._REGISTRY, "gemm", fam)
    yield fam  # tiers_dirs clears the launch table before and after
