"""The one point-merge rule (records.merge_point) that censuses, the plan, thinning and the
oracle all use."""
import pytest

from tunedb.build.partition import thin
from tunedb.build.plan import fill_points
from tunedb.census.censusfile import merge_points
from tunedb.evaluate.oracle import census_weights
from tunedb.records import Point, ShapeSet, Signature, merge_point

SIG = Signature.make("gemm", "gemm", "half", N=64, K=64)


def test_weights_and_calls_add_must_tune_ors_eager_share_by_calls():
    p = merge_point([Point(SIG, 8, 1.0, 10, False, 0.0), Point(SIG, 8, 2.0, 30, True, 1.0)])
    assert (p.m, p.weight, p.calls, p.must_tune, p.eager_share) == (8, 3.0, 40, True, 0.75)
    quiet = merge_point([Point(SIG, 8, 0.0, 0, False, 0.2), Point(SIG, 8, 0.0, 0, False, 0.5)])
    assert quiet.eager_share == 0.5  # no calls counted: the larger share
    with pytest.raises(ValueError):
        merge_point([])


def test_every_stage_merges_the_same_way():
    a, b = Point(SIG, 8, 1.0, 10, False, 0.0), Point(SIG, 8, 2.0, 30, True, 1.0)
    want = merge_point([a, b])
    assert merge_points([a, b]) == (want,)
    assert fill_points([a, b], ladder=False) == (want,)
    weights, alphas = census_weights([ShapeSet((a,)), ShapeSet((b,))])
    assert (weights[(SIG, 8)], alphas[(SIG, 8)]) == (want.weight, want.eager_share)
    kept = thin([a.__class__(SIG, 4, 1.0, 10), Point(SIG, 6, 2.0, 30, True, 1.0), Point(SIG, 16, 1.0, 10)], 2)
    assert kept[-1] == merge_point([Point(SIG, 6, 2.0, 30, True, 1.0), Point(SIG, 16, 1.0, 10)],
                                   at=Point(SIG, 16, 1.0, 10))
