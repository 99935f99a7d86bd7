"""Session 43 audit: tunedb's public ops under torch.compile / torch.export / torch.func, and the
public API's argument checks, as a user on a CPU meets them.

Bugs found and fixed:
- tunedb::gemm_log_softmax under torch.vmap, called with bias left to its schema default
  (op(x, weight)), raised "ValueError: not enough values to unpack (expected 3, got 2)" from the
  op's vmap rule (also inside torch.compile); it now computes torch's form.
- tunedb::gemm / gemm_act had no vmap rule: vmap over an exported optimize()d model (whose graph
  calls the ops directly) ran them once per vmapped slice, with torch's performance warning and
  other low bits than vmap over the exported plain model; they now batch as F.linear does.
- gemm_act with an unknown activation under a torch.func transform (vmap, jvp, grad) raised a
  bare KeyError('tanh'); it now raises the SignatureError naming the allowed activations, as
  outside a transform.
- prewarm(strict="no") was truthy, so it raised where the user asked it not to; prewarm's model
  given as a non-callable failed as "'str' object is not callable"; confirm(publish="no") would
  write the user tier. Each is now a TypeError naming the value and what is allowed.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import jvp, vmap

import tunedb
from tunedb.errors import AutotuneWarning, SignatureError
from tunedb.families.gemm import ops as gemm_ops
import tunedb.families.gemm_log_softmax.ops  # noqa: F401 -- registers tunedb::gemm_log_softmax

T = torch.ops.tunedb


def _log_softmax_linear(x, w, b=None):
    return torch.log_softmax(F.linear(x, w, b), -1)


@pytest.mark.parametrize("call", ["two args", "in_dims", "weight vmapped", "compiled"])
def test_gemm_log_softmax_op_under_vmap_without_a_bias(call):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    w = torch.randn(5, 8, dtype=torch.bfloat16)
    if call == "two args":
        got, want = vmap(lambda t: T.gemm_log_softmax(t, w))(x), vmap(lambda t: _log_softmax_linear(t, w))(x)
    elif call == "in_dims":
        got = vmap(T.gemm_log_softmax, in_dims=(0, None))(x, w)
        want = vmap(_log_softmax_linear, in_dims=(0, None))(x, w)
    elif call == "weight vmapped":
        ws = torch.randn(2, 5, 8, dtype=torch.bfloat16)
        got, want = vmap(T.gemm_log_softmax)(x, ws), vmap(_log_softmax_linear)(x, ws)
    else:
        fn = torch.compile(lambda t: vmap(lambda r: T.gemm_log_softmax(r, w))(t), backend="eager", fullgraph=True)
        got, want = fn(x), vmap(lambda t: _log_softmax_linear(t, w))(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)


def _mlp():
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))


def test_vmap_over_an_exported_optimized_model_is_vmap_over_the_exported_plain_one():
    torch.manual_seed(0)
    plain = _mlp().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    x = torch.randn(7, 5, 64)
    ep_plain = torch.export.export(plain, (x[0],)).module()
    ep_tuned = torch.export.export(tuned, (x[0],)).module()
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert torch.equal(vmap(ep_tuned)(x), vmap(ep_plain)(x))  # differed in the low bits
            assert torch.equal(vmap(vmap(ep_tuned))(x[:, None]), vmap(vmap(ep_plain))(x[:, None]))


@pytest.mark.parametrize("case", ["x", "x at dim 1", "weight", "x none, weight", "all three"])
def test_the_gemm_ops_batch_under_vmap_as_f_linear(case):
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8), torch.randn(2, 6, 8), torch.randn(2, 6)
    act = lambda y: F.silu(y)  # noqa: E731
    if case == "x":
        got = vmap(lambda t: T.gemm_act(t, w[0], b[0], "silu"))(x)
        want = vmap(lambda t: act(F.linear(t, w[0], b[0])))(x)
    elif case == "x at dim 1":
        got = vmap(T.gemm, in_dims=(1, None))(x.transpose(0, 1), w[0])
        want = vmap(F.linear, in_dims=(1, None))(x.transpose(0, 1), w[0])
    elif case == "weight":
        got, want = vmap(T.gemm)(x, w), vmap(F.linear)(x, w)
    elif case == "x none, weight":
        got, want = vmap(T.gemm, in_dims=(None, 0))(x[0], w), vmap(F.linear, in_dims=(None, 0))(x[0], w)
    else:
        got = vmap(lambda t, v, c: T.gemm_act(t, v, c, "silu"))(x, w, b)
        want = vmap(lambda t, v, c: act(F.linear(t, v, c)))(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_a_bad_operand_under_vmap_is_named():
    w, x = torch.randn(2, 6, 8), torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="K=8"):
        vmap(T.gemm)(torch.randn(2, 3, 7), w)
    with pytest.raises(RuntimeError, match=r"bias must have shape \(6,\)"):
        vmap(lambda c: T.gemm_act(x, w[0], c, "relu"))(torch.randn(2, 5))


@pytest.mark.parametrize("transform", ["vmap", "jvp", "op under vmap"])
def test_an_unknown_activation_under_a_transform_names_the_allowed_ones(transform):
    x, w = torch.randn(2, 3, 8), torch.randn(6, 8)
    with pytest.raises(SignatureError, match="act='tanh'; allowed: none, gelu, gelu_tanh, relu, silu"):
        if transform == "vmap":
            vmap(lambda t: gemm_ops.gemm_act(t, w, None, "tanh"))(x)
        elif transform == "jvp":
            jvp(lambda t: gemm_ops.gemm_act(t, w, None, "tanh"), (x,), (x,))
        else:
            vmap(lambda t: T.gemm_act(t, w, None, "tanh"))(x)


def _bf16_model():
    return tunedb.optimize(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).bfloat16(), families="all")


@pytest.mark.parametrize("strict", ["no", 0, None, "False"])
def test_prewarm_strict_must_be_a_bool(strict):
    with pytest.raises(TypeError, match=f"strict={strict!r} must be True or False"):
        tunedb.prewarm(_bf16_model(), (torch.randn(3, 8, dtype=torch.bfloat16),), strict=strict)


@pytest.mark.parametrize("model", ["model", {"weight": torch.zeros(1)}, 3])
def test_prewarm_names_a_model_that_cannot_be_called(model):
    with pytest.raises(TypeError, match=f"needs a model .*got {type(model).__name__}"):
        tunedb.prewarm(model, (torch.randn(3, 8),))


def test_prewarm_with_good_arguments_still_runs_on_the_cpu():
    with pytest.warns(AutotuneWarning, match="measured nothing"):
        result = tunedb.prewarm(_bf16_model(), (torch.randn(3, 8, dtype=torch.bfloat16),), strict=False)
    assert len(result.points) == 2 and not result.measured


@pytest.mark.parametrize("publish", ["no", 0, None])
def test_confirm_publish_must_be_a_bool(publish):
    with pytest.raises(TypeError, match=f"publish={publish!r} must be True or False"):
        tunedb.confirm(_bf16_model(), (torch.randn(3, 8, dtype=torch.bfloat16),), publish=publish)


def test_a_saved_exported_optimized_model_loads_in_a_fresh_process_after_register_ops(tmp_path):
    """torch.export.load resolves torch.ops.tunedb.* by name; importing tunedb registers no op,
    so a fresh process calls tunedb.register_ops() first, then runs the program as saved."""
    import subprocess
    import sys

    torch.manual_seed(0)
    plain = _mlp().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    x = torch.randn(5, 64)
    path = tmp_path / "tuned.pt2"
    torch.export.save(torch.export.export(tuned, (x,)), str(path))
    torch.save({"x": x, "want": plain(x).detach()}, tmp_path / "io.pt")
    code = ("import sys, torch, tunedb\n"
            "io = torch.load(sys.argv[2])\n"
            "if sys.argv[3] == 'register': print(sorted(tunedb.register_ops()))\n"
            "ep = torch.export.load(sys.argv[1])\n"
            "print('equal', torch.equal(ep.module()(io['x']), io['want']))\n")
    run = lambda how: subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "io.pt"), how],
                                     capture_output=True, text=True, timeout=120)
    ok = run("register")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "equal True" in ok.stdout and "'gemm'" in ok.stdout
    bare = run("bare")  # without it the op is unknown by name (what register_ops is for)
    assert bare.returncode != 0 and "tunedb" in bare.stderr


def test_register_ops_defines_every_op_any_tunedb_module_defines():
    """A saved program may name any tunedb op (tunedb::sibling where a sibling group compiled to one
    launch); register_ops() in a fresh process must define each one that importing every tunedb
    module would (it left out tunedb::sibling and tunedb::siblings)."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, torch, tunedb, tunedb.families\n"
            "def ops(): return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith('tunedb::'))\n"
            "tunedb.register_ops(); registered = ops()\n"
            "for m in pkgutil.walk_packages(tunedb.families.__path__, 'tunedb.families.'):\n"
            "    try: importlib.import_module(m.name)\n"
            "    except ImportError: pass\n"
            "print('missing', sorted(set(ops()) - set(registered)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "missing []" in out.stdout, out.stdout
