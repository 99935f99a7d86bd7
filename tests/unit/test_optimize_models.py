"""tunedb.optimize() on small models of shapes nobody measured, as a new user would write them:
what it swaps, what it fuses, and that the optimized model computes what the plain one does on
the CPU (the torch arm: exactly F.linear + activation)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb
from eager_attention import Attention
from tunedb.families.bmm import serving as bmm_serving
from tunedb.runtime import patching

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _tuned(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "TunedLinear"]


def test_the_bmm_product_mode_on_the_top_module_does_not_stop_gemm_fusing_there(monkeypatch):
    # where this arch has a bmm table (sm90 ships one), the bmm family hooks the top module's
    # forward; GEMM read those hooks as a user's and fused nothing in a top-level Sequential
    monkeypatch.setattr(patching, "_measured", lambda name: name == "bmm")
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    monkeypatch.setattr(bmm_serving, "can_serve", lambda: True)
    from tunedb.families.bmm import product_source

    monkeypatch.setattr(product_source, "makes_products", lambda model: True)  # as a model with attention
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8), nn.SiLU())
    model = tunedb.optimize(copy.deepcopy(plain))
    assert getattr(model, "_tunedb_bmm_serving", False)  # the product mode is installed
    assert [m.act for m in _tuned(model)] == ["gelu", "silu"]
    x = torch.randn(5, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)


def test_a_users_hook_on_the_top_module_still_stops_fusion_there(monkeypatch):
    monkeypatch.setattr(patching, "_measured", lambda name: name == "bmm")
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    monkeypatch.setattr(bmm_serving, "can_serve", lambda: True)
    plain = nn.Sequential(nn.Linear(16, 32), nn.GELU())
    plain.register_forward_hook(lambda mod, args, out: None)
    model = tunedb.optimize(plain)
    assert [m.act for m in _tuned(model)] == ["none"]


def test_an_optimized_model_compiles_with_fullgraph_where_the_bmm_mode_is_installed(monkeypatch):
    # the product mode's forward pre-hook built its class per call: under torch.compile a graph
    # break, so fullgraph=True (which docs/runtime.md says works) failed on every optimized model
    # of an arch with a bmm table (sm90 ships one)
    monkeypatch.setattr(patching, "_measured", lambda name: name == "bmm")
    monkeypatch.setattr(bmm_serving, "has_table", lambda: True)
    monkeypatch.setattr(bmm_serving, "can_serve", lambda: True)
    torch.manual_seed(0)
    plain = Attention().eval()
    model = tunedb.optimize(copy.deepcopy(plain))
    assert getattr(model, "_tunedb_bmm_serving", False)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), plain(x), rtol=0, atol=0)
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)  # eager: the mode comes and goes
    assert not getattr(bmm_serving._state, "modes", [])


def test_a_gpu_with_no_profile_serves_torch_not_an_untuned_triton_tile(tiers_dirs, monkeypatch):
    # a new user's A100 (sm80: no shipped profile, none measured yet): every GEMM took the family
    # default, the Triton tile b64x64x64 nobody timed there, in place of the cuBLAS call it had
    import warnings

    from tunedb import settings
    from tunedb.records import Signature
    from tunedb.runtime import selector

    selector.configure("sm80")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for op, extra in (("gemm", {}), ("gemm_act", dict(act="gelu", bias=1))):
                sig = Signature.make("gemm", op, "half", N=512, K=512, **extra)
                for m in (1, 64, 4096):
                    got = selector.resolve("gemm", sig, m)
                    assert (got.config.id, got.tier) == ("torch", "default")
            with settings.override(HEURISTIC="0"):  # asking for the family default by name still gets it
                selector.reload()
                assert selector.resolve("gemm", Signature.make("gemm", "gemm", "half", N=512, K=512), 64).config.id \
                    not in ("torch", "default")
    finally:
        selector.configure()
