"""The shfl packing of potrf/posv/trsv (kernels_shfl.py) under the Triton interpreter, through launch():
every n class (NP = 2..32, odd n padded), ragged batches (a partial last program), fp32 and fp64,
against an fp64 reference bounded by what torch gets on the same inputs; the upper triangle never
read (NaN-poisoned); info on non-SPD problems with the others still right; the in-place forms.
The validity predicate's rules for the packing (exactly one config per n: one column per lane of
one warp), the id grammar and the candidates' turn; and a compile for sm90 in the device's Triton
(3.6) of every config the tune can pick, with the pivot loop free of shared memory (its
broadcasts are shuffles: the point of the packing)."""
import json
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import device_triton  # noqa: E402
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg import kernels_prior as prior  # noqa: E402

# (config, n, dtype, batch): P = 32 / NP problems per program; batches leave a partial program
CASES = [("shfl_p16_w1", 2, "fp32", 19), ("shfl_p8_w1", 3, "fp64", 11), ("shfl_p8_w1", 4, "fp32", 11),
         ("shfl_p4_w1", 7, "fp32", 6), ("shfl_p4_w1", 8, "fp64", 6), ("shfl_p2_w1", 13, "fp32", 5),
         ("shfl_p2_w1", 16, "fp64", 3), ("shfl_p1_w1", 24, "fp32", 3), ("shfl_p1_w1", 32, "fp64", 3)]


def _child() -> None:
    from linalg_solver_checks import solver_failures, trsv_failures

    failures = solver_failures(CASES, second_bad=True, inplace_cfg="shfl_p2_w1", inplace_batch=5, inplace_n=9)
    interpret_child.report(failures + trsv_failures(CASES))  # trsv's shfl configs are potrf's ids


@pytest.mark.slow
def test_shfl_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


def test_shfl_packing_is_one_column_per_lane_of_one_warp():
    for op in ("potrf", "posv", "trsv"):
        for dt in ("fp32", "fp64"):
            for n in range(2, 33):
                ids = [c.id for c in space.config_space(op, n, dt) if c.packing == "shfl"]
                assert ids == [f"shfl_p{32 // space.next_pow2(n)}_w1"], (op, dt, n, ids)
            assert not [c for c in space.config_space(op, 33, dt) if c.packing == "shfl"]
    assert "P * NP must be 32" in space.invalid_reason("potrf", "shfl", 2, 1, 32, "fp32")  # two columns a lane
    assert "P * NP must be 32" in space.invalid_reason("posv", "shfl", 1, 1, 16, "fp64")  # idle lanes
    assert "one warp" in space.invalid_reason("potrf", "shfl", 2, 2, 32, "fp32")
    assert "n <= 32" in space.invalid_reason("potrf", "shfl", 1, 1, 64, "fp32")
    assert "potrf, posv, trsv only" in space.invalid_reason("gemm", "shfl", 2, 1, 16, "fp32")
    assert "num_warps" in space.invalid_reason("posv", "shfl", 1, 3, 32, "fp32")
    assert "power of two" in space.invalid_reason("posv", "shfl", 3, 1, 8, "fp32")
    assert space.parse_config("shfl_p4_w1") == space.KernelConfig("shfl", 4, 1)
    assert space.parse_config("shfl_p4_w1").id == "shfl_p4_w1"
    with pytest.raises(ValueError, match="shfl_p<P>_w1"):
        space.parse_config("shfl_w1")


def test_the_family_predicate_parses_shfl_ids_and_ranks_them_last():
    from tunedb.families.linalg import FAMILY, configs

    sig = FAMILY.make_signature("posv", "fp64", 16)
    cfg = configs.parse("shfl_p2_w1")
    assert configs.shape_of(cfg) == ("shfl", 2, 1) and configs.grid(cfg, 5) == 3
    assert FAMILY.invalid_reason(cfg, sig, 4096, None) is None
    assert FAMILY.invalid_reason(configs.parse("shfl_p1_w1"), sig, 4096, None)  # P * NP = 16
    assert "shfl_p2_w1" in {c.id for c in FAMILY.config_space("sm90")}
    assert configs.simplicity("shfl_p1_w1") > configs.simplicity("rows_p64_w4")
    with pytest.raises(Exception, match="shfl configs name their problems per program"):
        configs.parse("shfl_w1")


