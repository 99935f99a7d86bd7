"""The panel packing of potrf/posv/trsv (kernels_panel.py) under the Triton interpreter, through
launch(): n from 16 to 64 (odd n leave a partial last panel), fp32 and fp64, against an fp64
reference bounded by what torch gets on the same inputs; the upper triangle never read
(NaN-poisoned); info on non-SPD problems with the others still right and every result finite;
the in-place forms (L over A, x over b, trsv's out=b). The validity predicate's rules (rows
across the threads, the register budget, trsv on one warp), the id grammar, the candidates'
order (first from NP = 64, i.e. n >= 33; after shfl below); and a compile for sm90 in the device's Triton
(3.6) of every config at the tune's n, with no shuffle or shared memory in potrf and trsv."""
import json
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import device_triton  # noqa: E402
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg import kernels_prior as prior  # noqa: E402

# (config, n, dtype, batch): one problem a program, so any batch; n = 21 and 37 end in a partial panel
CASES = [("panel_w1", 16, "fp32", 3), ("panel_w1", 21, "fp64", 3), ("panel_w1", 37, "fp32", 2),
         ("panel_w2", 64, "fp64", 2)]


def _child() -> None:
    from linalg_solver_checks import solver_failures, trsv_failures

    failures = solver_failures(CASES, second_bad=True, inplace_cfg="panel_w1", inplace_batch=3, inplace_n=19)
    interpret_child.report(failures + trsv_failures([("panel_w1", n, dt, b) for _c, n, dt, b in CASES]))  # one warp


@pytest.mark.slow
def test_panel_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=1200, OMP_NUM_THREADS="1") == []


def test_panel_packing_rules():
    ids = lambda op, n, dt: [c.id for c in space.config_space(op, n, dt) if c.packing == "panel"]  # noqa: E731
    assert ids("potrf", 128, "fp32") == ["panel_w1", "panel_w2", "panel_w4"]  # 4, 2, 1 rows a thread
    assert ids("posv", 128, "fp64") == ["panel_w2", "panel_w4"]  # fp64 holds at most 2 rows a thread
    assert ids("potrf", 64, "fp32") == ["panel_w1", "panel_w2"]
    assert ids("posv", 32, "fp64") == ["panel_w1"] and ids("potrf", 16, "fp32") == ["panel_w1"]
    assert ids("trsv", 128, "fp64") == ["panel_w1"]  # every thread carries the whole solve
    assert ids("potrf", 15, "fp32") == [] and ids("gemm", 64, "fp32") == []
    assert "n >= 16" in space.invalid_reason("potrf", "panel", 1, 1, 8, "fp32")
    assert "without a row" in space.invalid_reason("potrf", "panel", 1, 4, 64, "fp32")
    assert "over 2" in space.invalid_reason("posv", "panel", 1, 1, 128, "fp64")
    assert "one warp" in space.invalid_reason("trsv", "panel", 1, 2, 128, "fp32")
    assert "one problem per program" in space.invalid_reason("potrf", "panel", 2, 1, 64, "fp32")
    assert "potrf, posv, trsv only" in space.invalid_reason("gemv", "panel", 1, 1, 64, "fp32")
    assert space.parse_config("panel_w2") == space.KernelConfig("panel", 1, 2)
    assert space.parse_config("panel_w2").id == "panel_w2"
    assert space.panel_shape("fp64")[0] == space.panel_shape("fp32")[0]


def test_the_family_parses_panel_ids_and_ranks_them_last():
    from tunedb.families.linalg import configs

    cfg = configs.parse("panel_w4")
    assert configs.shape_of(cfg) == ("panel", 1, 4) and configs.grid(cfg, 7) == 7
    assert configs.simplicity("panel_w1") > configs.simplicity("shfl_p1_w1")
    with pytest.raises(Exception, match="one problem per program"):
        configs.parse("panel_p2_w1")


def test_panel_goes_first_from_n_33_and_after_shfl_below():
    for op, dt in (("potrf", "fp32"), ("posv", "fp64"), ("trsv", "fp32")):
        for n in (33, 48, 64, 100, 128):
            # potrf/posv: the pdot configs (kernels_pdot.py) come first, then panel's
            early = {c for c in space.config_space(op, n, dt) if c.packing in ("panel", *space.PDOT_PACKINGS)}
            first = prior.candidates(op, n, dt, cap=len(early) + 1, batch=4096)
            assert set(first[:-1]) == early and first[-1].packing not in ("panel", *space.PDOT_PACKINGS), (op, n, first)
    for op, n, dt in (("potrf", 16, "fp32"), ("posv", 32, "fp64")):
        fourteen = prior.candidates(op, n, dt, cap=14, batch=4096)
        fifteen = prior.candidates(op, n, dt, cap=15, batch=4096)
        assert not any(c.packing == "panel" for c in fourteen)
        assert fifteen == fourteen + [space.KernelConfig("panel", 1, 1)]


_COMPILE = """
import json
from tunedb.families.linalg import compile_target
for item in compile_target.items(("panel",), (16, 37, 64, 128)):
    print(json.dumps(compile_target.compile_one(item)), flush=True)
"""


@pytest.mark.slow
def test_every_panel_kernel_compiles_for_sm90_without_shuffles_in_potrf_and_trsv():
    """Triton 3.6 for sm90, every panel config at n in {16, 37, 64, 128} (fp32, fp64; 2-5 s a
    kernel: the panel and update loops are loops, not unrolled). The panel's rows lie across the
    lanes and everything else inside a thread, so potrf and trsv have no shuffle and touch shared
    memory only through their barriers; posv's back substitution reduces across the rows (its
    shuffles). A barrier count that grows with n would mean the panels were unrolled. No kernel
    spills (ptxas -v): posv fp64 at two rows a thread sits at 250-252 registers."""
    proc = device_triton.run_child(["-c", _COMPILE], 1500)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    from tunedb.families.linalg import compile_target

    want = [tuple(i) for i in compile_target.items(("panel",), (16, 37, 64, 128))]
    assert [(r["op"], r["dtype"], r["n"], r["config"]) for r in results] == want, proc.stderr[-3000:]
    failed = [f"{r['op']} {r['dtype']} n={r['n']} {r['config']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    for r in results:
        assert r["spill_bytes"] == 0, r  # the predicate's row budget promises no spill (ptxas -v)
        if r["op"] in ("potrf", "trsv"):
            assert r["shuffles"] == 0 and r["shared"] == 0, r
        assert r["barriers"] <= 8, r  # posv across warps: its reduction adds a few


if __name__ == "__main__":
    _child()
