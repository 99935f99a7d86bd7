"""optimize()'s choice of families: the default family always, another family only where this
arch has a measured table for it (else its modules stay the model's own), "all" or names on
request, and an unknown name refused."""
from __future__ import annotations

import pytest
import torch

from tunedb import database
from tunedb.errors import RegistryError
from tunedb.runtime import patching


def _model():
    return torch.nn.Sequential(torch.nn.Conv1d(8, 8, 3, padding=1), torch.nn.Linear(8, 8),
                               torch.nn.LSTM(8, 8, batch_first=True))


def test_unmeasured_families_leave_their_modules_alone(tiers_dirs, monkeypatch):
    monkeypatch.setattr(patching, "_measured", lambda name: False)
    assert patching.patching_families() == ("gemm",)
    m = patching.optimize(_model())
    assert type(m[0]) is torch.nn.Conv1d and type(m[2]) is torch.nn.LSTM
    # the default family judges what no table covers: torch's by a guess, the Linear is left (its
    # mark says so: autotune() swaps it on entry), and with TUNEDB_LEAVE_UNMEASURED=0 it is swapped
    assert type(m[1]) is torch.nn.Linear and m[1].__dict__["_tunedb_left"][1] is True
    monkeypatch.setenv("TUNEDB_LEAVE_UNMEASURED", "0")
    assert type(patching.optimize(_model())[1]).__name__ == "TunedLinear"


def test_a_measured_family_patches_and_all_or_names_force_it(monkeypatch):
    monkeypatch.setattr(patching, "_measured", lambda name: name == "conv")
    assert patching.patching_families() == ("conv", "gemm")
    m = patching.optimize(_model())
    assert type(m[0]) is not torch.nn.Conv1d and type(m[2]) is torch.nn.LSTM
    assert set(patching.patching_families("all")) >= {"conv", "gemm", "rnn", "group_gemm"}
    assert patching.patching_families(["rnn"]) == ("rnn",)
    m = patching.optimize(_model(), families="rnn")
    assert type(m[1]) is torch.nn.Linear and type(m[2]) is not torch.nn.LSTM


def test_an_unknown_family_is_refused():
    with pytest.raises(RegistryError, match="nosuch"):
        patching.optimize(_model(), families=["nosuch"])


@pytest.mark.parametrize("families,hint", [("gemmx", ""), (["all"], "a value of its own")])
def test_the_refusal_names_every_allowed_value(families, hint):
    with pytest.raises(RegistryError, match=r"allowed are None .*\"all\", or names of .*gemm") as err:
        patching.optimize(_model(), families=families)
    assert hint in str(err.value)


def test_measured_reads_the_tiers(tiers_dirs):
    assert not patching._measured("conv")  # empty temp tiers: nothing measured
    assert database is not None
