"""Inputs a robotics / scientific user hands the linalg entry points and tunedb.cutoff that no test
named before (session 55 probe): meta tensors wanting gradients (shapes inferred on meta), an array
where a tensor goes, a Decision built by hand, a probe without a problem class, and PCG arguments
checked whatever policy a solve picks."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tunedb import cutoff
from tunedb.errors import CutoffError, SignatureError
from tunedb.families.linalg import ops as la


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "potrf", "trsv", "posv"])
def test_meta_tensors_wanting_gradients_give_shapes(op):
    a = torch.empty(2, 4, 4, device="meta", dtype=torch.float64, requires_grad=True)
    v = torch.empty(2, 4, device="meta", dtype=torch.float64, requires_grad=True)
    args = {"dot": (v, v), "gemv": (a, v), "gemm": (a, a), "potrf": (a,), "trsv": (a, v), "posv": (a, v)}[op]
    out = getattr(la, op)(*args)
    y = out[0] if isinstance(out, tuple) else out
    want = {"dot": (2,), "gemv": (2, 4), "gemm": (2, 4, 4), "potrf": (2, 4, 4), "trsv": (2, 4), "posv": (2, 4)}[op]
    assert tuple(y.shape) == want and y.device.type == "meta"
    y.sum().backward()
    assert (a.grad if op != "dot" else v.grad).device.type == "meta"


def test_an_array_is_named_not_printed():
    a = np.eye(3)[None].repeat(2, 0)
    with pytest.raises(SignatureError, match=r"linalg potrf's A must be a torch.Tensor, got ndarray") as info:
        la.potrf(a)
    assert "array(" not in str(info.value)
    with pytest.raises(SignatureError, match=r"linalg gemv's x must be a torch.Tensor, got list"):
        la.gemv(torch.eye(3).expand(2, 3, 3).contiguous(), [[1.0, 2.0, 3.0]] * 2)


@pytest.mark.parametrize("kwargs, named", [
    ({"below": "Iterative"}, "below='Iterative'"),
    ({"above": "auto"}, "above='auto'"),
    ({"cutoff": float("nan")}, "cutoff=nan"),
    ({"cutoff": "0.5"}, "cutoff='0.5'"),
    ({"problem": ""}, "problem=''"),
])
def test_a_decision_built_by_hand_is_checked_as_one_read_from_a_file(kwargs, named):
    args = {"problem": "p", "device": "cpu", "cutoff": 1.0}
    args.update(kwargs)
    with pytest.raises(CutoffError, match=named.replace("(", r"\(")):
        cutoff.Decision(**args)


def test_a_decision_that_chooses_no_policy_is_named_with_its_choice():
    class Chooser:
        def policy_for(self, signal):
            return "fast"

    strip, b = cutoff.random_system(2, 2, 3)
    with pytest.raises(CutoffError, match=r"chose policy 'fast' for signal=0.5; allowed: direct, iterative"):
        cutoff.solve(strip, b, signal=0.5, decision=Chooser())


@pytest.mark.parametrize("signal", [0.1, 1.0])  # iterative below the cutoff, direct above it
@pytest.mark.parametrize("bad, named", [
    ({"max_iter": "x"}, "max_iter"), ({"check_every": 0}, "check_every"), ({"tol": -1.0}, "tol"),
    ({"tol": True}, "tol"),
])
def test_pcg_arguments_are_checked_whatever_policy_the_signal_picks(signal, bad, named):
    strip, b = cutoff.random_system(2, 3, 4)
    decision = cutoff.Decision("p", "cpu", 0.5)
    with pytest.raises(CutoffError, match=named):
        cutoff.solve(strip, b, signal=signal, decision=decision, **bad)


@pytest.mark.parametrize("problem", [None, "", 123])
def test_a_probe_without_a_problem_class_is_refused_before_it_runs(problem):
    ran = []
    with pytest.raises(CutoffError, match=r"problem=.* must be a non-empty string"):
        cutoff.probe(lambda solver: ran.append(1), problem=problem, device="cpu", discard=0)
    assert not ran


def test_persist_names_what_is_not_a_probe(tmp_path):
    with pytest.raises(CutoffError, match=r"persist's fit=None is not a Fit"):
        cutoff.persist(None, None, path=tmp_path / "d.json")
    with pytest.raises(CutoffError, match=r"persist's probe='p' is not a Probe"):
        cutoff.persist(SimpleNamespace(cutoff=1.0), "p", path=tmp_path / "d.json")
    assert not (tmp_path / "d.json").exists()


def test_a_decision_file_with_a_bad_policy_is_named_in_the_checks_own_words():
    good = cutoff.Decision("mpc", "cpu", 1.0).to_json()
    with pytest.raises(CutoffError) as info:
        cutoff.Decision.from_json({**good, "below": "Iterative"})
    assert str(info.value) == "decision 'mpc@cpu': below='Iterative'; allowed: direct, iterative"
