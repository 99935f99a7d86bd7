"""The linalg family on the GPU: the served ops against the fp64 reference, the non-SPD report,
CUDA-graph capture of every op (the captured kernel is the eager one), torch.compile, and one
quick retune cell through the CUDA-graph timer. Run: pytest -m gpu tests/gpu/test_linalg_family_gpu.py
(about a minute, most of it Triton compiles).

The module runs with the eager rule off (TUNEDB_EAGER_FALLBACK=0, the ops' memo cleared around
each test): outside a graph that rule serves torch's forms where a launch costs the host more
than the kernel saves (families/linalg/eager.py), so an eager call would check torch instead of
the arm the table serves, and would differ in its bits from the captured arm. The rule itself is
tests/gpu/test_linalg_eager_gpu.py's."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from tunedb import settings
from tunedb.families.linalg import cli, ops, problems, signatures

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _inputs(op: str, dt: str, n: int, batch: int, seed: int = 0):
    return problems.make_inputs(signatures.make_signature(op, dt, n), batch, "cuda", seed)[0]


@pytest.fixture(autouse=True)
def _table_arms_eagerly():
    ops._clear()
    with settings.override(USER_DB="off", EAGER_FALLBACK="0"):
        yield
    ops._clear()


@pytest.mark.parametrize("op", signatures.OPS)
@pytest.mark.parametrize("dt", ["fp32", "fp64"])
@pytest.mark.parametrize("n", [4, 16, 64])
def test_the_served_op_is_within_the_gate_of_torch(op, dt, n):
    args = _inputs(op, dt, n, 1000)
    sig = signatures.make_signature(op, dt, n)
    out = getattr(ops, op)(*args)
    bound = ops.bound_for(op, *args)
    res = problems.residual(sig, args, {}, out)
    ref = problems.residual(sig, args, {}, problems.torch_arm(op, *args))
    assert res <= problems.residual_bound(sig, ref, 4.0), (bound.config.id, res, ref)
    if op in ("potrf", "posv"):
        assert not out[1].any()


@pytest.mark.parametrize("n", [8, 32])
def test_a_non_spd_problem_is_reported_on_the_gpu(n):
    a, b = _inputs("posv", "fp32", n, 512)
    a[7] = -a[7]
    x, info = ops.posv(a, b)
    low, info2 = ops.potrf(a)
    torch.cuda.synchronize()
    assert info[7].item() != 0 and info2[7].item() != 0
    assert int((info != 0).sum()) == 1 and int((info2 != 0).sum()) == 1
    keep = torch.arange(512, device="cuda") != 7
    sig = signatures.make_signature("posv", "fp32", n)
    assert problems.residual(sig, (a[keep], b[keep]), {}, x[keep]) < 1e-4


@pytest.mark.parametrize("op", signatures.OPS)
def test_every_op_replays_in_a_cuda_graph(op):
    args = _inputs(op, "fp32", 8, 4096)
    eager = getattr(ops, op)(*args)  # resolves and compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = getattr(ops, op)(*args)
    graph.replay()
    torch.cuda.synchronize()
    first = lambda t: t[0] if isinstance(t, tuple) else t  # noqa: E731
    assert torch.equal(first(eager), first(captured))


def test_the_ops_run_under_torch_compile():
    a, b = _inputs("posv", "fp32", 16, 2048)
    fn = torch.compile(lambda a, b: ops.posv(a, b)[0] * 2.0, fullgraph=True)
    assert torch.allclose(fn(a, b), ops.posv(a, b)[0] * 2.0)


def test_one_quick_retune_cell_through_the_graph_timer(tmp_path):
    out = tmp_path / "linalg.json"
    args = argparse.Namespace(prebuild=False, quick=True, legs="solver", ops="potrf", dtypes="fp32", margin=None,
                              rounds=9, max_arms=6, build_jobs=None, dry_run=False, out=str(out), seed=0)
    assert cli.tune(args) == 0
    raw = json.loads(out.read_text())
    entry = raw["entries"]["linalg|op=potrf|dt=fp32|n=8"]
    point = entry["evidence"]["M=4096"]
    # blocks of 9 rounds: one, or up to five where the cell's pick sits near its band's edge
    # (pick.near_edge, the sequential step)
    assert point["torch"][2] in (9, 18, 27, 36, 45) and point["_inputs"] == "ring", point["torch"]
    assert raw["model"]["tune"]["provenance"]["gpu_name"]


@pytest.mark.parametrize("op", signatures.OPS)
def test_every_served_arm_of_the_shipped_table_replays_in_a_graph_within_torchs_bound(op):
    """Every cell of the shipped sm90 table (fp32/fp64, n = 4..128, batch 256/4096/65536): the
    public op binds the cell's full winner (NVRTC present), answers within 4x torch's residual
    against the fp64 reference, and a captured CUDA graph of it replays the eager result bit for
    bit (spec 003: graph capture of every served arm; session 25 re-tuned the whole table)."""
    from tunedb import database
    from tunedb.runtime import selector

    selector.reload()
    entries = {sig: e for res in database.lookup("sm90", "linalg") if res.tier == "system"
               for sig, e in res.db.entries.items() if sig.op == op}
    assert entries, f"no shipped {op} entries"
    seen = 0
    for sig, entry in sorted(entries.items(), key=lambda kv: (kv[0].dt, kv[0].get("n"))):
        for batch in (256, 4096, 65536):
            want = entry.lookup(batch)
            if want == "torch":
                continue
            args = problems.make_inputs(sig, batch, "cuda", 3)[0]
            fn = getattr(ops, op)
            assert ops.bound_for(op, *args).config.id == want, (sig, batch)
            got = fn(*args)
            first = lambda t: t[0] if isinstance(t, tuple) else t  # noqa: E731
            ref = problems.residual(sig, args, {}, problems.torch_arm(op, *args))
            res = problems.residual(sig, args, {}, got)
            assert res <= problems.residual_bound(sig, ref, 4.0), (sig, batch, want, res, ref)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = fn(*args)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(first(captured), first(got)), (sig, batch, want)
            seen += 1
            del args, got, captured, graph
        torch.cuda.empty_cache()
    assert seen > 0