def test_shfl_takes_its_turn_at_a_cap_of_14_and_leaves_smaller_caps_alone():
    for op, n, dt in (("potrf", 16, "fp32"), ("posv", 32, "fp64"), ("potrf", 4, "fp64"), ("trsv", 16, "fp32")):
        for batch in (256, 4096, 65536):
            thirteen = prior.candidates(op, n, dt, cap=13, batch=batch)
            fourteen = prior.candidates(op, n, dt, cap=14, batch=batch)
            assert not any(c.packing == "shfl" for c in thirteen)
            assert fourteen == thirteen + [c for c in space.config_space(op, n, dt) if c.packing == "shfl"]
        everything = prior.candidates(op, n, dt)
        assert set(everything) == set(space.config_space(op, n, dt))
        # shfl closes the rotation's list; only the panel packing (session 20) comes after it
        tail = [c.packing for c in everything if c.packing in ("shfl", "panel")]
        assert [c.packing for c in everything[-len(tail):]] == tail and tail[0] == "shfl"
    assert not any(c.packing == "shfl" for c in prior.candidates("gemm", 16, "fp32", cap=40))


_COMPILE = """
import json
from tunedb.families.linalg import compile_target
for item in compile_target.items(("shfl",), (2, 4, 5, 8, 16, 32)):
    print(json.dumps(compile_target.compile_one(item)), flush=True)
"""


@pytest.mark.slow
def test_every_shfl_kernel_compiles_for_sm90_with_shuffles_and_no_barrier_per_pivot():
    """Triton 3.6 for sm90, every shfl config at n in {2, 4, 5, 8, 16, 32} (fp32, fp64; about
    3-4 minutes on 2 cores, the n = 32 kernels 20-35 s each). The pivot loop's broadcasts are
    warp shuffles, one per register of the chunks holding rows >= the pivot (n * NP in fp32, twice in
    fp64) at most, fewer where the row chunks spare the finished rows, and no barrier per
    pivot: only the load's mirror of the lower triangle and the split into row chunks may stage
    through shared memory (at most 4 barriers in the whole kernel; the lane packing has one per
    pivot)."""
    proc = device_triton.run_child(["-c", _COMPILE], 1500)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    want = compile_target_items()
    assert [(r["op"], r["dtype"], r["n"], r["config"]) for r in results] == want, proc.stderr[-3000:]
    failed = [f"{r['op']} {r['dtype']} n={r['n']} {r['config']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    for r in results:
        words = 2 if r["dtype"] == "fp64" else 1
        n, np2, ch = r["n"], space.next_pow2(r["n"]), space.shfl_chunk(r["n"])
        # pivot j gathers the chunks holding rows >= j (potrf keeps all of them: it stores L)
        chunked = words * sum(np2 - (j // ch) * ch for j in range(n))
        if r["op"] == "trsv":  # one shuffle a step (x_j from lane j), nothing else crosses a lane
            assert r["shuffles"] == words * n and r["shared"] == 0 and r["barriers"] == 0, r
            continue
        assert r["shuffles"] >= (chunked if r["op"] == "potrf" else words * n), r
        if np2 // ch == 4:  # n > 16: the chunks cut the gathers to at most 0.7 of the whole tile's
            assert r["shuffles"] <= 0.7 * words * n * np2, r
        assert r["barriers"] <= 4, r


def compile_target_items():
    from tunedb.families.linalg import compile_target

    return [tuple(i) for i in compile_target.items(("shfl",), (2, 4, 5, 8, 16, 32))]


if __name__ == "__main__":
    _child()
